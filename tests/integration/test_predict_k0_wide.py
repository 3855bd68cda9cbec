"""A deployable K schedule with a K = 0 range, predicted on the wide pair and measured.

`avbench sweep --sweep predict-k0-wide` serves the wide pair as the baseline, static K = 3
and the dyn arm of the schedule [[1, 2, 3], [3, 64, 0]] at c = 8 (one repeat, step timings
captured); `avbench predict` replays static K = 3 and the baseline's steps as that schedule.
At c = 8 the batch holds three or more requests most of the time, where vLLM verifies no draft,
and drafts three tokens while it drains. A K = 0 range is not the baseline: the drafter still
runs its pass over each step's new tokens, so on this pair the dyn arm served 180-199 tok/s
against the baseline's 215-224 and K = 3's 212-231 (three runs); a replay that ignored the range
would predict K = 3's. Three server starts; the timings compared are of runs made apart: `quiet`.
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
    # The prediction is the dyn arm's, not static K = 3's: nearer the measured dyn arm than K = 3
    # in throughput (the dyn arm 6-22% below K = 3 in three runs). Not in median TPOT, where the
    # two arms measured within 4% of each other (prefills stall both alike). Within max(5%,
    # spread) of the dyn arm it is not yet: 5.5-9.8% low (docs/predict.md).
    metric = "output_tok_s_per_gpu"
    p, d, s3 = predicted[metric], dyn[metric], k3[metric]
    assert abs(p - d) < abs(p - s3), (p, d, s3)
