"""The answer loop on a REAL vLLM CPU server: static arms -> recommend -> a dyn arm built from
that recommendation -> the report of both runs. Three server starts (static-k1, static-k3, dyn).

The baseline is left out here to keep server starts down and because a schedule with K = 0
ranges cannot be checked from draft counters (the drain of a cell drafts at other batch sizes);
the verdict logic with a baseline is unit-tested in tests/analysis.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from avbench.inputs.schedule import check_dyn, k_at
from avbench.serving.server import find_free_port, probe_vllm
from avbench.store.run_store import RunStore

pytestmark = pytest.mark.vllm

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)


def avbench(*args: str, ok=(0,)) -> subprocess.CompletedProcess:
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=2400,
        check=False,
    )
    assert res.returncode in ok, res.stdout[-2000:] + res.stderr[-3000:]
    return res


def test_recommend_then_measure_the_schedule_as_a_dyn_arm(tmp_path):
    common = ["--pair", "tiny-cpu", "--sweep", "demo", "--workloads", "gsm8k-tiny",
              "--requests", "4", "--warmup", "1", "--max-tokens", "48", "--results", str(tmp_path),
              "--no-report"]  # fmt: skip
    avbench("sweep", *common, "--arms", "static", "--run-id", "static",
            "--port", str(find_free_port()))  # fmt: skip
    static = tmp_path / "static"
    rows = RunStore.open(static).finished_cells().values()
    assert {r["arm"] for r in rows} == {"static-k1", "static-k3"}
    # One drafting method for every arm, stored with each cell (no AV arm: vLLM's default).
    (method,) = {r["speculative_config"].get("draft_sample_method") for r in rows}

    (answer,) = json.loads(avbench("recommend", str(static), "--json").stdout)
    schedule = [tuple(e) for e in answer["schedule"]]
    assert {d["concurrency"] for d in answer["decisions"]} == {1, 4}
    for d in answer["decisions"]:
        assert d["verdict"] == "schedule" and k_at(schedule, d["concurrency"]) == d["schedule_k"]

    avbench("sweep", *common, "--schedule-from", str(static), "--run-id", "dyn",
            "--port", str(find_free_port()))  # fmt: skip
    (dyn_arm,) = RunStore.open(tmp_path / "dyn").read_manifest().arms
    assert dyn_arm.name == f"dyn-k{max(k for _, _, k in schedule)}"
    dyn_rows = list(RunStore.open(tmp_path / "dyn").finished_cells().values())
    assert len(dyn_rows) == 2
    for r in dyn_rows:
        cfg = r["speculative_config"]
        assert cfg["num_speculative_tokens_per_batch_size"] == [list(e) for e in schedule]
        assert cfg.get("draft_sample_method") == method  # carried over from the static run
    # What the server's counters say it drafted, against the schedule at each concurrency.
    checks = check_dyn(
        schedule, {r["concurrency"]: r["num_draft_tokens"] / r["num_drafts"] for r in dyn_rows}
    )
    assert all(c.matches for c in checks), checks

    out = tmp_path / "answer"
    res = avbench("report", str(static), str(tmp_path / "dyn"), "--out", str(out), "--no-figures")
    assert str(out / "report.html") in res.stdout
    md = (out / "report.md").read_text()
    assert f"{dyn_arm.name} is on the frontier at" in md
    assert "counters vs schedule" in md and "| NO |" not in md
    html = (out / "report.html").read_text()
    assert '"name":"best static K"' in html and f'"name":"{dyn_arm.name}"' in html
