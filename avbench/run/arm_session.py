"""One arm of a sweep against its server: its cells in order, each stored as measured or
recorded as failed with its reason (``SweepRun.fail``, the one place a failure is recorded).
A server that is gone, stalled or whose engine died fails the arm's remaining cells at once."""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from avbench.errors import AvbenchError, StoreError
from avbench.loadgen.records import RequestRecord
from avbench.plan.cells import Arm, Cell
from avbench.run.cell_captures import file_cell
from avbench.run.cell_run import (
    CellContext,
    CellMeasurement,
    CellSettings,
    Target,
    Workloads,
    arm_part,
    judge_cell,
    measure_cell,
)
from avbench.run.progress import SweepReporter
from avbench.serving.server import redact
from avbench.store.cellrow import ProvenancePart
from avbench.store.failures import CellFailure, FailureKind
from avbench.store.run_store import RunStore

if TYPE_CHECKING:
    from avbench.serving.capture import ArmCapture


@dataclass
class SweepOutcome:
    store: RunStore
    finished: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    unsupported: list[dict] = field(default_factory=list)  # reported, not failures
    skipped: int = 0

    def counts(self) -> dict[str, int]:
        return {
            "measured": len(self.finished),
            "failed": len(self.failed),
            "unsupported": len(self.unsupported),
            "already_done": self.skipped,
        }


@dataclass(frozen=True)
class Attempt:
    """What a cell that ran and failed left: its traceback, or its request counts and records
    (kept aside, under requests/failed/)."""

    traceback: str | None = None
    counts: dict[str, int | None] | None = None
    records: list[RequestRecord] | None = None


@dataclass(frozen=True)
class Failed:
    """Why cells of an arm failed."""

    kind: FailureKind
    reason: str
    arm_note: str | None = None  # said once for the arm, before its cells are recorded
    log_tail: str | None = None  # the launched server's last lines, in each cell's row
    attempt: Attempt | None = None  # the one cell ran: what it left (and the reporter is told)


@dataclass
class SweepRun:
    """What every arm of one sweep shares."""

    store: RunStore
    settings: CellSettings
    workloads: Workloads
    reporter: SweepReporter
    outcome: SweepOutcome
    secrets: list[str]
    provenance: ProvenancePart  # computed once: the same client measures every cell
    finished: dict[str, dict] = field(default_factory=dict)  # cells.jsonl, kept current

    def fail(self, arm: Arm, cells: Sequence[Cell], failed: Failed) -> None:
        """Record each cell as failed: its failures.jsonl row (with what its attempt left),
        the outcome, and the reporter."""
        if failed.arm_note is not None:
            self.reporter.arm_failed(arm.name, failed.arm_note)
        attempt = failed.attempt or Attempt()
        details: dict[str, object] = dict(attempt.counts or {})
        if attempt.traceback is not None:
            details["traceback"] = attempt.traceback
        for cell in cells:
            failure = CellFailure.of(cell, failed.kind, failed.reason, **details)
            stored = failure
            if failed.log_tail is not None:
                stored = failure.model_copy(update={"log_tail": failed.log_tail})
            if attempt.records is not None:
                self.store.write_failed_cell(stored, attempt.records)
            else:
                self.store.write_failure(stored)
            unsupported = failed.kind == FailureKind.UNSUPPORTED
            outcome = self.outcome.unsupported if unsupported else self.outcome.failed
            outcome.append(failure.to_row())
            if failed.attempt is not None:
                self.reporter.cell_failed(cell, failed.reason)

    def keep(self, cell: Cell, measured: CellMeasurement) -> None:
        """Store a measured cell (records and scrapes first, its row last)."""
        self.store.write_cell(measured.row, measured.records, measured.scrapes)
        self.finished[cell.id] = measured.row
        self.outcome.finished.append(measured.row)
        self.reporter.cell_finished(cell, measured.row)


@dataclass
class ArmSession:
    """One arm's cells against its ready server."""

    run: SweepRun
    arm: Arm
    target: Target
    capture: ArmCapture | None = None
    engine: dict = field(default_factory=dict)  # what the server chose, in every row
    context: CellContext = field(init=False)

    def __post_init__(self) -> None:
        run = self.run
        self.context = CellContext(
            settings=run.settings,
            arm=arm_part(run.settings, self.arm, run.store.root.name),
            target=self.target,
            provenance=run.provenance,
            store=run.store,
            workloads=run.workloads,
            finished=run.finished,
            on_record=run.reporter.request_done,
        )

    def run_cells(self, cells: Sequence[Cell]) -> None:
        for i, cell in enumerate(cells):
            server = self.target.server
            if server is not None and not server.alive():
                cause = self.target.death_cause()
                said = f"; the server log says: {cause}" if cause else ""
                reason = f"vLLM server died during the arm (exit {server.exit_text}){said}"
                tail = server.log_tail()
                note = reason + "; last log lines:\n" + tail
                self.run.fail(
                    self.arm, cells[i:], Failed(FailureKind.SERVER_DIED, reason, note, tail)
                )
                return
            rest = self._run_cell(cell)
            if rest is not None:
                self.run.fail(self.arm, cells[i + 1 :], rest)
                return

    def _run_cell(self, cell: Cell) -> Failed | None:
        """Run, judge and record one cell; returns why the arm's remaining cells fail, if
        they do: a stalled server is not waited for again; attached, a dead one cannot be
        restarted."""
        self.run.reporter.cell_started(cell)
        started = time.time()
        try:
            measured = measure_cell(self.context, cell)
        except (KeyboardInterrupt, StoreError):
            raise
        except Exception as exc:  # one bad cell must not lose the others
            dead = self.target.engine_dead()
            died = None if dead else self.target.gone(refused=0)
            reason = dead or died or redact(f"{type(exc).__name__}: {exc}", self.run.secrets)
            detail = redact(traceback.format_exc(limit=6), self.run.secrets)
            kind = (
                FailureKind.ENGINE_DIED if dead
                else FailureKind.SERVER_DIED if died
                else FailureKind.CELL
            )  # fmt: skip
            self._failed(cell, Failed(kind, reason, attempt=Attempt(traceback=detail)))
            return self._arm_stops(kind, reason)
        verdict = judge_cell(measured, self.target, self.run.settings.sweep.max_failed_share)
        if verdict is None:
            measured.row |= self.engine
            if self.capture is not None:
                measured.row |= self._file_capture(self.capture, cell, started, measured)
            self.run.keep(cell, measured)
            return None
        kind, reason = verdict
        counts = {k: measured.row.get(k) for k in ("requests_ok", "requests_failed")}
        self._failed(
            cell, Failed(kind, reason, attempt=Attempt(counts=counts, records=measured.records))
        )
        return self._arm_stops(kind, reason)

    def _arm_stops(self, kind: FailureKind, reason: str) -> Failed | None:
        """Why the arm's remaining cells fail unrun after a cell failed so, or None: a stalled
        server or a dead engine is not waited for again; attached, a dead server cannot be
        restarted (a launched one that exited is caught before the next cell)."""
        if kind in (FailureKind.SERVER_STALLED, FailureKind.ENGINE_DIED):
            return Failed(kind, reason, arm_note=f"{reason}; the arm's remaining cells are not run")
        if kind == FailureKind.SERVER_DIED and self.target.server is None:
            return Failed(kind, reason)
        return None

    def _failed(self, cell: Cell, failed: Failed) -> None:
        """The cell that ran and failed, with the server's last lines when it has a log."""
        tail = self.target.log_tail()
        self.run.fail(self.arm, [cell], failed if tail is None else replace(failed, log_tail=tail))

    def _file_capture(
        self, capture: ArmCapture, cell: Cell, started: float, measured: CellMeasurement
    ) -> dict:
        """The cell's live captures (avbench/run/cell_captures.py); a capture problem never loses the cell."""
        ids = [r.response_id for r in measured.records if not r.warmup and r.response_id]
        root = self.run.store.root
        try:
            return file_cell(root, cell.id, cell.workload, capture, started, ids)
        except (AvbenchError, OSError) as exc:
            return {"capture": list(capture.settings.kinds), "capture_failed": str(exc)[:300]}
