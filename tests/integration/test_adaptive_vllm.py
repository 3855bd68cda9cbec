"""`avbench sweep --adaptive` on a REAL vLLM CPU server (the embedded tiny pair): the max-K arm's
server SIGKILLed while it starts stops the sweep with its reason and keeps the baseline's cell;
`--resume` measures the max-K arm, predicts K = 1 from it and goes on until the verdict is
decided or the cell budget is spent; `--complete` then measures K = 1, the one cell of the sweep
the rounds left out (its server killed at start once: `--resume` goes on with the completion),
and takes the verdict with every cell measured. Five server starts: marked `vllm`."""

import json
import os
import signal
import subprocess
import sys

import pytest

from avbench.serving.server import find_free_port, group_alive, port_is_free, probe_vllm

pytestmark = pytest.mark.vllm

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)

BASE, MAXK, K1 = (f"{arm}__gsm8k-tiny__c1__rep0" for arm in ("baseline", "static-k3", "static-k1"))


def _rows(run):
    return {
        r["cell_id"]: r for r in map(json.loads, (run / "cells.jsonl").read_text().splitlines())
    }


def _kill_at_start(cmd, server, wait_for):
    """Run ``cmd`` and SIGKILL the server it launches at ``server`` (its arm directory) as soon
    as its process group exists; the command's exit status, stderr and that group."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pgid_file = server / "server.pgid"
        wait_for(
            f"{server.name}'s server",
            lambda: pgid_file.exists() and pgid_file.read_text(),
            proc,
            600,
        )
        pgid = int(pgid_file.read_text())
        os.killpg(pgid, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err, pgid


def test_a_failed_max_k_arm_stops_it_and_resume_continues(tmp_path, wait_for):
    port, run = find_free_port(), tmp_path / "a"
    cmd = [
        sys.executable, "-m", "avbench.cli", "sweep", "--pair", "tiny-cpu", "--sweep", "demo",
        "--arms", "baseline,static", "--adaptive", "--budget-cells", "2", "--k", "1,3",
        "--workloads", "gsm8k-tiny", "--concurrencies", "1", "--requests", "4", "--warmup", "1",
        "--max-tokens", "32", "--results", str(tmp_path), "--run-id", "a", "--port", str(port),
        "--no-report",
    ]  # fmt: skip
    code, err, pgid = _kill_at_start(cmd, run / "arms" / "static-k3", wait_for)
    assert code == 1, err[-3000:]
    assert "adaptive sweep stopped" in err and "static-k3" in err and "--resume" in err
    assert list(_rows(run)) == [BASE]
    assert json.loads((run / "adaptive.json").read_text())["status"] == "failed"
    assert not group_alive(pgid) and port_is_free(port)
    baseline = _rows(run)[BASE]

    resumed = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "sweep", "--resume", str(run), "--port", str(port),
         "--no-report"],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = _rows(run)
    assert rows[BASE] == baseline and MAXK in rows  # measured once, then the max-K arm
    state = json.loads((run / "adaptive.json").read_text())
    assert state["status"] in ("decided", "inside noise", "budget")
    assert sum(len(r.get("cells", [])) for r in state["rounds"]) == 2  # K = 1 is over budget
    (last,) = state["rounds"][-1]["standings"]
    assert last["concurrency"] == 1 and last["winner"] in ("baseline", "static-k1", "static-k3")
    predicted = {json.loads(x)["arm"] for x in (run / "predicted.jsonl").read_text().splitlines()}
    assert predicted == {"static-k1"}
    # The verdict table and the closing line go where the sweep's progress goes (stderr).
    assert "c=1" in resumed.stderr and last["verdict"] in resumed.stderr
    assert f"{run}: {state['status']}" in resumed.stderr

    # The completion's one server killed as it starts: the cell failed, said, nothing ended;
    # a plain --resume then goes on with the completion.
    resume = [sys.executable, "-m", "avbench.cli", "sweep", "--resume", str(run), "--port",
              str(port), "--no-report"]  # fmt: skip
    code, err, pgid = _kill_at_start([*resume, "--complete"], run / "arms" / "static-k1", wait_for)
    assert code == 1 and f"--complete: 1 cell(s) failed ({K1}: " in err, err[-3000:]
    stopped = json.loads((run / "adaptive.json").read_text())["completion"]
    assert stopped["cells"] == [K1] and stopped["standings"] == [] and K1 not in _rows(run)
    assert not group_alive(pgid) and port_is_free(port)
    completed = subprocess.run(resume, capture_output=True, text=True, timeout=1200)
    assert completed.returncode == 0, completed.stderr[-3000:]
    after = json.loads((run / "adaptive.json").read_text())
    assert (after["rounds"], after["status"]) == (state["rounds"], state["status"])
    assert after["completion"]["cells"] == [K1] and after["completion"]["seconds"] > 0
    rows = _rows(run)
    assert sorted(rows) == sorted([BASE, MAXK, K1]) and rows[BASE] == baseline
    (full,) = after["completion"]["standings"]
    assert full["concurrency"] == 1 and not full["rests_on_prediction"] and not full["predicted"]
    assert full["state"] in ("decided", "inside noise")  # the sweep's one repeat, all measured
    assert "completed: 1 more cells" in completed.stderr
