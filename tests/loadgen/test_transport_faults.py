"""FastTransport under real network faults: every failure is a record, never a lost cell.

The server is the project's scripted streaming server (it stands in for vLLM's HTTP server; the
point here is the client) or a bare listening socket; the faults happen on real sockets: TCP
resets (SO_LINGER 0), FIN closes of idle keep-alive connections, refused addresses, a peer that
stops reading, bad chunk framing on the wire. After each fault the next request must start at
once: a leaked pool slot would hold it for the pool timeout (the request timeout, 10 s here).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import httpx
import pytest

from avbench.inputs.request import EndpointConfig, SamplingParams, Timeouts
from avbench.loadgen.client import DriveHooks, Load, drive, run_drive
from avbench.loadgen.transport import FastTransport
from avbench.testing.fake_server import ServerConfig, serve_in_thread
from avbench.workloads.base import Conversation

SP = SamplingParams(temperature=0.0, max_tokens=12)
POOL_TIMEOUT_S = 10.0  # make_client: pool timeout = request timeout
AT_ONCE_S = 1.0  # "at once", with room for a busy shared CI machine


def _ep(base_url: str, **kw) -> EndpointConfig:
    return EndpointConfig(
        base_url=base_url, model="fake-model", timeouts=Timeouts(request_s=POOL_TIMEOUT_S, **kw)
    )


def _convs(*prompts: str) -> list[Conversation]:
    return [Conversation(id=f"c{i}", turns=(p,)) for i, p in enumerate(prompts)]


def _wait_stat(srv, key: str, at_least: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while srv.stats()[key] < at_least:
        assert time.monotonic() < deadline, f"server stat {key} never reached {at_least}"
        time.sleep(0.01)


@contextlib.contextmanager
def _hung_server():
    """A listening socket nobody accepts from stands in for a hung server: the kernel completes
    the handshake and buffers a few MB, then the window closes and the client's write blocks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def _started_at_once(rec) -> None:
    assert rec.ok, rec.error
    assert 0 <= rec.queue_delay < AT_ONCE_S, rec.queue_delay


@pytest.mark.parametrize("reset", [True, False], ids=["rst", "fin"])
@pytest.mark.parametrize("busy", [True, False], ids=["busy-loop", "idle-loop"])
def test_keep_alive_connection_dropped_while_idle_costs_no_request(reset, busy):
    """The server drops an idle keep-alive connection (RST or FIN, like uvicorn's keep-alive
    timeout). With a busy client loop the drop is not seen before the next request is written
    on it (the keep-alive race: send fails with ECONNRESET/EPIPE, or the reply is EOF), so the
    transport must resend on a new connection; with an idle loop it must notice while pooled."""
    cfg = ServerConfig(tokens_per_chunk=3, idle_timeout_s=0.3, idle_reset=reset)
    with serve_in_thread(cfg) as srv:

        def on_record(rec) -> None:
            if busy and rec.conversation_id == "c0":
                # Blocks the client loop until the server dropped the connection; the same
                # worker then writes c1 on it without the loop polling in between.
                _wait_stat(srv, "idle_closed", 1)

        async def before_measure() -> None:
            while srv.stats()["idle_closed"] < 1:
                await asyncio.sleep(0.02)  # the loop runs: the pooled socket's close is read
            await asyncio.sleep(0.05)

        res = run_drive(
            _ep(srv.base_url),
            SP,
            _convs("a", "b", "c"),
            Load(concurrency=1, warmup=0 if busy else 1),
            DriveHooks(on_record=on_record, before_measure=None if busy else before_measure),
        )
        stats = srv.stats()
    assert [r.ok for r in res.records] == [True, True, True], [r.error for r in res.records]
    assert res.failed == 0 and res.errors == {}
    _started_at_once(res.records[1])
    assert stats["idle_closed"] >= 1 and stats["connections"] >= 2
    assert stats["requests"] == 3  # the request that met the dead socket never reached it


def test_stalled_stream_hits_the_read_timeout_and_frees_its_slot():
    with serve_in_thread(ServerConfig(tokens_per_chunk=2, inter_chunk_delay_s=0.002)) as srv:
        res = run_drive(
            _ep(srv.base_url, read_s=0.3), SP, _convs("@fault:stall", "b", "c"), Load(concurrency=1)
        )
    stalled, nxt, last = res.records
    assert stalled.error_kind == "timeout" and stalled.error.startswith("ReadTimeout")
    assert stalled.chunk_times, "what arrived before the stall is kept"
    assert 0.3 <= stalled.e2e < 3.0
    _started_at_once(nxt)
    assert last.ok and res.errors == {"timeout": 1} and res.ok == 2


@pytest.mark.slow
def test_reset_mid_stream_is_a_cut_stream_and_frees_its_slot():
    """A TCP reset after part of the stream. Under uvloop a reset that lands together with
    unread data is not reported to the reader (libuv drops a poll handle on POLLERR), so this
    also checks the transport's probe of a silent connection: a cut, within about a second,
    not a read timeout (120 s by default)."""
    prompts = ["@fault:reset"] * 3 + ["b"]
    with serve_in_thread(ServerConfig(tokens_per_chunk=2)) as srv:
        res = run_drive(_ep(srv.base_url), SP, _convs(*prompts), Load(concurrency=1))
    *cuts, nxt = res.records
    for cut in cuts:
        assert cut.error_kind == "stream_cut", cut.error
        # ECONNRESET on the read is httpx's ReadError (or, if the kernel reports the reset
        # as an end of stream, a RemoteProtocolError): never a raw OSError.
        assert cut.error.split(":")[0] in ("ReadError", "RemoteProtocolError"), cut.error
        assert cut.chunk_times and cut.e2e < 3.0
    _started_at_once(nxt)
    assert res.errors == {"stream_cut": 3}


def test_bad_chunk_framing_is_malformed_and_frees_its_slot():
    with serve_in_thread(ServerConfig(tokens_per_chunk=2)) as srv:
        res = run_drive(_ep(srv.base_url), SP, _convs("@fault:bad_chunk", "b"), Load(concurrency=1))
    bad, nxt = res.records
    assert bad.error_kind == "malformed", bad.error
    assert bad.error.startswith("MalformedResponseError") and "CRLF" in bad.error
    _started_at_once(nxt)
    assert res.errors == {"malformed": 1}


def test_interim_1xx_responses_are_skipped():
    with serve_in_thread(ServerConfig(tokens_per_chunk=2)) as srv:
        res = run_drive(_ep(srv.base_url), SP, _convs("@fault:interim", "b"), Load(concurrency=1))
        ems = srv.emissions()
    assert ems[0]["fault"] == "interim"  # the server did send 100 and 103 first
    first, second = res.records
    assert first.ok and first.status == 200, first.error
    assert first.output_text.startswith("<0>") and sum(first.chunk_tokens) == 12
    _started_at_once(second)
    assert second.output_text.startswith("<1>")  # the connection stayed in step


def test_write_timeout_when_the_peer_stops_reading():
    with _hung_server() as url:
        huge = "x" * (24 << 20)  # far beyond what loopback buffers take
        t0 = time.perf_counter()
        res = run_drive(_ep(url, read_s=0.3), SP, _convs(huge, "small"), Load(concurrency=1))
        took = time.perf_counter() - t0
    blocked, small = res.records
    assert blocked.error_kind == "timeout" and blocked.error.startswith("WriteTimeout")
    # The small request is written, then nobody answers: its own read timeout, started at once.
    assert small.error_kind == "timeout" and small.error.startswith("ReadTimeout")
    assert 0 <= small.queue_delay < AT_ONCE_S
    assert took < 5.0  # two 0.3 s timeouts, not a pool or request timeout


class _V6FirstLoop(asyncio.SelectorEventLoop):
    """The real resolver, with ``localhost``'s ``::1`` answer put first.

    Many hosts list ``::1 localhost`` in /etc/hosts and glibc then returns ::1 first; this
    machine's /etc/hosts is not ours to change and may list 127.0.0.1 only, so the order is set
    here. The addresses are the real resolver's, and the connects are real: ::1 is refused.
    """

    async def getaddrinfo(self, host, port, *args, **kw):
        infos = await super().getaddrinfo(host, port, *args, **kw)
        if host != "localhost":
            return infos
        v6 = await super().getaddrinfo("::1", port, *args, **kw)
        return v6 + [i for i in infos if i[0] != socket.AF_INET6]


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_localhost_resolving_to_ipv6_first_reaches_an_ipv4_only_server():
    def run(url: str):
        with asyncio.Runner(loop_factory=_V6FirstLoop) as runner:
            return runner.run(drive(_ep(url), SP, _convs("a", "b", "c"), Load(concurrency=2)))

    with serve_in_thread(ServerConfig(tokens_per_chunk=3)) as srv:  # AF_INET, 127.0.0.1 only
        port = srv.port
        res = run(f"http://localhost:{port}")
    assert res.ok == 3 and res.errors == {}, [r.error for r in res.records]
    # Server gone: both addresses are tried, in the resolver's order, and named.
    res = run(f"http://localhost:{port}")
    assert res.errors == {"connect": 3}
    err = res.records[0].error
    assert f"[::1]:{port}" in err and f"127.0.0.1:{port}" in err, err
    assert err.index("[::1]") < err.index("127.0.0.1"), err


def test_no_slot_is_held_after_a_failed_request_on_the_same_transport():
    """One-connection pool: the request that hit a write timeout gives the slot back, so a
    request to another host gets it at once."""

    async def main(good_url: str, hung_url: str):
        timeout = httpx.Timeout(POOL_TIMEOUT_S, write=0.3)
        async with httpx.AsyncClient(
            transport=FastTransport(max_connections=1), timeout=timeout
        ) as client:
            with pytest.raises(httpx.WriteTimeout):
                await client.post(hung_url + "/v1/completions", content=b"x" * (24 << 20))
            t0 = time.perf_counter()
            r = await client.get(good_url + "/v1/models")
            return r, time.perf_counter() - t0

    with serve_in_thread(ServerConfig()) as srv, _hung_server() as hung_url:
        r, took = asyncio.run(main(srv.base_url, hung_url))
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "fake-model"
    assert took < AT_ONCE_S
