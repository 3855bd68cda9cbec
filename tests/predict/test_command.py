"""`avbench predict` through the real CLI: what it says when a run lacks what it needs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from avbench.store import RunStore


def _run(tmp_path, cells: list[dict]) -> RunStore:
    store = RunStore.create(tmp_path, "r1", {"run_id": "r1", "pair": {"name": "tiny-cpu"}})
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
        ([_cell("baseline"), _cell("static-k3")], "no step timings were captured"),
        (
            [_cell("static-k3", capture_steps=40)],
            "static-k3__gsm8k-tiny__c1__rep0: no step timings (steps/",
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
