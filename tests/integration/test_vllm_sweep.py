"""End to end against a REAL vLLM CPU server serving the embedded tiny pair.

Slow (each server start is ~30-60 s on 2 cores): marked `vllm`.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from avbench.inputs.suite import load_suite
from avbench.metrics.prometheus import window_counters
from avbench.plan.cells import Arm
from avbench.serving.server import (
    Launch,
    ServerProcess,
    arm_server,
    find_free_port,
    group_alive,
    port_is_free,
    probe_vllm,
)
from avbench.store.run_store import RunStore
from avbench.testing.cli import default_sigint

pytestmark = pytest.mark.vllm

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)


def avbench_cmd(*args):
    return [sys.executable, "-m", "avbench.cli", *args]


def run_avbench(*args, env=None, timeout=900):
    res = subprocess.run(
        avbench_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | (env or {}),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def grep_run(run: Path, secret: str) -> list[Path]:
    return [p for p in run.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def serve(pair_name: str, arm: Arm, tmp_path: Path) -> ServerProcess:
    pair = load_suite().pair(pair_name)
    launch = Launch(find_free_port(), tmp_path / "server" / "server.log", ready_timeout_s=400)
    return arm_server(pair, arm, launch)


def attach_sweep(url, results, run_id, workload, concurrencies, requests, key):
    """`avbench sweep --endpoint` on the shared tiny static-k3 server, no warmup."""
    run_avbench(
        "sweep", "--pair", "tiny-cpu", "--endpoint", url, "--arm", "static-k3",
        "--workloads", workload, "--concurrencies", concurrencies, "--warmup", "0",
        "--requests", str(requests), "--results", str(results), "--run-id", run_id,
        "--no-report", "--temperature", "0",  # greedy: the pair's default sweep samples at temperature 1
        env={"OPENAI_API_KEY": key},
    )  # fmt: skip


def accept_pos(row: dict) -> list[float]:
    return [row[f"accept_pos_{i}"] for i in range(8) if row.get(f"accept_pos_{i}") is not None]


def test_two_cells_agree_with_the_servers_own_counters(tiny_k3_server, tmp_path):
    key, served = tiny_k3_server.API_KEY, tiny_k3_server
    url, headers = served.url, served.headers
    before = httpx.get(f"{url}/metrics", headers=headers).text
    attach_sweep(url, tmp_path, "r", "gsm8k-tiny", "1,4", 8, key)
    after = httpx.get(f"{url}/metrics", headers=headers).text
    # MT-Bench on the same server: turn 2 must carry the model's real turn-1 answer.
    attach_sweep(url, tmp_path, "mt", "mt-bench-tiny", "2", 3, key)
    mt = RunStore.open(tmp_path / "mt").records_frame()
    assert len(mt) == 6 and set(mt["turn"]) == {0, 1}
    for _, turns in mt.groupby("conversation_id"):
        first, second = turns.sort_values("turn").itertuples()
        sent = json.loads(second.prompt_messages)
        assert [m["role"] for m in sent] == ["user", "assistant", "user"]
        assert sent[1]["content"] == first.output_text and len(first.output_text) > 0
        assert (
            first.output_text in second.prompt_messages or first.output_text in sent[1]["content"]
        )
    total = window_counters(before, after, model_name="tiny-target")
    store = RunStore.open(tmp_path / "r")
    rows = list(store.finished_cells().values())
    assert len(rows) == 2
    # No warmup and nothing else on the server meanwhile: the two windows add up to its total.
    assert sum(r["num_drafts"] for r in rows) == total.drafts > 0
    assert sum(r["num_draft_tokens"] for r in rows) == total.draft_tokens == 3 * total.drafts
    assert sum(r["num_accepted"] for r in rows) == total.accepted
    for i in range(3):
        per_pos = sum(r[f"accept_pos_{i}"] * r["num_drafts"] for r in rows)
        assert per_pos == pytest.approx(total.accepted_per_pos[i])
    assert sum(r["output_tokens"] for r in rows) == total.generation_tokens
    # Both cells send the same prompts, and other tests sent them to this server before: each
    # cell starts on an emptied prefix cache (most of a warm cell's prompt tokens are cached).
    for r in rows:
        assert r["prefix_cache_reset"] is True
        assert r["prefix_cache_hit_share"] < 0.3, r["prefix_cache_hit_share"]
    # Greedy on a real pair: a decaying profile, position 0 between 0.2 and 0.9.
    for r in rows:
        pos = accept_pos(r)
        assert len(pos) == 3
        assert 0.2 <= pos[0] <= 0.9, pos
        # Falls with position (greedy is near-deterministic; allow a hair of batch noise).
        assert pos[0] > pos[1] >= pos[2] - 0.02 and pos[0] > pos[2], pos
        assert r["acceptance_length"] == pytest.approx(1 + r["num_accepted"] / r["num_drafts"])
    assert grep_run(store.root, key) == []


def test_self_drafting_accepts_everything_greedy_and_temp1_is_reported(tmp_path):
    with serve("tiny-cpu-self", Arm("static", 3), tmp_path) as server:
        server.wait_ready()
        common = [
            "--pair",
            "tiny-cpu-self",
            "--endpoint",
            server.base_url,
            "--arm",
            "static-k3",
            "--workloads",
            "gsm8k-tiny",
            "--concurrencies",
            "4",
            "--requests",
            "8",
            "--warmup",
            "1",
            "--results",
            str(tmp_path),
            "--no-report",
        ]
        run_avbench("sweep", *common, "--run-id", "greedy", "--temperature", "0")
        run_avbench(
            "sweep", *common, "--run-id", "temp1", "--temperature", "1.0", "--top-p", "0.95"
        )
    (greedy,) = RunStore.open(tmp_path / "greedy").finished_cells().values()
    assert all(p > 0.95 for p in accept_pos(greedy)), accept_pos(greedy)
    (temp1,) = RunStore.open(tmp_path / "temp1").finished_cells().values()
    # Whatever the CPU build does at temperature 1, every position is reported, not hidden.
    assert len(accept_pos(temp1)) == 3 and temp1["temperature"] == 1.0
    assert temp1["num_drafts"] > 0


def test_ctrl_c_mid_cell_leaves_no_server_and_resume_finishes(tmp_path):
    key = "sk-integration-managed-77c"
    port = find_free_port()
    args = [
        "sweep",
        "--pair",
        "tiny-cpu",
        "--arms",
        "baseline",
        "--workloads",
        "gsm8k-tiny",
        "--concurrencies",
        "1,4",
        "--requests",
        "6",
        "--warmup",
        "1",
        "--max-tokens",
        "96",
        "--results",
        str(tmp_path),
        "--run-id",
        "r",
        "--port",
        str(port),
        "--no-report",
    ]
    proc = subprocess.Popen(
        avbench_cmd(*args, "--api-key", key),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    run = tmp_path / "r"
    cells = run / "cells.jsonl"
    deadline = time.monotonic() + 600
    while not (cells.exists() and cells.read_text().count("\n") >= 1):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "first cell never finished"
        time.sleep(0.2)
    time.sleep(0.5)  # the second cell is now in flight
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    pgid = int((run / "arms" / "baseline" / "server.pid").read_text())
    assert not group_alive(pgid), "vLLM process group survived Ctrl-C"
    assert port_is_free(port)
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"
    first = json.loads(cells.read_text().splitlines()[0])["cell_id"]
    store = RunStore.open(run)
    mtime = store.requests_path(first).stat().st_mtime_ns

    res = run_avbench("sweep", "--resume", str(run), "--port", str(port), "--api-key", key)
    rows = [json.loads(x)["cell_id"] for x in cells.read_text().splitlines()]
    assert len(rows) == 2 and len(set(rows)) == 2 and rows[0] == first
    assert store.requests_path(first).stat().st_mtime_ns == mtime  # not repeated
    assert "1 already done" in res.stderr
    assert json.loads((run / "manifest.json").read_text())["status"] == "finished"
    assert grep_run(run, key) == []
