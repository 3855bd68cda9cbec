"""A REAL vLLM CPU server (the embedded tiny pair) frozen mid-cell: its whole process group
SIGSTOPped. With the default timeouts the cell fails as "server stalled" within 60 s, the arm's
other cell at once, nothing outlives avbench, and --resume measures both on a fresh server.

Two server starts: marked `integration`."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from avbench.server import find_free_port, group_alive, port_is_free, probe_vllm

pytestmark = pytest.mark.integration

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)

ARM = "static-k1"
CELLS = [f"{ARM}__humaneval-tiny__c{c}__rep0" for c in (1, 2)]
DEFAULT_BOUND_S = 60  # the promise for the default stall timeout


def _wait(what: str, check, proc: subprocess.Popen, timeout: float):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if proc.poll() is not None:
            pytest.fail(f"avbench exited (code {proc.returncode}) before {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def test_a_frozen_vllm_fails_the_cell_fast_the_arm_at_once_and_resume_measures(tmp_path):
    port = find_free_port()
    run = tmp_path / "r"
    cmd = [
        sys.executable, "-m", "avbench.cli", "sweep", "--pair", "tiny-cpu", "--arms", "static",
        "--k", "1", "--workloads", "humaneval-tiny", "--concurrencies", "1,2", "--requests", "4",
        "--warmup", "0", "--max-tokens", "64", "--results", str(tmp_path), "--run-id", "r",
        "--port", str(port), "--no-report",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = run / "arms" / ARM / "server.log"
    pgid = None
    try:
        _wait("a request of the first cell", lambda: '"POST /v1/' in _text(log), proc, 900)
        pgid = int((run / "arms" / ARM / "server.pgid").read_text())
        os.killpg(pgid, signal.SIGSTOP)
        frozen = time.monotonic()
        failures = run / "failures.jsonl"
        _wait("the stalled cell", lambda: _lines(failures), proc, 2 * DEFAULT_BOUND_S)
        first_at = time.monotonic()
        _wait("the arm's other cell", lambda: len(_lines(failures)) == 2, proc, 30)
        second_at = time.monotonic()
        os.killpg(pgid, signal.SIGCONT)  # the test's part: avbench stops it either way
        out, err = proc.communicate(timeout=120)
    finally:
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
    assert first_at - frozen < DEFAULT_BOUND_S, first_at - frozen
    assert second_at - first_at < 2, second_at - first_at  # at once, not after another wait
    assert proc.returncode == 1, err[-3000:]
    assert "server stalled" in err and f"--resume {run}" in err
    first, second = _lines(run / "failures.jsonl")
    assert [first["cell_id"], second["cell_id"]] == CELLS
    assert {first["failure_kind"], second["failure_kind"]} == {"server_stalled"}
    assert first["reason"].startswith("server stalled: no progress on any of 1 in-flight")
    assert "GET /health: no answer within 5 s" in first["reason"]
    assert not (run / "cells.jsonl").exists() or not _lines(run / "cells.jsonl")
    assert not group_alive(pgid) and port_is_free(port)
    assert json.loads((run / "manifest.json").read_text())["status"] == "finished_with_failures"

    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "sweep", "--resume", str(run), "--port", str(port),
         "--no-report"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "2 cells measured, 0 already done, 0 failed" in res.stderr
    assert sorted(r["cell_id"] for r in _lines(run / "cells.jsonl")) == CELLS
    assert json.loads((run / "manifest.json").read_text())["status"] == "finished"
    assert port_is_free(port)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
