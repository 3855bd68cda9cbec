"""A deployable K schedule with a K = 0 range, predicted on the wide pair and measured.

`avbench sweep --sweep predict-k0-wide` serves the wide pair as the baseline, static K = 3
and the dyn arm of the schedule [[1, 2, 3], [3, 64, 0]] at c = 8 (one repeat, step timings
captured); `avbench predict` replays static K = 3 and the baseline's steps as that schedule.
At c = 8 the batch holds three or more requests most of the time, where vLLM verifies no draft,
and drafts three tokens while it drains. A K = 0 range is not the baseline: the drafter still
runs its pass over each step's new tokens, so on this pair the dyn arm served 146-199 tok/s
against the baseline's 194-227 and K = 3's 200-231 (seven runs); a replay that ignored the range
would predict K = 3's. Three server starts; the prediction reads two of them (K = 3 and the
baseline), made apart: `quiet`.
"""

import json
import os
import subprocess
import sys

import pytest

from avbench.predict.predicted import PredictRequest, predict_run
from avbench.serving.server import probe_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.quiet]

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)

SCHEDULE = [(1, 2, 3), (3, 64, 0)]


def test_a_schedule_with_a_k0_range_is_predicted_as_its_dyn_arm_not_as_static_k3(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "sweep", "--pair", "tiny-cpu-wide", "--sweep",
         "predict-k0-wide", "--results", str(tmp_path), "--run-id", "k0", "--no-report"],
        capture_output=True, text=True, timeout=900, env=os.environ | {"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "k0"
    rows = [json.loads(x) for x in (run / "cells.jsonl").read_text().splitlines()]
    assert sorted({r["arm"] for r in rows}) == ["baseline", "dyn-k3", "static-k3"]
    (dyn,) = [r for r in rows if r["arm"] == "dyn-k3"]
    (k3,) = [r for r in rows if r["arm"] == "static-k3"]
    spec = dyn["speculative_config"]
    assert spec["num_speculative_tokens_per_batch_size"] == [list(e) for e in SCHEDULE]

    out = predict_run(PredictRequest(run, ("dyn",), "static-k3", SCHEDULE))
    (predicted,) = [r for r in out.rows if r["arm"] == "dyn-k3"]  # one per source cell

    # Most steps draft nothing: fewer verified drafts per step than K = 3 by far, as measured.
    k3_drafts = k3["verified_drafts_per_step"]
    assert predicted["verified_drafts_per_step"] < 0.5 * k3_drafts
    assert dyn["verified_drafts_per_step"] < 0.5 * k3_drafts
    # A replay that ignored the range would predict static K = 3's own throughput. The range's
    # steps priced without drafts, from the K = 3 cell and the baseline's steps, come out below
    # it: 0.78-0.87 of K = 3's measured throughput in five runs (2026-12-06). Against the dyn
    # arm itself the prediction was -16% to +21% off across those runs: three server starts,
    # and one start ran 45% slower in every part (docs/predict.md), so that is not asserted.
    metric = "output_tok_s_per_gpu"
    assert predicted[metric] < 0.95 * k3[metric], (predicted[metric], k3[metric], dyn[metric])
