"""A deployable K schedule with a K = 0 range, predicted on the wide pair and measured.

`avbench sweep --sweep predict-k0-wide` serves the wide pair as the baseline, static K = 3
and the dyn arm of the schedule [[1, 2, 3], [3, 64, 0]] at c = 8 (two repeats, each on a server
of its own; step timings captured); `avbench predict` replays static K = 3 and the baseline's
steps as that schedule. At c = 8 the batch holds three or more requests most of the time, where
vLLM verifies no draft, and drafts three tokens while it drains. A K = 0 range is not the
baseline: the drafter still runs its pass over each step's new tokens, so on this pair the dyn
arm served 124-199 tok/s against the baseline's 170-227 and K = 3's 163-231 (2026-12-06/07); a
replay that ignored the range would predict K = 3's. Six server starts; the prediction reads
the K = 3 and baseline cells, made apart: `quiet`.
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
    assert len(dyn) == len(k3) == 2  # two repeats
    spec = dyn[0]["speculative_config"]
    assert spec["num_speculative_tokens_per_batch_size"] == [list(e) for e in SCHEDULE]

    out = predict_run(PredictRequest(run, ("dyn",), "static-k3", SCHEDULE))
    predicted = [r for r in out.rows if r["arm"] == "dyn-k3"]  # one per source cell

    # Most steps draft nothing: fewer verified drafts per step than K = 3 by far, as measured.
    k3_drafts = min(r["verified_drafts_per_step"] for r in k3)
    assert max(r["verified_drafts_per_step"] for r in predicted) < 0.5 * k3_drafts
    assert max(r["verified_drafts_per_step"] for r in dyn) < 0.5 * k3_drafts
    # A replay that ignored the range would predict static K = 3 as itself: the same source
    # steps replayed at K = 3 throughout. Against that replay, not K = 3's measurement: the
    # range's steps are priced from the baseline's server, which drifts apart from K = 3's
    # (the prediction fell 4.6-13.6% below K = 3's measurement over seven runs).
    metric = "output_tok_s_per_gpu"
    itself = predict_run(PredictRequest(run, ("static-k3",), "static-k3", None)).rows
    tput = {
        a: sum(r[metric] for r in rs) / len(rs) for a, rs in (("pred", predicted), ("k3", itself))
    }
    assert tput["pred"] < tput["k3"], tput
    # The dyn arm measured inside the prediction's interval (avbench/predict/validate.py). The
    # validation's max(5%, the repeats' spreads) held in seven runs of this test and failed in
    # an eighth (2026-12-07): two repeats understate how far servers drift here (the same
    # seeded cells 10-25% apart over one afternoon), so it is reported, not asserted.
    (check,) = [c for c in out.compared if c.arm == "dyn-k3" and c.metric == metric]
    assert check.repeats == 2
    assert check.covered, check
