"""Arms side by side on one host's GPUs (``--gpus``): each server with its own
CUDA_VISIBLE_DEVICES, port and capture dir, each arm's load driver in its own process, the
placements in the manifest. The project's fake streaming server stands in for vLLM
(``avbench.testing.fake_vllm``): what is under test is the scheduling; the GPUs are ids only."""

import json
import subprocess
import sys
import threading
import time
from itertools import combinations

import pytest
from vllm_servers import descendants

from avbench.plan.gpus import GpuSet
from avbench.report import write_report
from avbench.run.runner import resume_sweep, start_sweep
from avbench.serving.server import find_free_port, proc_stat
from avbench.store.artefacts import SweepManifest
from avbench.testing.cli import run_cli
from avbench.testing.fake_server import ServerConfig
from avbench.testing.fake_vllm import (
    gpus_given,
    interpreter,
    kill_launcher_mid_arm,
    server_pid,
    sweep_options,
)

ARMS = ["baseline", "static-k1", "static-k3"]


@pytest.fixture(scope="module")
def vllm_python(tmp_path_factory):
    # Each cell takes a few tenths of a second: sessions side by side overlap for sure.
    cfg = ServerConfig(tokens_per_chunk=2, output_tokens=12, inter_chunk_delay_s=0.02)
    return str(interpreter(tmp_path_factory.mktemp("fake-vllm"), cfg))


@pytest.fixture(scope="module")
def wide(tmp_path_factory, vllm_python):
    results = tmp_path_factory.mktemp("results")
    return start_sweep(sweep_options(results, vllm_python, "wide", gpus=GpuSet.parse("0-3")))


def _manifest(out) -> SweepManifest:
    m = out.store.read_manifest()
    assert isinstance(m, SweepManifest)
    return m


@pytest.mark.slow
def test_three_arms_on_four_gpus_run_at_once_each_on_its_own_gpu(wide):
    out = wide
    assert not out.failed and len(out.finished) == 6
    m = _manifest(out)
    store = out.store
    by_arm = {p.arm: p for p in m.placements}
    assert sorted(by_arm) == sorted(ARMS) and len(m.placements) == 3
    assert [by_arm[a].gpus for a in ARMS] == [[0], [1], [2]]
    assert all(p.backend == "process" and p.ended_at for p in m.placements)
    for a in ARMS:  # the server was given exactly its GPU, and listened on its own port
        assert gpus_given(store.arm_dir(a) / "server.log") == str(by_arm[a].gpus[0])
    for a, b in combinations(m.placements, 2):  # they did run at the same time
        assert a.overlaps(b), (a, b)
    co = m.co_tenants()
    assert set(co) == set(store.finished_cells())
    for cell_id, others in co.items():
        arm = cell_id.split("__")[0]
        assert others == sorted(set(ARMS) - {arm})
    assert m.status == "finished" and m.counts is not None and m.counts.measured == 6


@pytest.mark.slow
def test_one_gpu_is_the_sequential_sweep_with_the_same_cells_and_no_co_tenant(
    tmp_path, vllm_python, wide
):
    one = start_sweep(sweep_options(tmp_path, vllm_python, "one", gpus=GpuSet.parse("2")))
    assert set(one.store.finished_cells()) == set(wide.store.finished_cells())
    m = _manifest(one)
    assert [p.arm for p in m.placements] == ARMS  # in plan order, one after the other
    assert all(p.backend == "local" and p.gpus == [2] for p in m.placements)
    assert not any(a.overlaps(b) for a, b in combinations(m.placements, 2))
    assert all(others == [] for others in m.co_tenants().values())
    assert gpus_given(one.store.arm_dir("static-k1") / "server.log") == "2"
    # Each launched server's prefix cache was emptied before each of its cells (its route).
    assert all(r["prefix_cache_reset"] is True for r in one.store.finished_cells().values())
    assert all(r["prefix_cache_reset"] is True for r in wide.store.finished_cells().values())


@pytest.mark.slow
def test_an_isolated_arm_runs_alone(tmp_path, vllm_python):
    gpus = GpuSet.parse("0-3")
    out = start_sweep(sweep_options(tmp_path, vllm_python, "iso", gpus=gpus, isolate=["static-k3"]))
    assert not out.failed
    m = _manifest(out)
    by_arm = {p.arm: p for p in m.placements}
    assert by_arm["baseline"].overlaps(by_arm["static-k1"])
    assert not any(by_arm["static-k3"].overlaps(by_arm[a]) for a in ARMS[:2])
    co = m.co_tenants()
    assert co["static-k3__gsm8k-tiny__c1__rep0"] == []
    assert co["baseline__gsm8k-tiny__c2__rep0"] == ["static-k1"]


@pytest.mark.slow
def test_compare_checks_the_co_tenant_cells_against_their_isolated_repeat(
    tmp_path, vllm_python, wide
):
    alone = start_sweep(sweep_options(tmp_path, vllm_python, "alone", gpus=GpuSet.parse("0")))
    got = run_cli("compare", str(alone.store.root), str(wide.store.root))
    assert got.returncode in (0, 1), got.stderr  # compared (a fake server's noise may differ)
    assert "Co-tenant cells in wide (6, measured beside other arms" in got.stdout
    assert "static-k1__gsm8k-tiny__c2__rep0" in got.stdout.split("Co-tenant cells in wide")[1]
    assert "Co-tenant cells in alone" not in got.stdout
    md = write_report([wide.store.root], static_figures=False).markdown.read_text()
    assert "## Co-tenant cells" in md and "| wide | baseline__gsm8k-tiny__c1__rep0 |" in md


@pytest.mark.slow
def test_an_arm_process_killed_mid_arm_loses_nothing_stored_and_resume_finishes_it(tmp_path):
    cfg = ServerConfig(tokens_per_chunk=2, output_tokens=12, inter_chunk_delay_s=0.03)
    fake = str(interpreter(tmp_path, cfg))
    gpus = GpuSet.parse("0-2")
    opts = sweep_options(tmp_path, fake, "kill", (1, 2, 3, 4), gpus=gpus)
    box: dict = {}
    sweep = threading.Thread(target=lambda: box.update(out=start_sweep(opts)))
    sweep.start()
    killed = kill_launcher_mid_arm(tmp_path / "kill", fake, 3, sweep.is_alive)
    sweep.join(300)
    assert killed is not None, "static-k3 never got past its first cell"
    out = box["out"]
    stored = out.store.finished_cells()
    lost = {f["cell_id"] for f in out.failed}
    assert lost and all(c.startswith("static-k3__") for c in lost)
    assert {f["failure_kind"] for f in out.failed} == {"arm_lost"}
    assert not lost & set(stored) and len(stored) + len(lost) == 12  # each cell one or other
    assert len([c for c in stored if c.startswith("static-k3")]) >= 1  # kept what it stored
    deadline = time.monotonic() + 30  # its watchdog takes the server with it
    while server_pid(fake, 3) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_pid(fake, 3) is None
    again = resume_sweep(out.store.root, {"vllm_python": fake, "port": find_free_port()})
    assert {r["cell_id"] for r in again.finished} == lost and again.skipped == 12 - len(lost)
    lines = (out.store.root / "cells.jsonl").read_text().splitlines()
    ids = [json.loads(line)["cell_id"] for line in lines if line.strip()]
    assert len(ids) == len(set(ids)) == 12


_SWEEP = """
import sys
from pathlib import Path
from avbench.plan.gpus import GpuSet
from avbench.run.runner import start_sweep
from avbench.testing.fake_vllm import sweep_options
opts = sweep_options(Path(sys.argv[1]), sys.argv[2], "orphans", (1, 2, 3, 4), gpus=GpuSet.parse("0-2"))
start_sweep(opts)
"""


@pytest.mark.slow
def test_avbench_killed_mid_wave_takes_every_arm_and_server_with_it(tmp_path):
    cfg = ServerConfig(tokens_per_chunk=2, output_tokens=12, inter_chunk_delay_s=0.03)
    fake = str(interpreter(tmp_path, cfg))
    sweep = subprocess.Popen([sys.executable, "-c", _SWEEP, str(tmp_path), fake])
    cells = tmp_path / "orphans" / "cells.jsonl"
    deadline = time.monotonic() + 240
    while not (
        cells.exists() and cells.read_text() and server_pid(fake, 1) and server_pid(fake, 3)
    ):
        assert sweep.poll() is None and time.monotonic() < deadline, "no wave got going"
        time.sleep(0.1)
    below = descendants(sweep.pid)  # the arms' processes and their servers
    assert {server_pid(fake, 1), server_pid(fake, 3)} <= below
    sweep.kill()
    sweep.wait()
    deadline = time.monotonic() + 30
    # One read per process: it may be reaped between two.
    while any((stat := proc_stat(p)) is not None and stat[0] != "Z" for p in below):
        assert time.monotonic() < deadline, "an arm or its server outlived avbench"
        time.sleep(0.2)
    stored = cells.read_text()
    time.sleep(1)
    assert cells.read_text() == stored  # nobody writes into the run any more
    again = resume_sweep(tmp_path / "orphans", {"vllm_python": fake, "port": find_free_port()})
    lines = cells.read_text().splitlines()
    ids = [json.loads(line)["cell_id"] for line in lines if line.strip()]
    assert len(ids) == len(set(ids)) == 12 and not again.failed
