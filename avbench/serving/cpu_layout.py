"""Where a CPU server's processes run (pair setting ``engine_cpus``).

vLLM's CPU build serves from three processes: the API server (HTTP, detokenizing, streaming),
the engine core (scheduling; it spins, yielding, while it waits for the worker) and the model
worker, which computes nonstop; two where the pair runs the worker inside the engine core
(``--distributed-executor-backend uni`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as the
embedded tiny pairs do). On a machine with two or so cores, left to the OS the API server
often shares a core with one of the other two and falls behind, then writes whole streams at
once (stream_burst_frac). Pinned, the engine core and the worker share their CPUs and the API
server and avbench's load driver have the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from avbench.errors import ServerError

# vLLM's process titles (the kernel keeps 15 characters) of the engine core and its workers.
ENGINE_TITLES = ("VLLM::EngineCor", "VLLM::Worker")
PROC = Path("/proc")
# The CPUs this process had before any arm pinned it: every arm's layout is drawn from them.
START_CPUS = frozenset(os.sched_getaffinity(0))


@dataclass(frozen=True)
class Layout:
    engine: frozenset[int]  # CPUs of the engine core and the model worker(s)
    rest: frozenset[int]  # CPUs of the API server and of the load driver

    def describe(self) -> str:
        return (
            f"engine core and model worker on CPU {_cpus(self.engine)}; API server and load "
            f"driver on CPU {_cpus(self.rest)}"
        )


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def layout_for(engine_cpus: list[int], pair: str) -> Layout:
    """The layout on this machine; a one-line error where it cannot be had here."""
    engine = frozenset(engine_cpus)
    rest = START_CPUS - engine
    if not engine <= START_CPUS or not rest:
        raise ServerError(
            f"pairs.{pair}.engine_cpus = {sorted(engine)}: expected CPUs this process may use "
            f"({_cpus(START_CPUS)}) that leave at least one for the rest"
        )
    return Layout(engine, rest)


def _pin(pid: int, cpus: frozenset[int]) -> None:
    # Affinity is per thread: every thread of the process, and threads started later inherit.
    for task in (PROC / str(pid) / "task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def apply(layout: Layout, pgid: int) -> int:
    """Pin the server's process group and this process; returns how many engine processes
    (engine core and workers) were pinned."""
    engine = 0
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            title = (entry / "comm").read_text().strip()
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
        is_engine = title.startswith(ENGINE_TITLES)
        engine += is_engine
        _pin(int(entry.name), layout.engine if is_engine else layout.rest)
    _pin(os.getpid(), layout.rest)
    return engine


def release() -> None:
    """This process back on the CPUs it started with (the arm's server has stopped)."""
    _pin(os.getpid(), START_CPUS)
