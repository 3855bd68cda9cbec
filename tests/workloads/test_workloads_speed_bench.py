"""SPEED-Bench loading from a prepared directory (the schema fixture, NOT SPEED-Bench)."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from avbench.errors import WorkloadError
from avbench.inputs.workload import QUALITATIVE_CATEGORIES
from avbench.workloads.registry import builtin_workloads, load_workload
from avbench.workloads.speed_bench import PLACEHOLDER_PREFIX


def _spec(name, data_dir, **update):
    return builtin_workloads()[name].model_copy(update={"data_dir": data_dir, **update})


def test_fixture_says_it_is_not_speed_bench(speed_dir, jsonl):
    assert "NOT SPEED-Bench" in (speed_dir / "README.md").read_text()
    for f in ("throughput_2k.jsonl", "qualitative.jsonl"):
        for row in jsonl(speed_dir / f):
            assert all(m["content"].startswith("NOT SPEED-Bench") for m in row["messages"])


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("speed-bench-2k-low", "low_entropy"),
        ("speed-bench-2k-high", "high_entropy"),
        ("speed-bench-2k-mixed", "mixed"),
    ],
)
def test_2k_selects_exactly_its_category(name, category, speed_dir, jsonl):
    rows = jsonl(speed_dir / "throughput_2k.jsonl")
    want = {
        f"speed-bench/throughput_2k/{r['question_id']}" for r in rows if r["category"] == category
    }
    loaded = load_workload(_spec(name, speed_dir))
    assert {c.id for c in loaded.conversations} == want
    assert {c.category for c in loaded.conversations} == {category}
    assert loaded.source.origin == f"local:{speed_dir / 'throughput_2k.jsonl'}"
    assert loaded.source.rows == len(rows)
    assert loaded.source.extra["selected"] == len(want)
    by_id = {c.id: c for c in loaded.conversations}
    for r in rows:
        cid = f"speed-bench/throughput_2k/{r['question_id']}"
        if cid in by_id:
            assert by_id[cid].turns == tuple(m["content"] for m in r["messages"])


def test_qualitative_has_its_categories_and_turns(speed_dir):
    loaded = load_workload(_spec("speed-bench-qualitative", speed_dir))
    assert {c.category for c in loaded.conversations} == set(QUALITATIVE_CATEGORIES)
    assert sorted(len(c.turns) for c in loaded.conversations) == [1] * 11 + [2]


def test_parquet_layout_with_turns_gives_the_same_prompts(speed_dir, jsonl, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = jsonl(speed_dir / "throughput_2k.jsonl")
    for r in rows:
        r["turns"] = [m["content"] for m in r.pop("messages")]
    (tmp_path / "throughput_2k").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "throughput_2k" / "test.parquet")
    a = load_workload(_spec("speed-bench-2k-high", tmp_path))
    b = load_workload(_spec("speed-bench-2k-high", speed_dir))
    assert a.conversations == b.conversations
    assert a.source.extra["format"].startswith("parquet")


def _with_placeholder(speed_dir, tmp_path, category):
    rows = (speed_dir / "throughput_2k.jsonl").read_text().splitlines()
    out = []
    done = False
    for line in rows:
        row = json.loads(line)
        if not done and row["category"] == category:
            row["messages"][0]["content"] = PLACEHOLDER_PREFIX + " USING SPECDEC_BENCH\n\n{article}"
            done = True
        out.append(json.dumps(row))
    (tmp_path / "throughput_2k.jsonl").write_text("\n".join(out) + "\n")
    return tmp_path


def test_placeholder_row_refuses_with_how_to_prepare(speed_dir, tmp_path):
    d = _with_placeholder(speed_dir, tmp_path, "low_entropy")
    with pytest.raises(WorkloadError) as err:
        load_workload(_spec("speed-bench-2k-low", d))
    msg = str(err.value)
    assert "\n" not in msg
    assert "1 of 4 rows" in msg and "placeholders" in msg
    assert "prepare.py" in msg and "--data-dir" in msg


def test_placeholder_outside_the_selected_category_is_not_sent(speed_dir, tmp_path):
    d = _with_placeholder(speed_dir, tmp_path, "low_entropy")
    assert len(load_workload(_spec("speed-bench-2k-high", d)).conversations) == 5


def test_missing_dir_says_how_to_get_the_data(tmp_path):
    with pytest.raises(WorkloadError) as err:
        load_workload(_spec("speed-bench-2k-low", tmp_path / "absent"))
    msg = str(err.value)
    assert "does not exist" in msg
    assert "nvidia/SPEED-Bench" in msg and "prepare.py" in msg and "--data-dir" in msg


def test_dir_without_subset_file_names_the_expected_files(tmp_path):
    with pytest.raises(
        WorkloadError, match=r"throughput_2k\.jsonl nor throughput_2k/test\.parquet"
    ):
        load_workload(_spec("speed-bench-2k-low", tmp_path))


def test_no_data_dir_offline_says_how_to_get_it_fast():
    t0 = time.monotonic()
    with pytest.raises(WorkloadError, match="HF_HUB_OFFLINE.*nvidia/SPEED-Bench.*prepare.py"):
        load_workload(builtin_workloads()["speed-bench-2k-low"])
    assert time.monotonic() - t0 < 2


def test_unreachable_hub_fails_fast(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    t0 = time.monotonic()
    with pytest.raises(WorkloadError, match="unreachable"):
        load_workload(builtin_workloads()["speed-bench-2k-high"])
    assert time.monotonic() - t0 < 5


def test_unknown_category_or_subset_is_rejected(speed_dir):
    with pytest.raises(
        WorkloadError, match="category 'coding' is not in SPEED-Bench throughput_2k"
    ):
        load_workload(_spec("speed-bench-2k-low", speed_dir, category="coding"))
    with pytest.raises(WorkloadError, match="subset 'throughput_3k'"):
        load_workload(_spec("speed-bench-2k-low", speed_dir, subset="throughput_3k"))


def test_copy_of_fixture_loads_identically(speed_dir, tmp_path):
    shutil.copy(speed_dir / "throughput_2k.jsonl", tmp_path)
    a = load_workload(_spec("speed-bench-2k-low", tmp_path, seed=4))
    b = load_workload(_spec("speed-bench-2k-low", speed_dir, seed=4))
    assert a.conversations == b.conversations and a.source.sha256 == b.source.sha256
