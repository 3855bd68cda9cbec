"""Faults injected for real into a REAL vLLM CPU server (the embedded tiny pair): the server
SIGKILLed during the last cell of a sweep, then avbench SIGKILLed while the next server starts.

Two server starts in all (the second is cut short): marked `vllm`."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from avbench.serving.server import (
    find_free_port,
    group_alive,
    group_members,
    port_is_free,
    probe_vllm,
)

pytestmark = pytest.mark.vllm

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)

ARM = "static-k1"
FIRST, LAST = (f"{ARM}__gsm8k-tiny__c{c}__rep0" for c in (1, 2))


def _posts(log: Path) -> int:
    return log.read_text(errors="replace").count('"POST /v1/') if log.exists() else 0


def _pgid(run: Path, other_than: int | None = None) -> int | None:
    f = run / "arms" / ARM / "server.pgid"
    pgid = int(f.read_text()) if f.exists() and f.read_text().strip() else None
    return pgid if pgid != other_than else None


def test_server_killed_in_the_last_cell_then_avbench_killed_during_start_up(tmp_path, wait_for):
    port = find_free_port()
    run = tmp_path / "r"
    cmd = [
        sys.executable, "-m", "avbench.cli", "sweep", "--pair", "tiny-cpu", "--arms", "static",
        "--k", "1", "--workloads", "gsm8k-tiny", "--concurrencies", "1,2", "--requests", "6",
        "--warmup", "0", "--max-tokens", "48", "--results", str(tmp_path), "--run-id", "r",
        "--port", str(port), "--no-report",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # 1. vLLM SIGKILLed (whole group) once two requests of the last cell have started.
        log = run / "arms" / ARM / "server.log"
        wait_for("the first cell", lambda: (run / "cells.jsonl").exists(), proc, 900)
        posts = _posts(log)
        # The first cell's 6 requests (a stale keep-alive connection may be retried once).
        assert posts >= 6, posts
        wait_for("the last cell's requests", lambda: _posts(log) >= posts + 2, proc, 300)
        pgid = _pgid(run)
        os.killpg(pgid, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "1 cells measured, 0 already done, 1 failed" in err
    assert f"--resume {run}" in err
    rows = [json.loads(x) for x in (run / "cells.jsonl").read_text().splitlines()]
    assert [r["cell_id"] for r in rows] == [FIRST] and rows[0]["requests_failed"] == 0
    (failure,) = [json.loads(x) for x in (run / "failures.jsonl").read_text().splitlines()]
    assert failure["cell_id"] == LAST and failure["failure_kind"] == "server_died"
    assert "died during the cell" in failure["reason"]
    assert "Uvicorn" in failure["log_tail"] or "INFO" in failure["log_tail"]
    partial = pd.read_parquet(run / failure["requests_file"])
    assert partial["error"].notna().any()  # what the dying server did to the cell, kept aside
    assert sorted(p.name for p in (run / "requests").glob("*.parquet")) == [f"{FIRST}.parquet"]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "finished_with_failures"
    assert manifest["counts"] | {"already_done": 0} == {
        "measured": 1, "failed": 1, "unsupported": 0, "already_done": 0,
    }  # fmt: skip
    assert not group_alive(pgid) and port_is_free(port)

    # 2. --resume reruns only the failed cell: avbench SIGKILLed while its vLLM starts.
    proc = subprocess.Popen(
        [sys.executable, "-m", "avbench.cli", "sweep", "--resume", str(run), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        new = wait_for("the new server", lambda: _pgid(run, other_than=pgid), proc, 300)
        # Up to the API server and its EngineCore (a grandchild of avbench).
        wait_for("vLLM's engine process", lambda: len(group_members(new)) >= 2, proc, 300)
    finally:
        proc.kill()  # SIGKILL: no handler runs in avbench
        proc.wait()
    deadline = time.monotonic() + 10
    while group_alive(new) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(new), f"vLLM group {new} outlived avbench: {group_members(new)}"
    assert port_is_free(port)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "running"  # resumable as it stands
    assert [json.loads(x)["cell_id"] for x in (run / "cells.jsonl").read_text().splitlines()] == [
        FIRST
    ]
