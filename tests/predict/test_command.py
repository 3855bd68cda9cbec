"""`avbench predict` through the real CLI: what it says when a run lacks what it needs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from avbench.inputs.suite import load_suite
from avbench.store.run_store import RunStore


def _run(tmp_path, cells: list[dict]) -> RunStore:
    suite = load_suite()
    manifest = {
        "run_id": "r1",
        "pair": suite.pair("tiny-cpu").model_dump(mode="json"),
        "sweep": suite.sweep("demo").model_dump(mode="json"),
    }
    store = RunStore.create(tmp_path, "r1", manifest)
    for c in cells:
        store._append(store.cells_path, c)
    return store


def _cell(arm: str, **extra) -> dict:
    kind, k = ("baseline", 0) if arm == "baseline" else ("static", int(arm[-1]))
    return {
        "cell_id": f"{arm}__gsm8k-tiny__c1__rep0", "arm": arm, "arm_kind": kind, "k": k,
        "workload": "gsm8k-tiny", "concurrency": 1, "repeat": 0, "num_requests": 4,
        "warmup": 1, "output_tok_s_per_gpu": 100.0,
    } | extra  # fmt: skip


@pytest.mark.parametrize(
    ("cells", "says"),
    [
        ([_cell("baseline")], "nothing to predict from: no static-K arm was measured"),
        (
            [_cell("baseline"), _cell("static-k3")],
            "no step timings or per-request spec-decode metrics were captured",
        ),
        (
            [_cell("static-k3", capture_steps=40)],
            "static-k3__gsm8k-tiny__c1__rep0: no step timings (steps/static-k3__gsm8k-tiny__c1"
            "__rep0.steps.parquet or per-request spec-decode metrics in its records",
        ),
    ],
)
def test_a_run_without_captures_is_one_line_and_exit_2(tmp_path, cells, says):
    store = _run(tmp_path, cells)
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "predict", str(store.root)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not (store.root / "predicted.jsonl").exists()


def test_a_bad_schedule_is_one_line_and_exit_2(tmp_path):
    store = _run(tmp_path, [_cell("static-k3")])
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "predict", str(store.root), "--schedule", "[[2, 4, 1]]"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.startswith("error: --schedule '[[2, 4, 1]]'") and "batch size 1" in res.stderr


def test_without_the_plugin_the_servers_lists_predict_acceptance(tmp_path):
    """A server without the avbench plugin (attach mode on someone else's): no steps, but its
    per-request spec-decode metrics still give the accepted prefixes."""
    from avbench.loadgen.records import RequestRecord

    store = _run(tmp_path, [_cell("static-k3", req_spec_steps=4)])
    # One request: steps accepting 3, 1, 0, 3 of 3 drafts (positions 1 1 1 - 1 0 0 1 1 1 -).
    rec = RequestRecord("c0", 0, ttft=0.1, e2e=0.5, completion_tokens=12, response_id="cmpl-x",
                        spec_per_step_accepted=[3, 1, 0, 3], spec_per_step_drafted=[3] * 4,
                        spec_acceptance_histogram=[1, 1, 0, 2])  # fmt: skip
    store.write_records("static-k3__gsm8k-tiny__c1__rep0", [rec])
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "predict", str(store.root), "--arms", "static-k1,av"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "not predicted: av-k3: AV needs step timings and drafts" in res.stdout
    (row,) = [json.loads(x) for x in (store.root / "predicted.jsonl").read_text().splitlines()]
    # K' = 1 walks 1 1 1 - 1 0 0 1 1 1 -: steps at 0, 2, 4, 6, 7, 9: 5 accepted in 6 steps.
    assert row["arm"] == "static-k1" and row["acceptance_length"] == pytest.approx(1 + 5 / 6)
    assert row["output_tok_s_per_gpu"] is None and row["tpot_ms_median"] is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--arms", "static-k9"], "--arms static-k9: K 9 is above the source static-k3's K 3"),
        (["--arms", "av-k5"], "--arms av-k5: AV is predicted at the source static-k3's K 3 only"),
        (
            ["--arms", "dyn", "--schedule", "[[1, 16, 9]]"],
            "--schedule: K 9 is above the source static-k3's K 3; only K <= 3",
        ),
    ],
)
def test_an_arm_the_source_never_drafted_is_refused_in_one_line(tmp_path, args, says):
    from avbench.loadgen.records import RequestRecord

    store = _run(tmp_path, [_cell("static-k3", req_spec_steps=2)])
    rec = RequestRecord("c0", 0, ttft=0.1, e2e=0.5, completion_tokens=6, response_id="cmpl-x",
                        spec_per_step_accepted=[3, 1], spec_per_step_drafted=[3, 3],
                        spec_acceptance_histogram=[0, 1, 0, 1])  # fmt: skip
    store.write_records("static-k3__gsm8k-tiny__c1__rep0", [rec])
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "predict", str(store.root), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stderr
    assert not (store.root / "predicted.jsonl").exists()
