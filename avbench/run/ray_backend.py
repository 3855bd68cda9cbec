"""Arm sessions as tasks of a Ray cluster (``avbench sweep --ray ADDRESS``).

Each session of a wave (avbench/plan/gpus.py, planned on the cluster's GPU count) is one Ray
task that requests its server's GPUs (``num_gpus`` = TP × PP × DP; none on a cluster without
GPUs, where the CPU build serves) and one CPU of its node for its load driver. Ray picks the
node and the GPUs and sets CUDA_VISIBLE_DEVICES in the task, which the session hands its
server. The task stores its cells into the run directory through the same store as a local
session (``runner.run_session``), so the directory must be at the same path on every node
(one machine, or storage all nodes mount). Its progress comes back through a Ray queue.

A task lost with its worker or node is re-run by Ray (``max_retries``): the re-run skips what
the lost one stored and measures the rest. One lost beyond its retries fails its unstored
cells as ``arm_lost``, which --resume reruns.

This module imports Ray at import time: only ``--ray`` imports it (and says so when the extra
is not installed).
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import ray
from ray.util.queue import Queue

from avbench.errors import AvbenchError
from avbench.plan.gpus import GpuSet
from avbench.run.progress import Event
from avbench.run.runner import SessionJob, SessionResult, run_session
from avbench.serving.server import find_free_port

LOAD_DRIVER_CPUS = 1  # one event loop per arm's load driver
TASK_RETRIES = 2  # re-runs of a task lost with its worker or node
POLL_S = 0.2
CONNECT_S = 5.0  # a head that answers does so at once


class RayBackend:
    """Where the sessions run: tasks of the cluster this process is connected to."""

    name = "ray"

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus  # the cluster's, planned on

    @classmethod
    def connect(cls, address: str) -> RayBackend:
        """Join the cluster at ``address`` ('local': start one on this machine; a process
        already connected stays on its cluster)."""
        _require_reachable(address)
        if not ray.is_initialized():
            try:
                ray.init(address=None if address == "local" else address, log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise AvbenchError(f"--ray {address}: cannot join the cluster ({first})") from None
        return cls(int(ray.cluster_resources().get("GPU", 0)))

    def inventory(self) -> GpuSet:
        return GpuSet(tuple(range(self.gpus)))

    def run_wave(
        self, jobs: Sequence[SessionJob], on_event: Callable[[Event], None]
    ) -> list[SessionResult | None]:
        events = Queue(actor_options={"num_cpus": 0})
        refs = []
        for job in jobs:
            gpus = job.opts.pair.gpus_per_server if self.gpus else 0
            task = _session_task.options(
                num_gpus=gpus, num_cpus=LOAD_DRIVER_CPUS, max_retries=TASK_RETRIES
            )
            refs.append(task.remote(job, events))
        results: list[SessionResult | None] = [None] * len(jobs)
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
                for event in events.get_nowait_batch(events.qsize()):
                    on_event(event)
                for ref in done:
                    try:
                        results[refs.index(ref)] = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:  # the session raised, as here
                        raise (exc.cause or exc) from None
                    except ray.exceptions.RayError as exc:  # lost beyond its retries
                        on_event(("warning", (f"a Ray task was lost: {_last_line(exc)}",)))
            for event in events.get_nowait_batch(events.qsize()):
                on_event(event)
        except KeyboardInterrupt:
            for ref in pending:  # stops their servers: a cancelled task is interrupted
                ray.cancel(ref)
            raise
        finally:
            events.shutdown(force=True)
        return results


def _require_reachable(address: str) -> None:
    """A HOST:PORT (or ray://HOST:PORT) that nothing answers at is refused at once: Ray would
    retry its connection for minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():  # 'local', 'auto': Ray finds the cluster
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_S).close()
    except OSError as exc:
        raise AvbenchError(
            f"--ray {address}: nothing answers at {host}:{port} ({exc.strerror or exc}); is "
            "the cluster's head running?"
        ) from None


def _last_line(exc: BaseException) -> str:
    """Ray's error texts end with what happened (a worker or node died, and why)."""
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__


def _task(job: SessionJob, events: Any) -> SessionResult:
    """A session on the node Ray chose: the GPUs Ray gave the task, a free port of the node."""
    if not job.root.is_dir():
        raise AvbenchError(
            f"--ray: run directory {job.root} is not on node {ray.util.get_node_ip_address()}: "
            "the results directory must be on storage every node mounts at the same path"
        )
    given = GpuSet(tuple(int(i) for i in ray.get_gpu_ids()))
    opts = replace(job.opts, port=find_free_port(job.opts.host))
    # A put to the Ray queue is a round trip to its actor: the load driver's event loop only
    # appends to a local buffer, which a thread forwards in batches.
    buffer: queue.SimpleQueue[Event] = queue.SimpleQueue()
    done = threading.Event()

    def forward() -> None:
        while True:
            finished = done.is_set()
            batch = []
            while not buffer.empty():
                batch.append(buffer.get())
            if batch:
                events.put_nowait_batch(batch)
            if finished:
                return
            done.wait(POLL_S)

    forwarder = threading.Thread(target=forward, name="avbench-progress", daemon=True)
    forwarder.start()
    try:
        return run_session(replace(job, opts=opts, gpus=given), buffer.put)
    finally:
        done.set()
        forwarder.join()


_session_task = ray.remote(_task)
