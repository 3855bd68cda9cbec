"""A sweep through a local Ray cluster that this module starts, with logical GPUs (Ray sets
each task's CUDA_VISIBLE_DEVICES from them): the same cells, run directory layout and report
as the sequential run; a task's worker SIGKILLed mid-arm is re-run from what was stored. The
project's fake streaming server stands in for vLLM (``avbench.testing.fake_vllm``): what is
under test is the scheduling."""

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from avbench.inputs.suite import load_suite
from avbench.plan.gpus import GpuSet
from avbench.report import write_report
from avbench.run.runner import SweepOptions, resume_sweep, start_sweep
from avbench.serving.server import find_free_port, proc_stat
from avbench.store.artefacts import SweepManifest
from avbench.testing.fake_server import ServerConfig
from avbench.testing.fake_vllm import gpus_given, interpreter

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


def _opts(results: Path, vllm_python: str, run_id: str, concurrencies, **kw) -> SweepOptions:
    suite = load_suite()
    sweep = suite.sweep("demo").model_copy(
        update={
            "arms": ["baseline", "static"],
            "k_values": [1, 3],
            "static_k": "all",
            "workloads": ["gsm8k-tiny"],
            "concurrencies": list(concurrencies),
            "min_requests": 4,
            "requests_per_concurrency": 1,
            "warmup": 1,
            "capture": [],
        }
    )
    return SweepOptions(
        pair=suite.pair("tiny-cpu"),
        sweep=sweep,
        workloads=suite.workloads,
        results_dir=results,
        run_id=run_id,
        port=find_free_port(),
        vllm_python=vllm_python,
        **kw,
    )


def _layout(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _headings(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("#")]


def test_a_ray_sweep_has_the_sequential_runs_cells_layout_and_report(tmp_path, cluster):
    fake = str(interpreter(tmp_path, ServerConfig(output_tokens=12, inter_chunk_delay_s=0.01)))
    ray_run = start_sweep(_opts(tmp_path, fake, "ray", (1, 2)), backend=cluster)
    seq = start_sweep(_opts(tmp_path, fake, "seq", (1, 2), gpus=GpuSet.parse("0")))
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


def _server_of(arm_k: int) -> int | None:
    """The pid of the fake vLLM serving static-k<arm_k>, if one runs."""
    for pid in (int(n) for n in os.listdir("/proc") if n.isdigit()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"avbench.testing.fake_vllm" in argv and any(
            f'"num_speculative_tokens": {arm_k}'.encode() in a for a in argv
        ):
            return pid
    return None


def test_a_task_worker_killed_mid_arm_is_re_run_from_what_was_stored(tmp_path, cluster):
    fake = str(interpreter(tmp_path, ServerConfig(output_tokens=12, inter_chunk_delay_s=0.03)))
    opts = _opts(tmp_path, fake, "kill", (1, 2, 3, 4))
    box: dict = {}
    sweep = threading.Thread(target=lambda: box.update(out=start_sweep(opts, backend=cluster)))
    sweep.start()
    cells = tmp_path / "kill" / "cells.jsonl"
    killed = None
    deadline = time.monotonic() + 240
    while killed is None and time.monotonic() < deadline and sweep.is_alive():
        time.sleep(0.1)
        text = cells.read_text() if cells.exists() else ""
        server = _server_of(3)
        if server is not None and '"arm": "static-k3"' in text:  # static-k3 is mid-arm
            stat = proc_stat(str(server))
            assert stat is not None
            killed = int(stat[1])  # its parent: the Ray worker running the task
            os.kill(killed, signal.SIGKILL)
    sweep.join(300)
    assert killed is not None, "static-k3 never got past its first cell"
    out = box["out"]
    rows = [line for line in cells.read_text().splitlines() if line.strip()]
    ids = [r.split('"cell_id": "')[1].split('"')[0] for r in rows]
    assert len(ids) == len(set(ids)) == 12  # every cell once: none lost, none twice
    assert not out.failed
    assert _server_of(3) is None  # the killed worker's server went with it
    m = out.store.read_manifest()
    k3 = [p for p in m.placements if p.arm == "static-k3"]
    assert len(k3) == 2 and all(p.ended_at for p in k3)  # the lost try and the re-run
    assert len(k3[1].cells) < 4  # the re-run measured only what the lost try had not stored
    again = resume_sweep(out.store.root, {"vllm_python": fake}, backend=cluster)
    assert again.skipped == 12 and not again.finished
