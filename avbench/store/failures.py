"""Why a cell has no measured row: one kind per way a cell fails, and the row of failures.jsonl
that says so (``RunStore.write_failure`` / ``failures``). --resume reruns every cell without a
measured row; the report lists the failed ones, and unsupported arms apart from them."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from avbench.plan.cells import Cell


class FailureKind(StrEnum):
    UNSUPPORTED = "unsupported"  # this vLLM cannot run the arm: reported, not counted as failed
    SERVER = "server"  # the arm's server could not start (or its checkpoints are missing)
    SERVER_DIED = "server_died"  # the server exited, or stopped accepting connections
    ENGINE_DIED = "engine_died"  # its HTTP server answers, but the engine behind it is dead
    SERVER_STALLED = "server_stalled"  # no progress on any in-flight request for stall_s
    CELL_DEADLINE = "cell_deadline"  # the cell ran past the sweep's cell_s
    REQUESTS_FAILED = "requests_failed"  # more than max_failed_share of its requests failed
    CELL = "cell"  # an error while running the cell (its traceback is kept)
    ARM_LOST = "arm_lost"  # the arm's own process (or Ray task, or its node) was lost mid-arm


class CellFailure(BaseModel):
    """One row of failures.jsonl: the cell (as the plan names it), why, and what it left."""

    # Rows written by another avbench keep the columns this one does not know through a merge.
    model_config = ConfigDict(extra="allow", validate_by_name=True, serialize_by_alias=True)

    cell_id: str
    arm: str | None = None
    workload: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    repeat: int | None = None
    num_requests: int | None = None
    warmup: int | None = None
    reason: str
    kind: FailureKind = Field(alias="failure_kind")
    failed_at: str | None = None  # set by the store as the row is written
    attempt: int | None = None  # a cell that ran: its failed attempts so far, this one included
    requests_file: str | None = None  # what that attempt measured, relative to the run directory
    requests_ok: int | None = None
    requests_failed: int | None = None
    traceback: str | None = None
    log_tail: str | None = None  # the launched server's last log lines
    source_run: str | None = None  # a merged run: the run the failure came from
    source_cell_id: str | None = None

    @classmethod
    def of(cls, cell: Cell, kind: FailureKind, reason: str, **details: object) -> CellFailure:
        return cls.model_validate(
            cell.to_dict() | details | {"failure_kind": kind, "reason": reason}
        )

    def to_row(self) -> dict[str, Any]:
        """The stored row: the columns that were given, under their stored names."""
        return self.model_dump(mode="json", exclude_unset=True)


def failure_problem(row: dict[str, Any]) -> str | None:
    """Why a stored object is not a failure record, or None: readers skip such a line."""
    try:
        CellFailure.model_validate(row)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        if err["type"] == "missing":
            return f"not a failure record (no {where})"
        return f"not a failure record ({where} {repr(err['input'])[:80]}: {err['msg']})"
    return None
