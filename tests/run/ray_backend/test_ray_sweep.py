"""A sweep through a local Ray cluster that this module starts, with logical GPUs (Ray sets
each task's CUDA_VISIBLE_DEVICES from them): the same cells, run directory layout and report
as the sequential run; a task's worker SIGKILLed mid-arm is re-run from what was stored. The
project's fake streaming server stands in for vLLM (``avbench.testing.fake_vllm``): what is
under test is the scheduling."""

import json
import threading
from pathlib import Path

import pytest

from avbench.errors import AvbenchError
from avbench.plan.gpus import GpuSet
from avbench.report import write_report
from avbench.run.runner import resume_sweep, start_sweep
from avbench.serving.server import find_free_port
from avbench.store.artefacts import SweepManifest
from avbench.testing.fake_server import ServerConfig
from avbench.testing.fake_vllm import (
    gpus_given,
    interpreter,
    kill_launcher_mid_arm,
    server_pid,
    sweep_options,
)

ray = pytest.importorskip("ray")
from avbench.run.ray_backend import RayBackend  # noqa: E402

ARMS = ["baseline", "static-k1", "static-k3"]


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module: 4 CPUs (3 arms' load drivers and the queue), 4
    logical GPUs."""
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "disabled")  # a cluster of this test only: no token to keep
    ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False)
    yield RayBackend.connect("local")
    ray.shutdown()
    mp.undo()


def _layout(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _headings(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("#")]


@pytest.mark.slow
def test_a_ray_sweep_has_the_sequential_runs_cells_layout_and_report(tmp_path, cluster):
    fake = str(interpreter(tmp_path, ServerConfig(output_tokens=12, inter_chunk_delay_s=0.01)))
    ray_run = start_sweep(sweep_options(tmp_path, fake, "ray"), backend=cluster)
    seq = start_sweep(sweep_options(tmp_path, fake, "seq", gpus=GpuSet.parse("0")))
    assert not ray_run.failed and not seq.failed
    assert set(ray_run.store.finished_cells()) == set(seq.store.finished_cells())
    assert len(ray_run.store.finished_cells()) == 6
    assert _layout(ray_run.store.root) == _layout(seq.store.root)
    m = ray_run.store.read_manifest()
    assert isinstance(m, SweepManifest)
    assert sorted(p.arm for p in m.placements) == sorted(ARMS)
    assert all(p.backend == "ray" and len(p.gpus) == 1 for p in m.placements)
    assert len({p.gpus[0] for p in m.placements}) == 3  # Ray gave each its own GPU
    for p in m.placements:  # ... and the server was given that one
        assert gpus_given(ray_run.store.arm_dir(p.arm) / "server.log") == str(p.gpus[0])
    md_ray = write_report([ray_run.store.root], static_figures=False).markdown.read_text()
    md_seq = write_report([seq.store.root], static_figures=False).markdown.read_text()
    # The same page, but for the flag on the cells measured beside other arms.
    assert [h for h in _headings(md_ray) if h != "## Co-tenant cells"] == _headings(md_seq)
    for cell in seq.store.finished_cells():
        assert cell in md_ray


@pytest.mark.slow
def test_a_task_worker_killed_mid_arm_is_re_run_from_what_was_stored(tmp_path, cluster):
    fake = str(interpreter(tmp_path, ServerConfig(output_tokens=12, inter_chunk_delay_s=0.03)))
    opts = sweep_options(tmp_path, fake, "kill", (1, 2, 3, 4))
    box: dict = {}
    sweep = threading.Thread(target=lambda: box.update(out=start_sweep(opts, backend=cluster)))
    sweep.start()
    killed = kill_launcher_mid_arm(tmp_path / "kill", fake, 3, sweep.is_alive)  # the Ray worker
    sweep.join(300)
    assert killed is not None, "static-k3 never got past its first cell"
    out = box["out"]
    lines = (out.store.root / "cells.jsonl").read_text().splitlines()
    ids = [json.loads(line)["cell_id"] for line in lines if line.strip()]
    assert len(ids) == len(set(ids)) == 12  # every cell once: none lost, none twice
    assert not out.failed
    assert server_pid(fake, 3) is None  # the killed worker's server went with it
    m = out.store.read_manifest()
    assert isinstance(m, SweepManifest)
    k3 = [p for p in m.placements if p.arm == "static-k3"]
    assert len(k3) == 2 and all(p.ended_at for p in k3)  # the lost try and the re-run
    assert len(k3[1].cells) < 4  # the re-run measured only what the lost try had not stored
    again = resume_sweep(out.store.root, {"vllm_python": fake}, backend=cluster)
    assert again.skipped == 12 and not again.finished


def test_an_address_nothing_answers_at_is_one_line_at_once(cluster):
    port = find_free_port()  # bound a moment ago, now closed: nothing listens
    with pytest.raises(AvbenchError, match=rf"^--ray 127.0.0.1:{port}: nothing answers at "):
        RayBackend.connect(f"127.0.0.1:{port}")
