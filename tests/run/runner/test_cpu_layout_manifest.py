"""A pair with ``engine_cpus`` runs its server pinned, and the arm's manifest entry says where:
the engine's CPUs, the rest, and how many engine processes were pinned (none here: the server
is avbench's scripted streaming server standing in for vLLM, with no engine core or worker)."""

import os
import sys

import pytest

from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm
from avbench.run.arm_session import SweepOutcome, SweepRun
from avbench.run.cell_run import CellSettings
from avbench.run.progress import SweepReporter
from avbench.run.runner import SweepOptions, _start
from avbench.serving.cpu_layout import release
from avbench.serving.server import ServerProcess, find_free_port
from avbench.store.cellrow import ProvenancePart
from avbench.store.run_store import RunStore

ALLOWED = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs")
def test_the_pinned_layout_is_in_the_arms_manifest_entry(tmp_path):
    suite = load_suite()
    pair = suite.pair("tiny-cpu").model_copy(update={"engine_cpus": [ALLOWED[-1]]})
    manifest = {"run_id": "r", "mode": "managed", "pair": pair.model_dump(mode="json"),
                "arms": [{"name": "static-k3", "kind": "static", "k": 3}]}  # fmt: skip
    store = RunStore.create(tmp_path, "r", manifest)
    settings = CellSettings(pair, suite.sweep("demo"), suite.workloads, api_key=None,
                            attached=False, gpus=1)  # fmt: skip
    run = SweepRun(store, settings, workloads=None, reporter=SweepReporter(),
                   outcome=SweepOutcome(store), secrets=[],
                   provenance=ProvenancePart(None, None, None, None, None))  # fmt: skip
    port = find_free_port()
    server = ServerProcess(
        cmd=[sys.executable, "-m", "avbench.testing.fake_server", "--port", str(port)],
        env={}, port=port, log_path=tmp_path / "server.log", ready_timeout_s=60,
    )  # fmt: skip
    opts = SweepOptions(pair=pair, sweep=suite.sweep("demo"), workloads=suite.workloads)
    own = os.sched_getaffinity(0)
    try:
        assert _start(server, run, opts, Arm("static", 3)) is None
    finally:
        server.stop()
        release()
        os.sched_setaffinity(0, own)
    entry = store.read_manifest().arm("static-k3")
    assert entry.cpu_layout is not None
    assert entry.cpu_layout.engine_cpus == [ALLOWED[-1]]
    assert entry.cpu_layout.rest_cpus == ALLOWED[:-1]
    assert entry.cpu_layout.engine_processes == 0
