"""A REAL vLLM CPU server (the embedded tiny pair at K=1) frozen mid-cell: the test SIGSTOPs its
whole process group while avbench measures it. With the default timeouts the cell fails as
"server stalled" within 60 s and the arm's other cell at once; the test then SIGCONTs the
server, and --resume measures both cells on it once it is healthy again.

avbench is attached (the test owns the server, so it can freeze and continue it): one server
start, marked `vllm`."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from avbench.serving.server import probe_vllm
from avbench.testing.tiny_server import tiny_capture_server

pytestmark = pytest.mark.vllm

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)

CELLS = [f"static-k1__humaneval-tiny__c{c}__rep0" for c in (1, 2)]
DEFAULT_BOUND_S = 60  # the promise for the default stall timeout


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _sweep(*args: str) -> list[str]:
    return [sys.executable, "-m", "avbench.cli", "sweep", *args, "--no-report"]


def test_a_frozen_vllm_fails_the_cell_fast_the_arm_at_once_and_resume_measures(tmp_path, wait_for):
    server, _ = tiny_capture_server(1, None, tmp_path / "server.log", ready_timeout_s=600)
    run = tmp_path / "r"
    with server:
        server.wait_ready()
        proc = subprocess.Popen(
            _sweep(
                "--pair", "tiny-cpu", "--endpoint", server.base_url, "--arm", "static-k1",
                "--workloads", "humaneval-tiny", "--concurrencies", "1,2", "--requests", "4",
                "--warmup", "0", "--max-tokens", "64", "--results", str(tmp_path),
                "--run-id", "r",
            ),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            posts = lambda: _text(server.log_path).count('"POST /v1/')  # noqa: E731
            wait_for("a request of the first cell", posts, proc, 300)
            os.killpg(server.pgid, signal.SIGSTOP)
            frozen = time.monotonic()
            failures = run / "failures.jsonl"
            wait_for("the stalled cell", lambda: _lines(failures), proc, 2 * DEFAULT_BOUND_S)
            first_at = time.monotonic()
            wait_for("the arm's other cell", lambda: len(_lines(failures)) == 2, proc, 30)
            second_at = time.monotonic()
            out, err = proc.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pgid, signal.SIGCONT)  # the test's part: the server is its own
            if proc.poll() is None:
                proc.kill()
        assert first_at - frozen < DEFAULT_BOUND_S, first_at - frozen
        assert second_at - first_at < 2, second_at - first_at  # at once, not after another wait
        assert proc.returncode == 1, err[-3000:]
        assert "server stalled" in err and f"--resume {run}" in err
        first, second = _lines(failures)
        assert [first["cell_id"], second["cell_id"]] == CELLS
        assert {first["failure_kind"], second["failure_kind"]} == {"server_stalled"}
        assert first["reason"].startswith("server stalled: no progress on any of 1 in-flight")
        assert "GET /health: no answer within 5 s" in first["reason"]
        assert not _lines(run / "cells.jsonl")
        assert json.loads((run / "manifest.json").read_text())["status"] == "finished_with_failures"
        assert server.alive(), "an attached server is the user's: avbench never stops it"

        server.wait_ready()  # continued: healthy again
        res = subprocess.run(
            _sweep("--resume", str(run)), capture_output=True, text=True, timeout=600
        )
        assert res.returncode == 0, res.stderr[-3000:]
        assert "2 cells measured, 0 already done, 0 failed" in res.stderr
        assert sorted(r["cell_id"] for r in _lines(run / "cells.jsonl")) == CELLS
        assert json.loads((run / "manifest.json").read_text())["status"] == "finished"
