"""How the load driver measures: transport, event loop and timestamp source, for the record.

Two installs can time the same server differently (another event loop, another transport, user-
space instead of kernel receive stamps), so every run manifest and every cell row carries these
facts (docs/measurement.md).

The event loop is uvloop, a runtime dependency on the platforms it supports: it is never picked
up implicitly from whatever happens to be installed. Where uvloop does not exist (Windows) the
standard asyncio loop runs, and the record says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Callable
from importlib import metadata

from avbench.loadgen.transport import _SO_TIMESTAMPNS as SO_TIMESTAMPNS


def event_loop() -> tuple[str, str, Callable[[], asyncio.AbstractEventLoop]]:
    """(name, version, factory) of the event loop the load driver runs on."""
    try:
        import uvloop
    except ImportError:
        return "asyncio", sys.version.split()[0], asyncio.new_event_loop
    return "uvloop", metadata.version("uvloop"), uvloop.new_event_loop


def kernel_timestamps() -> bool:
    """Whether this kernel stamps received TCP data (SO_TIMESTAMPNS) for our transport."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            return bool(sock.getsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS))
    return False


def client_provenance(base_url: str) -> dict[str, str]:
    """The facts that decide how a request to ``base_url`` is timed (see make_client)."""
    loop, loop_version, _ = event_loop()
    own = base_url.startswith("http://")
    if own:
        transport = "avbench FastTransport (HTTP/1.1)"
        stamps = (
            "kernel receive stamp (SO_TIMESTAMPNS)"
            if kernel_timestamps()
            else "user space (perf_counter at read)"
        )
    else:
        transport = f"httpx {metadata.version('httpx')} (httpcore, TLS)"
        stamps = "user space (perf_counter at read)"
    return {
        "transport": transport,
        "event_loop": f"{loop} {loop_version}",
        "timestamp_source": stamps,
    }
