"""A server that stops producing fails fast: SSE comments are not progress, a stalled server
stops the drive as "server stalled", and the cell deadline bounds a drive that trickles.

The server is the project's scripted streaming server (it stands in for vLLM's HTTP server; the
behaviour under test is the client's). Faults are real: its process group SIGSTOPped mid-stream,
or a stream that turns into SSE keep-alive comments (``: ping``) and never sends data again.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from avbench.inputs.request import EndpointConfig, SamplingParams, Timeouts
from avbench.loadgen.client import DriveHooks, Load, run_drive
from avbench.loadgen.transport import _Conn
from avbench.testing.fake_server import ServerConfig, serve_in_subprocess, serve_in_thread
from avbench.workloads.base import Conversation

SP = SamplingParams(temperature=0.0, max_tokens=40)
SLACK_S = 3.0  # a busy shared machine


def _ep(url: str, **timeouts) -> EndpointConfig:
    return EndpointConfig(base_url=url, model="fake-model", timeouts=Timeouts(**timeouts))


def _convs(n: int, text: str = "q") -> list[Conversation]:
    return [Conversation(id=f"c{i}", turns=(f"{text} {i}",)) for i in range(n)]


def _sse_conn() -> _Conn:
    conn = _Conn(None, None)
    conn.data_received(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        0.0,
    )
    return conn


def test_only_sse_data_lines_are_progress_whatever_the_read_boundaries():
    events = [
        b'data: {"a":1}\n\n',
        b": ping\n\n",
        b"data: x\ndata: y\n\n",
        b":\n\n",
        b"event: e\n\n",
    ]
    progress_kinds = {0, 2, 4}
    rng = random.Random(7)
    for _ in range(300):
        picks = [rng.randrange(len(events)) for _ in range(rng.randrange(1, 8))]
        body = b"".join(events[i] for i in picks)
        # Where each byte's event starts and whether it carries data (comment bytes do not).
        carries = []
        for i in picks:
            carries += [i in progress_kinds] * len(events[i])
        conn = _sse_conn()
        cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randrange(0, 6))))
        bounds = [0, *cuts, len(body)]
        for r, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False), start=1):
            wire = b"%x\r\n%s\r\n" % (b - a, body[a:b])
            conn.data_received(wire, float(r))
            # A read is progress iff it holds a byte of a data/event line other than its
            # line end: blank lines and comment lines are not.
            piece = body[a:b]
            data_bytes = [
                carries[a + j] and piece[j : j + 1] not in (b"\n", b"") for j in range(b - a)
            ]
            want = float(r) if any(data_bytes) else None
            if want is not None:
                assert conn.last_progress == want, (body, bounds, r)
            else:
                assert conn.last_progress < r, (body, bounds, r)


def test_sse_comments_do_not_keep_a_request_alive():
    cfg = ServerConfig(tokens_per_chunk=2, inter_chunk_delay_s=0.01, ping_interval_s=0.1)
    with serve_in_thread(cfg) as srv:
        t0 = time.perf_counter()
        res = run_drive(
            _ep(srv.base_url, read_s=0.6, request_s=20),
            SP,
            [Conversation(id="p", turns=("@fault:pings",))],
            Load(concurrency=1),
        )
        took = time.perf_counter() - t0
    (rec,) = res.records
    assert rec.error_kind == "timeout" and "only SSE comments" in rec.error, rec.error
    assert rec.chunk_times, "the tokens that came before the pings are kept"
    assert took < 0.6 + SLACK_S, took


class _FreezeAfter:
    """``on_record`` hook: SIGSTOPs the server's process group once ``n`` requests succeeded."""

    def __init__(self, srv, n: int):
        self.srv, self.n, self.ok, self.at = srv, n, 0, None

    def __call__(self, rec) -> None:
        self.ok += rec.ok
        if self.ok == self.n and self.at is None:
            self.at = time.perf_counter()
            os.killpg(self.srv.proc.pid, signal.SIGSTOP)


@pytest.mark.slow
def test_a_frozen_server_stops_the_drive_as_stalled_within_the_stall_timeout():
    cfg = ServerConfig(tokens_per_chunk=1, inter_chunk_delay_s=0.05)
    with serve_in_subprocess(cfg) as srv:
        freeze = _FreezeAfter(srv, 2)
        try:
            ep = _ep(srv.base_url, stall_s=1.0, read_s=60)
            res = run_drive(ep, SP, _convs(12), Load(concurrency=2), DriveHooks(on_record=freeze))
            done = time.perf_counter()
        finally:
            os.killpg(srv.proc.pid, signal.SIGCONT)
    assert res.stop is not None and res.stop.kind == "stalled"
    assert res.stop.reason.startswith("server stalled: no progress on any of 2 in-flight")
    assert "GET /health: no answer within 1 s" in res.stop.reason
    # 1 s without progress + 1 s for /health, then at once; not the 60 s read timeout.
    assert done - freeze.at < 2.0 + SLACK_S, done - freeze.at
    stalled = [r for r in res.records if r.error_kind == "stalled"]
    assert len(stalled) == 2 and all("server stalled" in r.error for r in stalled)
    assert len(res.records) == 4, "no request starts after the stall"
    assert res.ok == 2 and res.errors == {"stalled": 2}


def test_a_server_that_only_pings_is_stalled_though_health_answers():
    with serve_in_thread(ServerConfig(tokens_per_chunk=1, ping_interval_s=0.05)) as srv:
        res = run_drive(
            _ep(srv.base_url, stall_s=0.5, read_s=60),
            SP,
            [Conversation(id=f"p{i}", turns=("@fault:pings",)) for i in range(3)],
            Load(concurrency=3),
        )
    assert res.stop is not None and res.stop.kind == "stalled"
    assert "GET /health: HTTP 200 (the HTTP server answers" in res.stop.reason
    assert res.errors == {"stalled": 3}
    assert all(r.chunk_times for r in res.records)  # what streamed before the pings is kept


def test_the_cell_deadline_bounds_a_drive_that_keeps_streaming():
    cfg = ServerConfig(tokens_per_chunk=1, inter_chunk_delay_s=0.05)  # 40 tokens: 2 s each
    with serve_in_thread(cfg) as srv:
        t0 = time.perf_counter()
        res = run_drive(_ep(srv.base_url, cell_s=0.8), SP, _convs(6), Load(concurrency=2))
        took = time.perf_counter() - t0
    assert res.stop is not None and res.stop.kind == "deadline"
    assert res.stop.reason == "cell deadline: not finished within 0.8 s"
    assert res.errors == {"deadline": 2} and len(res.records) == 2
    assert took < 0.8 + SLACK_S, took


@pytest.mark.slow
def test_open_loop_stops_sending_after_a_stall():
    with serve_in_subprocess(ServerConfig(tokens_per_chunk=4)) as srv:
        freeze = _FreezeAfter(srv, 2)
        try:
            ep = _ep(srv.base_url, stall_s=0.5)
            res = run_drive(ep, SP, _convs(40), Load(rate=4.0), DriveHooks(on_record=freeze))
        finally:
            os.killpg(srv.proc.pid, signal.SIGCONT)
    assert res.stop is not None and res.stop.kind == "stalled"
    assert res.ok == 2 and len(res.records) < 10, res  # 40 at 4 req/s would take 10 s
