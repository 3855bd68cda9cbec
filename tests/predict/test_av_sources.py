"""What an AV prediction rests on (issue 30, items 2-5): a run written as a sweep stores it
(step timings, draft shards of a sampled share of requests, the server's per-request lists),
predicted through ``predict_run`` and the CLI.

The run: K = 3, 10 requests of 12 verify steps each, staggered so the batch changes (1 to 5
requests a step); the drafts capture sampled one request in ten (``draft_fraction`` 0.1), so
most steps hold no captured request at all.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from avbench.capture_protocol import CAPTURE_SUFFIX, capture_schema
from avbench.inputs.suite import load_suite
from avbench.loadgen.records import RequestRecord
from avbench.predict.predicted import COMPARED_FILE, PREDICTED_FILE, PredictRequest, predict_run
from avbench.serving.capture import steps_path
from avbench.store.run_store import RunStore

K, REQUESTS, VERIFY_STEPS, STAGGER = 3, 10, 12, 3
CELL = "static-k3__gsm8k-tiny__c4__rep0"


def _plan() -> dict[str, list[int]]:
    """Request id -> its steps (the first is its prefill)."""
    return {
        f"cmpl-r{i}": list(range(STAGGER * i, STAGGER * i + VERIFY_STEPS + 1))
        for i in range(REQUESTS)
    }


def _accepted(rng) -> dict[str, list[int]]:
    return {rid: rng.integers(0, K + 1, VERIFY_STEPS).tolist() for rid in _plan()}


def _steps(plan: dict[str, list[int]]) -> pd.DataFrame:
    last = max(s for steps in plan.values() for s in steps)
    rows = []
    for s in range(last + 1):
        ids = [rid for rid, steps in plan.items() if s in steps]
        verifying = [rid for rid in ids if plan[rid][0] != s]
        rows.append({
            "step": s, "request_ids": ids, "n_reqs": len(ids),
            "tokens": len(ids) + K * len(verifying), "drafts": K * len(verifying),
            "forward_ms": 2.0 + 0.1 * len(ids), "sample_ms": 0.2, "draft_ms": 0.5 * len(ids),
            "interval_ms": 3.5 + 0.6 * len(ids), "writer": "pid-1",
        })  # fmt: skip
    return pd.DataFrame(rows)


def _shard(rid: str, steps: list[int], accepted: list[int], head: bool, rng) -> pa.Table:
    rows = []
    for s, a in zip(steps[1:], accepted, strict=True):
        for j in range(K):
            label = 1 if j < a else (0 if j == a else -1)
            rows.append({
                "request_id": rid, "step": s, "position": j + 1, "label": label,
                "q_max": 0.7, "logit_q_max": float(rng.normal(1.0, 1.5)), "q_sampled": 0.6,
                "entropy": 1.0, "estimator_pred": None,
                "head_score": float(rng.uniform(0.2, 0.95)) if head else None,
                "temperature": 1.0, "engine_request_id": f"{rid}-0abc", "pid": 1,
                "dp_rank": 0, "time": 0.0,
            })  # fmt: skip
    return pa.Table.from_pylist(rows, schema=capture_schema())


def _run(tmp_path, pair: str = "tiny-cpu", captured=("cmpl-r0",), head=False) -> RunStore:
    suite = load_suite()
    manifest = {"run_id": "r1", "pair": suite.pair(pair).model_dump(mode="json"),
                "sweep": suite.sweep("predict-cpu-t1").model_dump(mode="json")}  # fmt: skip
    store = RunStore.create(tmp_path, "r1", manifest)
    rng = np.random.default_rng(0)
    plan, accepted = _plan(), _accepted(rng)
    path = steps_path(store.root, CELL)
    path.parent.mkdir(parents=True, exist_ok=True)
    _steps(plan).to_parquet(path)
    capture = store.root / "arms" / "static-k3" / "capture"
    capture.mkdir(parents=True)
    for n, rid in enumerate(captured):
        pq.write_table(
            _shard(rid, plan[rid], accepted[rid], head, rng), capture / f"d-{n}{CAPTURE_SUFFIX}"
        )
    records = [
        RequestRecord(rid, 0, ttft=0.01, e2e=0.5, completion_tokens=40, response_id=rid,
                      spec_per_step_accepted=accepted[rid], spec_per_step_drafted=[K] * VERIFY_STEPS)
        for rid in plan
    ]  # fmt: skip
    store.write_records(CELL, records)
    store._append(store.cells_path, {
        "cell_id": CELL, "arm": "static-k3", "arm_kind": "static", "k": K, "pair": pair,
        "run_id": "r1", "gpus": 1, "rate": None, "status": "ok",
        "workload": "gsm8k-tiny", "concurrency": 4, "repeat": 0, "num_requests": REQUESTS,
        "warmup": 0, "output_tok_s_per_gpu": 100.0, "capture": ["steps", "drafts"],
        "capture_steps": len(_steps(plan)), "capture_dir": "arms/static-k3/capture",
    })  # fmt: skip
    return store


def test_with_draft_fraction_01_every_verify_step_is_kept_and_its_coverage_said(tmp_path):
    """Item 3: events of steps with no captured request used to be dropped, so AV was replayed
    on the steps that happened to hold the sampled request. Now every verify step of every
    request is replayed; those without captured features borrow from their step, else from
    elsewhere in the cell, and the prediction carries the counts."""
    store = _run(tmp_path)
    res = predict_run(PredictRequest(store.root, ("av",)))
    cov = res.coverage["av-k3"]
    assert cov.events == REQUESTS * VERIFY_STEPS  # none dropped
    assert cov.captured == VERIFY_STEPS  # the one sampled request
    assert cov.same_step > 0 and cov.same_cell > 0
    assert cov.captured + cov.same_step + cov.same_cell == cov.events
    assert cov.share == pytest.approx(0.1)
    (row,) = res.rows
    assert row["av_events"] == cov.events and row["av_coverage"] == pytest.approx(0.1)
    assert row["av_confidences"] == "estimator"


@pytest.mark.slow
def test_the_cli_prints_coverage_and_the_differences_from_vllms_own_av(tmp_path):
    store = _run(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "predict", str(store.root), "--arms", "av"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (
        "av-k3: feature coverage 10%: 12 of 120 verify steps with captured features" in out.stdout
    )
    assert "AV predicted unlike vLLM's own in: cost curves from the cell's own" in out.stdout
    assert "no CUDA-graph capture limit" in out.stdout and "no logits cap" in out.stdout


@pytest.mark.slow
def test_an_av_prediction_from_no_captured_confidences_is_refused_in_one_line(tmp_path):
    """Item 2: the drafts capture recorded nothing (V2 switches it off under greedy drafting):
    AV is not predicted from the server's lists alone; asked for alone, exit 2, one line."""
    store = _run(tmp_path, captured=())
    res = predict_run(PredictRequest(store.root, ("static", "av")))
    assert {r["arm"] for r in res.rows} == {"static-k1", "static-k2"}
    (why,) = res.skipped
    assert why.startswith(f"av-k3: refused: {CELL}: no captured drafter confidences")
    written = {f: (store.root / f).stat().st_mtime_ns for f in (PREDICTED_FILE, COMPARED_FILE)}
    out = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "predict", str(store.root), "--arms", "av"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("error:")]  # vLLM may log too
    assert line.startswith("error: r1: nothing predicted: av-k3: refused: ")
    assert "Traceback" not in out.stderr
    assert {f: (store.root / f).stat().st_mtime_ns for f in written} == written  # left alone


def test_a_dspark_pair_with_a_head_is_predicted_from_its_scores_or_refused(tmp_path):
    """Item 4: dsv4-dspark's AV decides with the checkpoint's confidence head. From captures
    without head scores (any static arm: vLLM runs the head only with AV on) it is refused
    with that reason; with head scores captured, AV confides in them, not the estimator."""
    without = predict_run(PredictRequest(_run(tmp_path / "a", pair="dsv4-dspark").root, ("av",)))
    (why,) = without.skipped
    assert "runs AV on its DSpark confidence head" in why and "captured no head scores" in why
    assert not without.rows
    store = _run(tmp_path / "b", pair="dsv4-dspark", captured=("cmpl-r0", "cmpl-r5"), head=True)
    (row,) = predict_run(PredictRequest(store.root, ("av",))).rows
    assert row["av_confidences"] == "head"
    estimator = predict_run(PredictRequest(_run(tmp_path / "c").root, ("av",))).rows[0]
    assert estimator["av_confidences"] == "estimator"


def test_the_predicted_rows_say_so_on_the_page(tmp_path):
    from avbench.report import write_report

    store = _run(tmp_path)
    predict_run(PredictRequest(store.root, ("av",)))
    html = write_report([store.root], static_figures=False).html.read_text(encoding="utf-8")
    assert "confidences: estimator; feature coverage 10%: 12 of 120 verify steps" in html
    assert "AV predictions differ from vLLM&#x27;s own AV in" in html or (
        "AV predictions differ from vLLM's own AV in" in html
    )
    assert json.dumps("no CUDA-graph capture limit")[1:-1] in html
