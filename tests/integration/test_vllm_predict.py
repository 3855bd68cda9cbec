"""Per-request acceptance, step timings and `avbench predict` against a REAL vLLM CPU server.

The session's shared server (``tiny_k3_server``: tiny pair, static K = 3, started as a sweep starts
its arm, ``--per-request-spec-decode-metrics detailed`` on the command line, the plugin capturing
drafts and steps among others); one attached sweep of two cells shared by the tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from vllm_servers import TinyK3

from avbench.metrics.prometheus import window_counters
from avbench.serving.capture import read_captured
from avbench.serving.server import probe_vllm
from avbench.store.run_store import RunStore

pytestmark = pytest.mark.vllm

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)

K = TinyK3.K


def avbench(*args, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "avbench.cli", *args], capture_output=True, text=True,
        timeout=timeout, env=os.environ | {"OPENAI_API_KEY": TinyK3.API_KEY},
    )  # fmt: skip


@pytest.fixture(scope="module")
def run(tiny_k3, tmp_path_factory) -> Path:
    served: TinyK3 = tiny_k3()
    results = tmp_path_factory.mktemp("pred")
    res = avbench(
        "sweep", "--pair", "tiny-cpu", "--endpoint", served.url, "--arm", f"static-k{K}",
        "--capture-dir", str(served.capture), "--capture", "drafts,steps", "--workloads",
        "gsm8k-tiny", "--concurrencies", "1,3", "--warmup", "1", "--requests", "6",
        "--temperature", "0", "--max-tokens", "48", "--results", str(results), "--run-id", "pred",
        "--no-report",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "have no definition" not in res.stderr
    return results / "pred"


def test_per_request_acceptance_equals_the_counters_exactly(run):
    store = RunStore.open(run)
    rows = list(store.finished_cells().values())
    assert len(rows) == 2
    for row in rows:
        cell = row["cell_id"]
        scrape = {w: store.scrape_path(cell, w).read_text() for w in ("before", "after")}
        counters = window_counters(scrape["before"], scrape["after"], model_name="tiny-target")
        records = [r for r in store.read_records(cell) if not r.warmup]
        assert all(r.ok and r.spec_per_step_accepted for r in records)
        # The server's own per-request lists, summed over the cell, are its counters' deltas.
        assert sum(sum(r.spec_per_step_accepted) for r in records) == counters.accepted > 0
        assert sum(sum(r.spec_per_step_drafted) for r in records) == counters.draft_tokens
        assert sum(len(r.spec_per_step_accepted) for r in records) == counters.drafts
        assert (row["req_spec_accepted"], row["req_spec_steps"]) == (
            counters.accepted,
            counters.drafts,
        )
        assert row["req_spec_vs_counter_accepted"] == 1.0
        assert row["chunk_vs_req_spec_accept_length"] is not None  # the stream proxy beside it
        # The plugin's step capture counts the same verdicts.
        steps = pd.read_parquet(run / "steps" / f"{cell}.steps.parquet")
        assert row["capture_steps"] == len(steps) and row["step_timing"] == "host-wall"
        hist = [list(h) for h in steps["acc_hist"]]
        assert sum(j * n for h in hist for j, n in enumerate(h)) == counters.accepted
        assert steps["drafts"].sum() == counters.draft_tokens
        assert steps["n_verify"].sum() == counters.drafts
        assert (steps["forward_ms"] > 0).all() and steps["draft_pos_ms"].map(len).max() == K
        # The drafts capture's steps are the step capture's: each (request, step) is in it.
        captured = read_captured(run / row["capture_dir"], [r.response_id for r in records])
        members = {
            (rid, s) for s, ids in zip(steps["step"], steps["request_ids"], strict=True)
            for rid in ids
        }  # fmt: skip
        pairs = set(zip(captured["request_id"], captured["step"], strict=True))
        assert pairs and pairs <= members


def test_predict_report_and_recommend_from_the_captured_arm(run):
    res = avbench("predict", str(run), "--arms", "static-k1,av")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "predicted from static-k3" in res.stdout and "(imported)" in res.stdout
    rows = [json.loads(x) for x in (run / "predicted.jsonl").read_text().splitlines()]
    measured = {r["cell_id"]: r for r in RunStore.open(run).finished_cells().values()}
    assert sorted(r["arm"] for r in rows) == ["av-k3", "av-k3", "static-k1", "static-k1"]
    for r in rows:
        src = measured[r["predicted_from"]]
        assert r["predicted"] is True and r["predicted_from_run"] == "pred"
        assert r["workload"] == src["workload"] and r["concurrency"] == src["concurrency"]
        assert r["output_tok_s_per_gpu"] > 0 and r["tpot_ms_median"] > 0
        if r["arm"] == "static-k1":
            # At most one draft per step: between 1 and 2, below K = 3's measured length.
            assert 1.0 <= r["acceptance_length"] <= min(2.0, src["acceptance_length"])
            assert r["verified_drafts_per_step"] < src["verified_drafts_per_step"]
            assert r["speculative_config"]["num_speculative_tokens"] == 1
    assert not (run / "cells.jsonl").read_text().count('"predicted"')  # never mixed in
    rep = avbench("report", str(run), "--no-figures")
    assert rep.returncode == 0, rep.stderr[-2000:]
    md = (run / "report.md").read_text()
    assert "Predicted cells (avbench predict)" in md and "static-k1 (predicted)" in md
    assec = avbench("recommend", str(run))
    assert assec.returncode == 0 and "rests on predicted" in assec.stdout, assec.stdout
