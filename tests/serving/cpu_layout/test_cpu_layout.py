"""Pinning a real process group: the processes titled as vLLM's engine core and worker get the
engine CPUs, every other process of the group and this one the rest (needs two CPUs)."""

import os
import subprocess
import sys
import time

import pytest

from avbench.errors import ServerError
from avbench.serving.cpu_layout import apply, layout_for, release

ALLOWED = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs")


def _titled_child(title: str) -> str:
    # A stand-in for one of vLLM's processes: its kernel title set as vLLM sets it, then idle.
    return (
        f"subprocess.Popen([sys.executable, '-c', \"import ctypes, time; "
        f"ctypes.CDLL('libc.so.6').prctl(15, b'{title}', 0, 0, 0); time.sleep(60)\"])"
    )


def test_the_engine_gets_its_cpus_and_everything_else_the_rest():
    api = (
        "import subprocess, sys, time; "
        f"{_titled_child('VLLM::EngineCore')}; {_titled_child('VLLM::Worker')}; time.sleep(60)"
    )
    group = subprocess.Popen([sys.executable, "-c", api], start_new_session=True)
    own = os.sched_getaffinity(0)
    try:
        deadline = time.monotonic() + 20
        while len(_titled(group.pid, ("VLLM::EngineCor", "VLLM::Worker"))) < 2:
            assert time.monotonic() < deadline, "the stand-ins did not start"
            time.sleep(0.05)
        layout = layout_for([ALLOWED[-1]], "p")
        assert apply(layout, group.pid) == 2
        for pid in _titled(group.pid, ("VLLM::EngineCor", "VLLM::Worker")):
            assert os.sched_getaffinity(pid) == {ALLOWED[-1]}
        assert os.sched_getaffinity(group.pid) == set(ALLOWED[:-1])  # the API server
        assert os.sched_getaffinity(0) == set(ALLOWED[:-1])  # the load driver
        # The next arm draws its layout from the CPUs this process started with.
        assert layout_for([ALLOWED[-1]], "p") == layout
        release()
        assert os.sched_getaffinity(0) == own
    finally:
        os.sched_setaffinity(0, own)
        os.killpg(group.pid, 9)
        group.wait()


def _titled(pgid: int, titles: tuple[str, ...]) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.getpgid(int(entry)) == pgid:
                with open(f"/proc/{entry}/comm") as fh:
                    if fh.read().strip().startswith(titles):
                        out.append(int(entry))
        except (ProcessLookupError, FileNotFoundError):
            pass
    return out


@pytest.mark.parametrize("cpus", [ALLOWED, [max(ALLOWED) + 1]])
def test_a_layout_this_machine_cannot_give_is_one_line(cpus):
    with pytest.raises(ServerError) as exc:
        layout_for(cpus, "tiny-cpu")
    text = str(exc.value)
    assert text.startswith(f"pairs.tiny-cpu.engine_cpus = {sorted(cpus)}: expected CPUs")
    assert "\n" not in text
