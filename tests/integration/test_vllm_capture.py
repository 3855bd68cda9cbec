"""The avbench vLLM plugin inside a REAL vLLM CPU server (tiny pair, K = 3, greedy): the
session's shared static-k3 server (``tiny_k3_server``), started with captures on exactly as a
sweep would start it (docs/testing.md).
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from vllm_servers import TinyK3

from avbench.estimator.drafts import read_drafts
from avbench.metrics.prometheus import window_counters
from avbench.serving.capture import read_captured, read_status, wait_flushed
from avbench.serving.server import probe_vllm

pytestmark = pytest.mark.vllm

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)

K = TinyK3.K


@pytest.fixture
def served(tiny_k3_server: TinyK3) -> TinyK3:
    return tiny_k3_server


def accepted_by_position(drafts: pd.DataFrame) -> dict[int, int]:
    acc = drafts[drafts["label"] == 1].groupby("position").size()
    return {int(p) - 1: int(n) for p, n in acc.items()}


def test_sweep_captures_equal_the_servers_counters(served, tmp_path):
    results = tmp_path / "results"
    cmd = [
        sys.executable, "-m", "avbench.cli", "sweep", "--pair", "tiny-cpu",
        "--endpoint", served.url, "--arm", f"static-k{K}", "--capture-dir", str(served.capture),
        "--capture", "drafts", "--workloads", "gsm8k-tiny",
        "--concurrencies", "1,3", "--warmup", "1", "--requests", "4", "--temperature", "0",
        "--max-tokens", "32", "--results", str(results), "--run-id", "cap", "--no-report",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                         env=os.environ | {"OPENAI_API_KEY": TinyK3.API_KEY})  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "have no definition" not in res.stderr  # every capture column is in the row schema
    run = results / "cap"
    rows = [json.loads(line) for line in (run / "cells.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    total_acc: dict[int, int] = {}
    total_counter: dict[int, float] = {}
    for row in rows:
        cell = row["cell_id"]
        assert row["capture_flushed"] and row["capture_errors"] == 0, row
        drafts = read_drafts(run / "drafts" / f"{cell}.drafts.parquet", structure=True)
        assert len(drafts) == row["capture_draft_rows"] > 0
        scrape = {
            w: (run / "scrapes" / f"{cell}.{w}.prom").read_text() for w in ("before", "after")
        }
        counters = window_counters(scrape["before"], scrape["after"], model_name=served.model)
        acc = accepted_by_position(drafts)
        # Exactly the server's own per-position counter, cell by cell.
        assert acc == {p: int(n) for p, n in counters.accepted_per_pos.items() if n}, cell
        measured = pd.read_parquet(run / "requests" / f"{cell}.parquet")
        ids = measured.loc[~measured["warmup"], "response_id"].tolist()
        assert all(i and i.startswith("chatcmpl-") for i in ids)  # a chat workload
        # Every scheduled draft token of the measured requests (labeled or not) is captured.
        assert len(read_captured(served.capture, ids)) == counters.draft_tokens
        # Without AV every scheduled draft is verified: the captured acceptance per verified
        # draft is the counters' acceptance rate, to the last bit.
        assert row["captured_scheduled_tokens"] == row["captured_verified_tokens"]
        assert row["captured_scheduled_tokens"] == counters.draft_tokens
        assert row["trimmed_share"] == 0.0 and row["acceptance_rate_per"] == "verified draft"
        assert row["verified_acceptance_rate"] == row["acceptance_rate"]
        for p, n in acc.items():
            total_acc[p] = total_acc.get(p, 0) + n
        for p, n in counters.accepted_per_pos.items():
            total_counter[p] = total_counter.get(p, 0) + n
    assert total_acc == {p: int(n) for p, n in total_counter.items() if n}

    out = tmp_path / "tables"
    tables = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "tables", str(run), "--out", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert tables.returncode == 0, tables.stderr[-2000:]
    n = sum(r["capture_draft_rows"] for r in rows)
    assert f"{n} labeled drafts" in (out / "tables.md").read_text()
    show = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "estimator", "show", str(run)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # Model Runner V1 has no online estimator: one line says so.
    assert show.returncode == 0 and show.stdout.strip().count("\n") == 0
    assert "no estimator refits" in show.stdout


def _aligned(cap: pd.DataFrame, tr: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The longest common prefix of two requests' labeled drafts (same positions, labels)."""
    cap = cap.sort_values(["step", "position"]).reset_index(drop=True)
    tr = tr.sort_values(["step", "position"]).reset_index(drop=True)
    n = min(len(cap), len(tr))
    same = (cap["position"].to_numpy()[:n] == tr["position"].to_numpy()[:n]) & (
        cap["label"].to_numpy()[:n] == tr["label"].to_numpy()[:n]
    )
    m = n if same.all() else int(np.argmin(same))
    return cap.iloc[:m], tr.iloc[:m]


def test_captured_features_match_the_offline_trace(served):
    from avbench.assets import tiny_pair_dir
    from avbench.estimator.trace import Models, TraceConfig, load_model, load_tokenizer, trace_pair

    root = tiny_pair_dir()
    tok = load_tokenizer(root / "target")
    texts = [
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many",
        "def add(a, b):\n    return",
        "Question: A robe takes 2 bolts of blue fiber and half that much white fiber.",
    ]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    max_tokens = 40
    ids = [served.complete(p, max_tokens) for p in prompts]
    assert wait_flushed(served.capture, time.time(), 0.0)
    captured = read_captured(served.capture, ids)
    captured = captured[captured["label"].isin((0, 1))]

    cfg = TraceConfig(num_draft=K, temperature=0.0, max_new_tokens=max_tokens,
                      num_prompts=len(prompts), concurrency=1)  # fmt: skip
    target, drafter = load_model(root / "target"), load_model(root / "drafter")
    names = {"run_id": "t", "pair_id": "tiny-cpu", "workload_id": "w"}
    trace = trace_pair(Models(target, drafter), prompts, cfg, names, eos_token_ids=())

    pairs = []
    for i, rid in enumerate(ids):
        tr = trace[trace["request_id"] == f"w/{i}"]
        # vLLM drafts first after the prefill has produced a token; the trace's first step
        # drafts from the prompt alone and has no counterpart (it rejects at position 1 on
        # these prompts, so both then continue from the same context).
        first = tr[tr["step"] == tr["step"].min()]
        assert first["label"].tolist() == [0]
        tr = tr[tr["step"] > tr["step"].min()]
        c, t = _aligned(captured[captured["request_id"] == rid], tr)
        assert len(c) >= 0.8 * len(tr), rid  # the same tokens, step by step
        pairs.append((c, t))
    c = pd.concat([p[0] for p in pairs], ignore_index=True)
    t = pd.concat([p[1] for p in pairs], ignore_index=True)
    f_c, f_t = c["logit_q_max"].to_numpy(), t["logit_q_max"].to_numpy()
    d_f = np.abs(f_c - f_t)
    # vLLM's kernel computes f = -log(total - 1) in float32; total is ~1 + e^-f, so its
    # rounding (a few ulps of 1) moves f by about that times e^f, and past f ~ 16 it is 40.
    bound = 1e-4 + 4 * 2**-23 * np.exp(np.minimum(f_t, 30))
    ok = (d_f <= bound) | ((f_c == 40.0) & (f_t > 14))
    assert ok.all(), c.assign(f_trace=f_t, d_f=d_f)[~ok].head().to_string()
    low = f_t < 6  # where float32 cannot move f by more than 1e-4
    assert d_f[low].max() <= 1e-4
    assert np.abs(c["q_max"].to_numpy() - t["q_max"].to_numpy()).max() <= 1e-4
    assert np.abs(c["entropy"].to_numpy() - t["entropy"].to_numpy()).max() <= 1e-4
    print(
        f"\naligned drafts {len(c)}; |f diff| max {d_f.max():.3g} (f < 6: {d_f[low].max():.3g}, "
        f"n={int(low.sum())}); q_max {np.abs(c['q_max'] - t['q_max']).max():.3g}; "
        f"entropy {np.abs(c['entropy'] - t['entropy']).max():.3g}"
    )


def test_a_failing_capture_write_is_counted_and_serving_goes_on(served):
    status = [s for s in read_status(served.capture) if s.get("rows_written")]
    assert status, "the earlier tests captured something"
    pid, shards, prefix = (status[-1][k] for k in ("pid", "shards", "shard_prefix"))
    # A real fault: a directory sits where the next shard's temporary file must be written.
    blocker = served.capture / f".{prefix}-{shards + 1:06d}.capture.parquet.tmp"
    blocker.mkdir()
    before = served.metrics()
    try:
        ids = [served.complete(f"Count the apples number {i}:", 24) for i in range(2)]
        # Ask for the flush now rather than waiting for the writer's 30 s age limit.
        wait_flushed(served.capture, time.time(), 0.0, timeout_s=5)
        deadline = time.time() + 60
        while time.time() < deadline:
            errs = [s["errors"] for s in read_status(served.capture) if s["pid"] == pid]
            if errs and errs[0].get("writer", 0) >= 1:
                break
            time.sleep(0.5)
        assert errs[0].get("writer", 0) >= 1
    finally:
        blocker.rmdir()
    ids.append(served.complete("One more question:", 24))  # still serving
    after = served.metrics()
    assert wait_flushed(served.capture, time.time(), 0.0)
    counters = window_counters(before, after, model_name=served.model)
    acc = accepted_by_position(read_captured(served.capture, ids))
    # The rows held back by the failed write went out with the next one: nothing lost.
    assert acc == {p: int(n) for p, n in counters.accepted_per_pos.items() if n}
    assert os.path.isdir(served.capture)
