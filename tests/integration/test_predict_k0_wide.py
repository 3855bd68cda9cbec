"""A deployable K schedule with a K = 0 range, predicted on the wide pair and measured.

`avbench sweep --sweep predict-k0-wide` serves the wide pair as the baseline, static K = 3
and the dyn arm of the schedule [[1, 2, 3], [3, 64, 0]] at c = 8 (two repeats, step timings
captured); `avbench predict` replays static K = 3 and the baseline's steps as that schedule.
At c = 8 the batch holds three or more requests most of the time, where vLLM verifies no draft,
and drafts three tokens while it drains. A K = 0 range is not the baseline: the drafter still
runs its pass over each step's new tokens, so on this pair the dyn arm served about 181 tok/s
against the baseline's 215 and K = 3's 231 (2026-12-06); a replay that ignored the range would
predict K = 3's. Three server starts; the timings compared are of runs made apart: `quiet`.
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
    dyn = [r for r in rows if r["arm"] == "dyn-k3"]
    k3 = [r for r in rows if r["arm"] == "static-k3"]
    spec = dyn[0]["speculative_config"]
    assert spec["num_speculative_tokens_per_batch_size"] == [list(e) for e in SCHEDULE]

    out = predict_run(PredictRequest(run, ("dyn",), "static-k3", SCHEDULE))
    predicted = [r for r in out.rows if r["arm"] == "dyn-k3"]
    assert len(predicted) == 2  # one per source repeat
    compared = {c.metric: c for c in out.compared if c.arm == "dyn-k3"}
    assert compared["output_tok_s_per_gpu"].repeats == 2

    def mean(cells, column):
        return sum(r[column] for r in cells) / len(cells)

    # Most steps draft nothing: fewer verified drafts per step than K = 3 by far, as measured.
    k3_drafts = mean(k3, "verified_drafts_per_step")
    assert mean(predicted, "verified_drafts_per_step") < 0.5 * k3_drafts
    assert mean(dyn, "verified_drafts_per_step") < 0.5 * k3_drafts
    # The prediction is the dyn arm's, not static K = 3's: nearer the measured dyn arm than K = 3
    # (the dyn arm is 20% below K = 3 here). Within max(5%, spread) of it, as issue 29 asks, it
    # is not yet: predicted 5.5% and 8.6% low in two runs (docs/predict.md).
    for metric in ("output_tok_s_per_gpu", "tpot_ms_median"):
        p, d, s3 = mean(predicted, metric), mean(dyn, metric), mean(k3, metric)
        assert abs(p - d) < abs(p - s3), (metric, p, d, s3)
