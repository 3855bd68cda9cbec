"""SIGTERM stops a drive wherever the event loop is when it arrives.

avbench takes SIGTERM as Ctrl-C: its handler raises KeyboardInterrupt. Raised inside the event
loop, that exception can land in a callback whose caller prints and drops it (uvloop's resolver
callback did, on CI: a session went on driving, its server with it, after the sweep was killed).
Here the signal arrives inside a ``__del__``, where Python drops exceptions the same way. The
server is the project's scripted streaming server (it stands in for vLLM's HTTP server); the
drive runs in its own process, the signal being real.
"""

from __future__ import annotations

import subprocess
import sys

from avbench.testing.fake_server import ServerConfig, serve_in_subprocess

_DRIVE = """
import os, signal, sys
from avbench.inputs.request import EndpointConfig, SamplingParams
from avbench.loadgen.client import DriveHooks, Load, run_drive
from avbench.workloads.base import Conversation


def interrupt(signum, frame):
    raise KeyboardInterrupt


signal.signal(signal.SIGTERM, interrupt)


class Dropped:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):  # the handler runs in here, between two bytecodes
            pass


records = []


def on_record(record):
    records.append(record)
    if len(records) == int(sys.argv[2]):
        Dropped()


conversations = [Conversation(id=f"c{i}", turns=(f"q {i}",)) for i in range(60)]
try:
    run_drive(
        EndpointConfig(base_url=sys.argv[1], model="fake-model"),
        SamplingParams(temperature=0.0, max_tokens=40),
        conversations,
        Load(concurrency=2),
        DriveHooks(on_record=on_record),
    )
except KeyboardInterrupt:
    print("interrupted", len(records), signal.getsignal(signal.SIGTERM) is interrupt)
else:
    print("finished", len(records))
"""


def _drive(url: str, signal_at: int) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _DRIVE, url, str(signal_at)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_sigterm_inside_a_callback_that_drops_exceptions_still_stops_the_drive():
    cfg = ServerConfig(tokens_per_chunk=2, output_tokens=40, inter_chunk_delay_s=0.01)
    with serve_in_subprocess(cfg) as srv:
        assert _drive(srv.base_url, signal_at=0) == ["finished", "60"]  # no signal: all 60
        said = _drive(srv.base_url, signal_at=3)
    assert said[0] == "interrupted", said
    records, handler_back = said[1:]
    assert 3 <= int(records) < 10  # those in flight at most, none started after
    assert handler_back == "True"  # the process's own handler is back after the drive
