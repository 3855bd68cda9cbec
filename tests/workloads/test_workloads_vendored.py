"""The four prompt sets shipped with avbench load offline, complete and verbatim."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from avbench.errors import WorkloadError
from avbench.workloads.registry import builtin_workloads, load_workload

CASES = [
    # name, file, rows, turns per conversation
    ("gsm8k", "gsm8k/test.jsonl", 1319, {1}),
    ("humaneval", "humaneval/HumanEval.jsonl", 164, {1}),
    ("mt-bench", "mt_bench/question.jsonl", 80, {2}),
    ("spec-bench", "spec_bench/question.jsonl", 480, {1, 2}),
]


@pytest.mark.parametrize(("name", "rel", "rows", "turns"), CASES)
def test_loads_every_row_offline_with_checksum(name, rel, rows, turns, data_root):
    loaded = load_workload(builtin_workloads()[name])
    assert len(loaded.conversations) == rows
    assert loaded.truncated == 0
    assert len({c.id for c in loaded.conversations}) == rows
    assert {len(c.turns) for c in loaded.conversations} == turns
    path = data_root / rel
    assert loaded.source.origin == f"local:avbench/workloads/data/{rel}"
    assert loaded.source.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    # ...and it is the checksum the vendoring note promises (byte-identical to upstream).
    assert loaded.source.sha256 in (path.parent / "SOURCE.md").read_text()
    assert loaded.source.rows == rows


def _by_id(name):
    return {c.id: c for c in load_workload(builtin_workloads()[name]).conversations}


def test_gsm8k_prompt_is_the_question(jsonl, data_root):
    row = jsonl(data_root / "gsm8k" / "test.jsonl")[17]
    conv = _by_id("gsm8k")["gsm8k/17"]
    assert conv.turns == (row["question"],)
    assert conv.reference == row["answer"]


def test_humaneval_prompt_wording(jsonl, data_root):
    row = jsonl(data_root / "humaneval" / "HumanEval.jsonl")[5]
    assert row["task_id"] == "HumanEval/5"
    conv = _by_id("humaneval")["humaneval/5"]
    expected = (
        "Complete the following Python function.\n\n```python\n"
        + row["prompt"].rstrip("\n")
        + "\n```"
    )
    assert conv.turns == (expected,)


def test_mt_bench_two_turns_and_category(jsonl, data_root):
    row = jsonl(data_root / "mt_bench" / "question.jsonl")[0]
    conv = _by_id("mt-bench")[f"mt-bench/{row['question_id']}"]
    assert conv.turns == tuple(row["turns"]) and len(conv.turns) == 2
    assert conv.category == row["category"]


def test_spec_bench_rows_and_mt_bench_prefix(jsonl, data_root):
    rows = jsonl(data_root / "spec_bench" / "question.jsonl")
    spec = _by_id("spec-bench")
    row = rows[100]
    assert spec[f"spec-bench/{row['question_id']}"].turns == tuple(row["turns"])
    mt = _by_id("mt-bench")
    # Its first 80 rows are MT-Bench, question ids included.
    assert [spec[f"spec-bench/{r['question_id']}"].turns for r in rows[:80]] == [
        mt[f"mt-bench/{r['question_id']}"].turns for r in rows[:80]
    ]


def test_data_dir_overrides_vendored_copy(tmp_path, jsonl, data_root):
    rows = jsonl(data_root / "gsm8k" / "test.jsonl")[:3]
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    spec = builtin_workloads()["gsm8k"].model_copy(update={"data_dir": tmp_path})
    loaded = load_workload(spec)
    assert len(loaded.conversations) == 3
    assert loaded.source.origin == f"local:{tmp_path / 'test.jsonl'}"


def test_data_dir_without_the_file_names_it(tmp_path):
    spec = builtin_workloads()["humaneval"].model_copy(update={"data_dir": tmp_path})
    with pytest.raises(WorkloadError, match="HumanEval.jsonl"):
        load_workload(spec)


def test_bad_row_names_file_and_field(tmp_path):
    (tmp_path / "question.jsonl").write_text('{"question_id": 1, "category": "x"}\n')
    spec = builtin_workloads()["mt-bench"].model_copy(update={"data_dir": tmp_path})
    with pytest.raises(WorkloadError, match=r"question.jsonl row 0: missing field 'turns'"):
        load_workload(spec)


def test_hub_request_offline_falls_back_fast_and_says_so():
    spec = builtin_workloads()["gsm8k"].model_copy(update={"hf_revision": "main"})
    t0 = time.monotonic()
    loaded = load_workload(spec)
    assert time.monotonic() - t0 < 5
    assert loaded.source.origin.startswith("local:")
    assert "HF_HUB_OFFLINE" in loaded.source.extra["hub_fallback_reason"]
    assert loaded.source.extra["hub_requested"] == "hf:openai/gsm8k@main"


def test_spec_bench_has_no_hub_copy():
    spec = builtin_workloads()["spec-bench"].model_copy(update={"hf_revision": "main"})
    with pytest.raises(WorkloadError, match="no hub copy"):
        load_workload(spec)
