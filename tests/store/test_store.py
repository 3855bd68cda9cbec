import json

import pytest

from avbench.errors import AvbenchError
from avbench.records import RequestRecord
from avbench.store import RunStore


def _rec(i, **kw):
    return RequestRecord(
        conversation_id=f"w/{i}",
        turn=0,
        sent_at=1.0,
        ttft=0.1,
        e2e=0.5,
        chunk_times=[0.1, 0.2, 0.5],
        chunk_tokens=[1, 3, 2],
        completion_tokens=6,
        **kw,
    )


def test_cells_are_appended_and_records_roundtrip(tmp_path):
    store = RunStore.create(tmp_path, "run1", {"run_id": "run1"})
    store.write_cell(
        {"cell_id": "a", "x": 1},
        [_rec(0), _rec(1, error="boom", error_kind="http_5xx")],
        {"before": "m 1\n", "after": None},
    )
    store.write_cell({"cell_id": "b", "x": 2}, [_rec(2)], {})
    assert list(store.finished_cells()) == ["a", "b"]
    df = store.records_frame("a")
    assert list(df["conversation_id"]) == ["w/0", "w/1"]
    assert list(df["chunk_tokens"][0]) == [1, 3, 2]
    assert df["error_kind"][1] == "http_5xx"
    assert store.scrape_path("a", "before").read_text() == "m 1\n"
    assert not store.scrape_path("a", "after").exists()
    assert len(store.records_frame()) == 3


def test_torn_last_line_is_ignored_so_the_cell_reruns(tmp_path):
    store = RunStore.create(tmp_path, "run1", {"run_id": "run1"})
    store.write_cell({"cell_id": "a"}, [_rec(0)], {})
    with store.cells_path.open("a") as fh:
        fh.write('{"cell_id": "b", "x"')  # crash mid-write
    assert list(store.finished_cells()) == ["a"]


def test_existing_run_directory_is_not_overwritten(tmp_path):
    RunStore.create(tmp_path, "run1", {"run_id": "run1"})
    with pytest.raises(AvbenchError, match="--resume run1"):
        RunStore.create(tmp_path, "run1", {"run_id": "run1"})


def test_manifest_update_is_atomic_merge(tmp_path):
    store = RunStore.create(tmp_path, "run1", {"run_id": "run1", "status": "running"})
    store.update_manifest(status="finished")
    assert json.loads(store.manifest_path.read_text()) == {"run_id": "run1", "status": "finished"}
    with pytest.raises(AvbenchError, match="not a run directory"):
        RunStore.open(tmp_path / "nope")
