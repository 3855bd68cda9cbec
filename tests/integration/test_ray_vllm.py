"""One real CPU vLLM arm end to end through Ray: `avbench sweep --ray local` starts a cluster on
this machine, the arm's session runs as a Ray task (no GPU asked: a cluster without GPUs, the
CPU build serving), its server launched by the task and its cells stored through the run's
store. One server start (~30-60 s on 2 cores): marked `vllm`."""

import json
import os
import subprocess
import sys

import pytest

from avbench.serving.server import find_free_port, probe_vllm
from avbench.store.artefacts import SweepManifest
from avbench.store.run_store import RunStore

pytestmark = pytest.mark.vllm
pytest.importorskip("ray")

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)


def test_a_real_cpu_vllm_arm_runs_as_a_ray_task(tmp_path):
    args = [
        "sweep", "--pair", "tiny-cpu", "--ray", "local", "--arms", "static", "--k", "3",
        "--workloads", "gsm8k-tiny", "--concurrencies", "1,2", "--requests", "4",
        "--warmup", "1", "--no-report", "--results", str(tmp_path), "--run-id", "ray",
        "--port", str(find_free_port()),
    ]  # fmt: skip
    env = os.environ | {"RAY_AUTH_MODE": "disabled"}  # a cluster of this test only
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", *args],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    store = RunStore.open(tmp_path / "ray")
    rows = store.finished_cells()
    assert sorted(rows) == ["static-k3__gsm8k-tiny__c1__rep0", "static-k3__gsm8k-tiny__c2__rep0"]
    for row in rows.values():  # measured by the real server: it drafted and accepted
        assert row["requests_ok"] >= 4 and row["output_tok_s"] > 0
        assert row["acceptance_length"] is not None and row["acceptance_length"] >= 1
    m = store.read_manifest()
    assert isinstance(m, SweepManifest) and m.status == "finished"
    (placement,) = m.placements
    assert placement.backend == "ray" and placement.gpus == [] and placement.ended_at
    log = (store.arm_dir("static-k3") / "server.log").read_text()
    assert "Application startup complete" in log or "Uvicorn running" in log, log[-2000:]
    assert json.loads(store.manifest_path.read_text())["placements"][0]["arm"] == "static-k3"
