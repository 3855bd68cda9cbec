"""Open-loop loads from the command line (`--rates`), measured against the fake streaming server
(``avbench.testing.fake_server`` in its own process, standing in for vLLM: what is under test is
avbench's load driver, store and report), reported alone, beside a closed-loop run, and merged
with it. The avbench commands run in this process (run_cli)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from avbench.store.run_store import RunStore
from avbench.testing.cli import run_cli
from avbench.testing.report_page import figures_of, trace_labels

CLI = [sys.executable, "-m", "avbench.cli"]


# The fake server's chunks 20 ms apart: 1 ms apart, a client held off the CPU (the machine busy
# with other tests) reads a whole stream at once, the cell has no TPOT and the page rightly draws
# no point for it, which is not what these tests are about.
FAKE_INTER_CHUNK_MS = 20


def _sweep(endpoint: str, results: Path, run_id: str, *load: str) -> subprocess.CompletedProcess:
    return run_cli(
        "sweep", "--endpoint", endpoint, "--workload", "synthetic", "--input-len", "16",
        "--output-len", "24", *load, "--requests", "12", "--warmup", "2",
        "--results", str(results), "--run-id", run_id,
    )  # fmt: skip


def _loads_drawn(html: Path) -> set[str]:
    figs = figures_of(html.read_text())
    pareto = trace_labels(figs["fig-pareto-attached-synthetic"])
    boxes = trace_labels(figs["fig-latency-attached-synthetic"])
    return {x for x in pareto if x.startswith(("c=", "r="))} & {
        b.split(" ", 1)[1] for b in boxes if " " in b
    }


@pytest.mark.slow
def test_rates_run_reports_alone_beside_a_concurrency_run_and_merged(fake_server, tmp_path):
    results = tmp_path / "results"
    res = _sweep(fake_server, results, "open", "--rates", "20,40")
    assert res.returncode == 0, res.stderr[-2000:]
    store = RunStore.open(results / "open")
    rows = store.finished_cells().values()
    assert {(r["rate"], r["concurrency"]) for r in rows} == {(20.0, None), (40.0, None)}
    assert all(r["requests_ok"] == r["num_requests"] >= 12 for r in rows)
    # The sweep wrote the report at its end; it draws both rates.
    assert _loads_drawn(results / "open" / "report.html") == {"r=20/s", "r=40/s"}

    res = _sweep(fake_server, results, "closed", "--concurrencies", "1,2", "--no-report")
    assert res.returncode == 0, res.stderr[-2000:]
    both = {"r=20/s", "r=40/s", "c=1", "c=2"}
    open_run, closed_run = str(results / "open"), str(results / "closed")
    mixed, merged = tmp_path / "mixed", tmp_path / "merged"
    res = run_cli("report", open_run, closed_run, "--out", str(mixed), "--no-figures")
    assert res.returncode == 0, res.stderr
    assert _loads_drawn(mixed / "report.html") == both

    res = run_cli("merge", open_run, closed_run, "--out", str(merged))
    assert res.returncode == 0, res.stderr
    res = run_cli("report", str(merged), "--no-figures")
    assert res.returncode == 0, res.stderr
    assert _loads_drawn(merged / "report.html") == both
    for command in (("recommend", open_run), ("compare", open_run, open_run)):
        res = run_cli(*command)
        assert res.returncode == 0, (command, res.stderr)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--rates", "2", "--concurrencies", "1"], "--rates and --concurrencies: give one"),
        (["--rates", "0"], "positive, finite requests per second"),
        (["--rates", "nan"], "positive, finite requests per second"),
        (["--rates", "2,x"], "positive, finite requests per second"),
    ],
)
def test_bad_rates_are_one_line_before_any_request(tmp_path, args, expected):
    # No server at this endpoint: the options are refused before anything is sent.
    res = run_cli(
        "sweep", "--endpoint", "http://127.0.0.1:9", "--workload", "synthetic", *args,
        "--results", str(tmp_path / "results"),
    )  # fmt: skip
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert expected in res.stderr
    assert not (tmp_path / "results").exists()
