"""The failures.jsonl row as a model: rows written before it existed read and write back
unchanged; a row that is not one is skipped with one line naming the file, line and field."""

import json
from pathlib import Path

import pytest

from avbench.plan.cells import Cell
from avbench.store.failures import CellFailure, FailureKind, failure_problem
from avbench.store.run_store import RunStore

RUNS_V0 = Path(__file__).resolve().parents[2] / "fixtures" / "runs-v0"


@pytest.mark.parametrize(
    "path", sorted(RUNS_V0.glob("*/failures.jsonl")), ids=lambda p: p.parent.name
)
def test_rows_of_old_runs_read_and_write_back_unchanged(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows
    for row in rows:
        failure = CellFailure.model_validate(row)
        assert failure.kind in FailureKind and failure.cell_id == row["cell_id"]
        assert failure.to_row() == row


def test_the_old_runs_failures_as_the_store_reads_them():
    store = RunStore.open(RUNS_V0 / "v0-attached")
    (failure,) = store.failures()
    assert failure.kind == FailureKind.SERVER_DIED and failure.attempt == 1
    assert (store.root / failure.requests_file).exists()


def test_a_row_of_a_cell_keeps_the_cells_columns_and_only_what_was_given():
    cell = Cell("av-k3", "gsm8k", None, 2.0, 1, 8, 0)
    row = CellFailure.of(cell, FailureKind.CELL, "ValueError: x", traceback="tb").to_row()
    assert row == cell.to_dict() | {
        "failure_kind": "cell",
        "reason": "ValueError: x",
        "traceback": "tb",
    }


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"reason": "r", "failure_kind": "cell"}, "no cell_id"),
        ({"cell_id": ["a"], "reason": "r", "failure_kind": "cell"}, "cell_id ['a']"),
        ({"cell_id": "a", "reason": 3, "failure_kind": "cell"}, "reason 3"),
        ({"cell_id": "a", "reason": "r", "failure_kind": "exploded"}, "failure_kind 'exploded'"),
        ({"cell_id": "a", "reason": "r", "failure_kind": "cell", "attempt": "first"}, "attempt"),
    ],
)
def test_a_row_that_is_not_a_failure_is_named_in_one_line(row, says):
    problem = failure_problem(row)
    assert problem is not None and problem.startswith("not a failure record (")
    assert says in problem and "\n" not in problem


def test_the_store_skips_a_bad_row_with_one_warning_naming_file_and_line(tmp_path):
    warnings: list[str] = []
    store = RunStore.create(tmp_path, "r", {"run_id": "r"})
    store.on_warning = warnings.append
    good = CellFailure(cell_id="a", reason="server died", kind=FailureKind.SERVER_DIED)
    store.write_failure(good)
    with store.failures_path.open("a") as fh:
        fh.write('{"cell_id": "b", "reason": "r", "failure_kind": "exploded"}\n')
    store.write_failure(good.model_copy(update={"cell_id": "c"}))
    assert [f.cell_id for f in store.failures()] == ["a", "c"]
    (line,) = warnings
    assert line.startswith(f"{store.failures_path}:2: not a failure record (failure_kind")
    assert line.endswith("; line skipped")
