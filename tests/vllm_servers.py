"""vLLM in the test session: which tests start a server, and the servers tests share.

``VllmWatch`` finds every vLLM API server below the pytest process (a thread looks once a
second; a server takes many seconds to import vLLM, so none starts unseen) and says which test
was running when each appeared: ``tests/conftest.py`` fails a test that starts one without the
``vllm`` marker, and the session when one outlives it.

``SharedVllm`` keeps at most one shared server alive: asking for a different command line stops
the one running first, and so does a ``vllm`` test that launches its own (docs/testing.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar, cast

import httpx

from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm
from avbench.serving.capture import CaptureSettings
from avbench.serving.server import (
    Launch,
    ServerProcess,
    arm_server,
    find_free_port,
    proc_stat,
)

# The OpenAI-compatible server's entry modules all live here (avbench.serving.server.VLLM_MODULE);
# vLLM's engine and worker processes are renamed (VLLM::EngineCore) or run other modules.
ENTRY_PREFIX = "vllm.entrypoints."
POLL_S = 1.0
S = TypeVar("S", bound="Served")


def _ppids() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        fields = proc_stat(name) if name.isdigit() else None
        if fields is not None:
            out[int(name)] = int(fields[1])
    return out


def _is_server(pid: int) -> bool:
    """A Python interpreter running one of vLLM's entry modules (a shell script that only
    pretends to be vLLM's interpreter, as some tests pass to --vllm-python, is not one).
    The judgement rests on one read of the arguments, which the kernel takes from one process
    image: a wrapper that execs Python, and Python the wrapper again, between two reads of
    ``/proc/<pid>/exe`` once had its shell's arguments (``-m vllm.entrypoints...``) judged with
    Python's executable; the shell's own arguments start with the shell."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        fd = os.open(f"/proc/{pid}/cmdline", os.O_RDONLY)
        try:
            argv = os.read(fd, 1 << 20).split(b"\0")  # one read: one process image
        finally:
            os.close(fd)
    except OSError:
        return False
    python = all(os.path.basename(p).startswith(b"python") for p in (exe.encode(), argv[0]))
    modules = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == b"-m"]
    return python and any(m.startswith(ENTRY_PREFIX.encode()) for m in modules)


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid, ppid in _ppids().items():
        children.setdefault(ppid, []).append(pid)
    return children


def descendants(root: int) -> set[int]:
    """Pids of every process below ``root``."""
    children = _children()
    found, todo = set(), list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def vllm_servers_below(root: int) -> set[int]:
    """Pids of the vLLM API servers among ``root``'s descendants."""
    children = _children()
    found, todo = set(), list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if _is_server(pid):
            found.add(pid)  # its own children are its engine and workers
        else:
            todo += children.get(pid, [])
    return found


def _alive(pid: int) -> bool:
    """Running, not merely a zombie its parent has yet to reap."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"


@dataclass
class VllmWatch:
    """Which test was running when each vLLM server below this process first appeared."""

    root: int = field(default_factory=os.getpid)
    test: str | None = None  # the node id of the test now running
    started_by: dict[int, str | None] = field(default_factory=dict)  # pid -> node id
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def look(self) -> None:
        pids = vllm_servers_below(self.root)
        with self._lock:
            for pid in pids - self.started_by.keys():
                self.started_by[pid] = self.test

    def started_during(self, nodeid: str) -> list[int]:
        self.look()  # one running now has been seen, however short the test
        with self._lock:
            return sorted(p for p, t in self.started_by.items() if t == nodeid)

    def survivors(self) -> list[int]:
        with self._lock:
            return sorted(p for p in self.started_by if _alive(p))

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True, name="vllm-watch").start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.look()


def kill_group(pid: int) -> None:
    """SIGKILL a left-over server's process group (avbench starts each server in its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(pid), signal.SIGKILL)


class Served(Protocol):
    """A running shared server and what its tests need to know of it."""

    server: ServerProcess


@dataclass
class SharedVllm:
    """At most one shared vLLM server at a time, kept for the tests that ask for the same
    ``key`` (its command line, in words) after it; another key stops it first."""

    key: str | None = None
    served: Any = None

    def get(self, key: str, start: Callable[[], S]) -> S:
        """The server for ``key``, or ``start()``: one started and ready, stopped should it
        fail to become ready."""
        if self.key == key and self.served is not None and self.served.server.alive():
            return cast(S, self.served)
        self.stop()
        self.served, self.key = start(), key
        return cast(S, self.served)

    def stop(self) -> None:
        served, self.key, self.served = self.served, None, None
        if served is not None:
            served.server.stop()


# ----------------------------------------------------------------------------- the servers
@dataclass(frozen=True)
class TinyK3:
    """The tiny pair at static K = 3 started as a sweep starts that arm, behind an API key, the
    plugin capturing drafts, refits and steps of every request into ``capture``."""

    KEY: ClassVar[str] = "tiny-cpu static-k3, captures drafts+refits+steps, API key"
    API_KEY: ClassVar[str] = "sk-shared-tiny-k3-5e1"
    K: ClassVar[int] = 3
    server: ServerProcess
    capture: Path
    model: str

    @property
    def url(self) -> str:
        return self.server.base_url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.API_KEY}"}

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=30).text

    def complete(self, prompt: str | list[int], max_tokens: int = 40) -> str:
        """One greedy completion of exactly ``max_tokens``; its response id."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        r = httpx.post(f"{self.url}/v1/completions", json=body, headers=self.headers, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["id"]

    @classmethod
    def start(cls, directory: Path) -> TinyK3:
        pair = load_suite().pair("tiny-cpu")
        capture = directory / "capture"
        capture.mkdir()
        settings = CaptureSettings(("drafts", "refits", "steps"), 1.0)
        launch = Launch(find_free_port(), directory / "server.log", api_key=cls.API_KEY,
                        capture=(settings, capture), ready_timeout_s=600)  # fmt: skip
        server = arm_server(pair, Arm("static", cls.K), launch)
        server.start()
        try:
            server.wait_ready({"Authorization": f"Bearer {cls.API_KEY}"})
        except BaseException:
            server.stop()
            raise
        return cls(server, capture, pair.model_name)
