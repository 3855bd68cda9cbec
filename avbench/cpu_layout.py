"""Where a CPU server's processes run (pair setting ``worker_cpus``).

vLLM's CPU build serves from three processes: the API server (HTTP, detokenizing, streaming),
the engine core (scheduling; it polls for the worker's results) and the model worker
(``VLLM::Worker``), which computes nonstop. On a machine with two or so cores, left to the OS
the worker shares a core with the API server often enough that the API server falls behind and
writes whole streams at once (stream_burst_frac). Pinned, the worker has its CPUs to itself and
the API server, the engine core and avbench's load driver share the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from avbench.errors import ServerError

WORKER_TITLE = "VLLM::Worker"  # vLLM's process title for its model worker(s)
PROC = Path("/proc")
# The CPUs this process had before any arm pinned it: every arm's layout is drawn from them.
START_CPUS = frozenset(os.sched_getaffinity(0))


@dataclass(frozen=True)
class Layout:
    worker: frozenset[int]  # CPUs of the model worker(s)
    rest: frozenset[int]  # CPUs of every other server process and of the load driver

    def describe(self) -> str:
        return (
            f"model worker on CPU {_cpus(self.worker)}; API server, engine core and load driver "
            f"on CPU {_cpus(self.rest)}"
        )


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def layout_for(worker_cpus: list[int], pair: str) -> Layout:
    """The layout on this machine; a one-line error where it cannot be had here."""
    allowed = START_CPUS
    worker = frozenset(worker_cpus)
    rest = allowed - worker
    if not worker <= allowed or not rest:
        raise ServerError(
            f"pairs.{pair}.worker_cpus = {sorted(worker)}: expected CPUs this process may use "
            f"({_cpus(allowed)}) that leave at least one for the rest"
        )
    return Layout(worker, rest)


def _pin(pid: int, cpus: frozenset[int]) -> None:
    # Affinity is per thread: every thread of the process, and threads started later inherit.
    for task in (PROC / str(pid) / "task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def apply(layout: Layout, pgid: int) -> int:
    """Pin the server's process group and this process; returns how many workers were pinned."""
    workers = 0
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            title = (entry / "comm").read_text().strip()
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
        is_worker = title.startswith(WORKER_TITLE)
        workers += is_worker
        _pin(int(entry.name), layout.worker if is_worker else layout.rest)
    _pin(os.getpid(), layout.rest)
    return workers


def release() -> None:
    """This process back on the CPUs it started with (the arm's server has stopped)."""
    _pin(os.getpid(), START_CPUS)
