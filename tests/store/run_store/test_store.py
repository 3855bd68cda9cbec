import json

import pytest

from avbench.errors import AvbenchError, StoreError, StoreFull
from avbench.loadgen.records import RequestRecord
from avbench.store.artefacts import dump_manifest
from avbench.store.failures import CellFailure
from avbench.store.run_store import RunStore, check_results_dir


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
        {"cell_id": "a", "k": 1},
        [_rec(0), _rec(1, error="boom", error_kind="http_5xx")],
        {"before": "m 1\n", "after": None},
    )
    store.write_cell({"cell_id": "b", "k": 2}, [_rec(2)], {})
    assert list(store.finished_cells()) == ["a", "b"]
    df = store.records_frame("a")
    assert list(df["conversation_id"]) == ["w/0", "w/1"]
    assert list(df["chunk_tokens"][0]) == [1, 3, 2]
    assert df["error_kind"][1] == "http_5xx"
    assert store.scrape_path("a", "before").read_text() == "m 1\n"
    assert not store.scrape_path("a", "after").exists()
    assert len(store.records_frame()) == 3


def _store(tmp_path, warnings=None):
    store = RunStore.create(tmp_path, "run1", {"run_id": "run1"})
    if warnings is not None:
        store.on_warning = warnings.append
    return store


def test_torn_last_line_is_moved_aside_before_the_next_append(tmp_path):
    warnings: list[str] = []
    store = _store(tmp_path, warnings)
    store.write_cell({"cell_id": "a"}, [_rec(0)], {})
    with store.cells_path.open("a") as fh:
        fh.write('{"cell_id": "b", "x"')  # crash mid-write
    assert list(store.finished_cells()) == ["a"]  # the cell reruns
    store.write_cell({"cell_id": "b", "k": 1}, [_rec(1)], {})
    lines = store.cells_path.read_text().splitlines()
    assert [json.loads(x)["cell_id"] for x in lines] == ["a", "b"]  # nothing glued to a fragment
    torn = store.cells_path.with_name("cells.jsonl.torn")
    assert torn.read_text() == '{"cell_id": "b", "x"\n'
    # The read names the line it skipped; the append says where the fragment went.
    assert warnings[0] == f"{store.cells_path}:2: last line is torn (a crash mid-write); skipped"
    assert len(warnings) == 2 and "cells.jsonl.torn" in warnings[1]
    assert warnings[1].endswith("that cell will be measured again")
    store.write_cell({"cell_id": "c"}, [_rec(2)], {})
    assert len(warnings) == 2  # a healthy file is not touched again


def test_a_last_line_without_newline_is_torn_even_when_it_parses(tmp_path):
    warnings: list[str] = []
    store = _store(tmp_path, warnings)
    store.write_failure(CellFailure(cell_id="a", reason="x", kind="cell"))
    with store.failures_path.open("a") as fh:
        fh.write('{"cell_id": "b", "reason": "y"}')  # the newline never made it
    assert [f.cell_id for f in store.failures()] == ["a"]
    store.require_writable()  # resume repairs both files up front
    assert store.failures_path.read_text().count("\n") == 1
    assert "b" in store.failures_path.with_name("failures.jsonl.torn").read_text()
    # A failure record is not a cell row: losing it loses a reason, not a measurement.
    (moved,) = [w for w in warnings if "failures.jsonl.torn" in w]
    assert "only the reason a cell failed is lost" in moved and "measured again" not in moved


def test_existing_run_directory_is_not_overwritten(tmp_path):
    RunStore.create(tmp_path, "run1", {"run_id": "run1"})
    # The hint names the directory, which is what --resume takes.
    with pytest.raises(AvbenchError, match=f"--resume {tmp_path / 'run1'}$"):
        RunStore.create(tmp_path, "run1", {"run_id": "run1"})


@pytest.mark.parametrize("run_id", ["../../x", "a/b", "..", ".hidden", "x/../../y", ""])
def test_run_ids_cannot_leave_the_results_directory(tmp_path, run_id):
    results = tmp_path / "results"
    with pytest.raises(StoreError, match="--run-id"):
        RunStore.create(results, run_id, {"run_id": run_id})
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written anywhere


def test_results_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreError, match="is a file, expected a directory"):
        check_results_dir(tmp_path / "f")
    with pytest.raises(StoreError, match="is a file"):
        RunStore.create(tmp_path / "f" / "sub", "r", {})


def test_read_only_results_and_run_dir(tmp_path, small_fs):
    fs = small_fs(256)
    store = RunStore.create(fs, "run1", {"run_id": "run1"})
    store.write_cell({"cell_id": "a"}, [_rec(0)], {})
    small_fs.read_only(fs)
    with pytest.raises(StoreError, match=r"--results .* not writable"):
        check_results_dir(fs)
    with pytest.raises(StoreError, match="not writable"):
        RunStore.open(store.root).require_writable()
    assert list(RunStore.open(store.root).finished_cells()) == ["a"]  # still readable


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"{}", None), (b"[1, 2]", "a JSON list"), (b"\x89PNG\r\n\x1a\n\x00\xff", "not JSON")],
)
def test_manifest_that_is_not_an_object_is_one_line(tmp_path, content, why):
    store = _store(tmp_path)
    store.manifest_path.write_bytes(content)
    if why is None:
        assert dump_manifest(store.read_manifest()) == {}  # resume rejects it (tests/runner)
        return
    with pytest.raises(StoreError, match=why) as exc:
        store.read_manifest()
    assert "\n" not in str(exc.value)


def test_disk_full_loses_nothing_and_tears_nothing(tmp_path, small_fs):
    fs = small_fs(512)
    store = RunStore.create(fs, "run1", {"run_id": "run1", "status": "running"})
    store.write_cell({"cell_id": "a"}, [_rec(0)], {})
    before = store.cells_path.read_bytes()
    filler = small_fs.fill(fs)
    # Records are written first: ENOSPC there leaves no row and no temporary file.
    with pytest.raises(StoreFull, match=r"b\.parquet: no space left on device") as exc:
        store.write_cell({"cell_id": "b"}, [_rec(i) for i in range(50)], {})
    assert "\n" not in str(exc.value) and f"--resume {store.root}" in str(exc.value)
    assert exc.value.exit_code == 1
    assert store.cells_path.read_bytes() == before
    assert not list((store.root / "requests").glob(".*"))
    # A row that only half fits (the file's last page has room for part of it) is cut back.
    big = {"cell_id": "c", "pad": "x" * 20000}
    with pytest.raises(StoreFull, match="cells.jsonl"):
        store._append(store.cells_path, big)
    assert store.cells_path.read_bytes() == before
    with pytest.raises(StoreFull, match="manifest.json"):
        store.update_manifest(status="finished")
    assert json.loads(store.manifest_path.read_text())["status"] == "running"  # intact
    filler.unlink()
    store.write_cell({"cell_id": "b"}, [_rec(1)], {})
    assert list(store.finished_cells()) == ["a", "b"]
    assert not store.cells_path.with_name("cells.jsonl.torn").exists()


def test_manifest_update_is_atomic_merge(tmp_path):
    store = RunStore.create(tmp_path, "run1", {"run_id": "run1", "status": "running"})
    store.update_manifest(status="finished")
    assert json.loads(store.manifest_path.read_text()) == {"run_id": "run1", "status": "finished"}
    with pytest.raises(AvbenchError, match="not a run directory"):
        RunStore.open(tmp_path / "nope")
