"""SweepRun.fail, the one place cells are recorded as failed: the rows written through the
real RunStore, the outcome, and what the reporter is told, for an arm that never ran and for a
cell that ran and failed."""

import json

from avbench.inputs.suite import load_suite
from avbench.loadgen.records import RequestRecord
from avbench.plan.cells import Arm, Cell
from avbench.run.arm_session import Attempt, Failed, SweepOutcome, SweepRun
from avbench.run.cell_run import CellSettings
from avbench.run.progress import SweepReporter
from avbench.store.cellrow import ProvenancePart
from avbench.store.failures import FailureKind
from avbench.store.run_store import RunStore


class Told(SweepReporter):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def arm_failed(self, arm, reason):
        self.calls.append(("arm_failed", arm, reason))

    def cell_failed(self, cell, reason):
        self.calls.append(("cell_failed", cell.id, reason))


def _run(tmp_path) -> SweepRun:
    suite = load_suite()
    store = RunStore.create(tmp_path, "r", {"run_id": "r"})
    settings = CellSettings(suite.pair("tiny-cpu"), suite.sweep("demo"), suite.workloads,
                            api_key=None, attached=True, gpus=1)  # fmt: skip
    return SweepRun(store, settings, workloads=None, reporter=Told(), outcome=SweepOutcome(store),
                    secrets=[], provenance=ProvenancePart(None, None, None, None, None))  # fmt: skip


def _cells(arm: str, *concurrencies: int) -> list[Cell]:
    return [Cell(arm, "gsm8k-tiny", c, None, 0, 4, 1) for c in concurrencies]


def _rows(store: RunStore) -> list[dict]:
    return [json.loads(x) for x in store.failures_path.read_text().splitlines()]


def test_an_arm_that_never_ran_says_so_once_and_records_each_cell(tmp_path):
    run = _run(tmp_path)
    cells = _cells("av-k3", 1, 4)
    run.fail(
        Arm("av", 3),
        cells,
        Failed(FailureKind.UNSUPPORTED, "no AV here", "unsupported: no AV here"),
    )
    assert run.reporter.calls == [("arm_failed", "av-k3", "unsupported: no AV here")]
    rows = _rows(run.store)
    assert [r["cell_id"] for r in rows] == [c.id for c in cells]
    assert {r["failure_kind"] for r in rows} == {"unsupported"}
    assert all(
        r.keys() == cells[0].to_dict().keys() | {"reason", "failure_kind", "failed_at"}
        for r in rows
    )
    # Unsupported arms are reported apart from failures (they fail no run).
    assert len(run.outcome.unsupported) == 2 and run.outcome.failed == []


def test_a_cell_that_ran_keeps_what_it_measured_and_the_servers_last_lines(tmp_path):
    run = _run(tmp_path)
    (cell,) = _cells("static-k3", 2)
    records = [RequestRecord(conversation_id="c0", turn=0, warmup=False, error="HTTP 500")]
    counts = {"requests_ok": 0, "requests_failed": 1}
    failed = Failed(FailureKind.REQUESTS_FAILED, "1 of 1 failed", log_tail="INFO last line",
                    attempt=Attempt(counts=counts, records=records))  # fmt: skip
    for _ in range(2):
        run.fail(Arm("static", 3), [cell], failed)
    assert run.reporter.calls == [("cell_failed", cell.id, "1 of 1 failed")] * 2
    first, second = _rows(run.store)
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert first["requests_file"] == f"requests/failed/{cell.id}.1.parquet"
    assert run.store.failed_requests_path(cell.id, 2).exists()
    assert first["log_tail"] == "INFO last line" and first["requests_failed"] == 1
    # The outcome holds the failure itself, not the log.
    assert run.outcome.failed[0] == cell.to_dict() | counts | {
        "reason": "1 of 1 failed",
        "failure_kind": "requests_failed",
    }
    assert [f.attempt for f in run.store.failures()] == [1, 2]


def test_the_remaining_cells_of_a_stalled_arm_are_recorded_after_one_arm_line(tmp_path):
    run = _run(tmp_path)
    rest = _cells("static-k3", 4, 8)
    note = "server stalled; the arm's remaining cells are not run"
    run.fail(Arm("static", 3), rest, Failed(FailureKind.SERVER_STALLED, "server stalled", note))
    assert run.reporter.calls == [("arm_failed", "static-k3", note)]
    assert [r["failure_kind"] for r in _rows(run.store)] == ["server_stalled"] * 2
    assert all("log_tail" not in r and "attempt" not in r for r in _rows(run.store))
    assert len(run.outcome.failed) == 2
