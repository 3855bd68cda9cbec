"""FastTransport: chunked decoding under arbitrary read splits, keep-alive pooling."""

from __future__ import annotations

import random

from avbench.loadgen.client import run_drive
from avbench.loadgen.config import EndpointConfig, SamplingParams
from avbench.loadgen.transport import _DONE, _Conn
from avbench.testing.stream_server import ServerConfig, serve_in_thread
from avbench.workloads.base import Conversation


def test_chunked_body_decodes_whatever_the_read_boundaries():
    rng = random.Random(3)
    for _ in range(300):
        parts = [rng.randbytes(rng.randrange(1, 40)) for _ in range(rng.randrange(0, 12))]
        wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        wire += b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        conn = _Conn(None, None)
        cuts = sorted(rng.sample(range(1, len(wire)), min(len(wire) - 1, rng.randrange(0, 8))))
        prev = 0
        for i, x in enumerate([*cuts, len(wire)]):
            conn.data_received(wire[prev:x], float(i))
            prev = x
        assert b"".join(d for _, d in conn.items) == b"".join(parts)
        assert conn.state == _DONE and conn.error is None
        # each piece is stamped with the read it came in
        assert all(0 <= t <= len(cuts) for t, _ in conn.items)


def test_content_length_body_and_bad_status_line():
    conn = _Conn(None, None)
    conn.data_received(b"HTTP/1.1 500 Oops\r\ncontent-length: 5\r\n\r\nab", 1.0)
    conn.data_received(b"cde", 2.0)
    assert [d for _, d in conn.items] == [b"ab", b"cde"] and conn.state == _DONE
    bad = _Conn(None, None)
    bad.sock = None
    try:
        bad._parse_head(b"SPDY/9 200\r\n\r\n")
    except ValueError as exc:
        assert "bad status line" in str(exc)
    else:
        raise AssertionError("a bad status line must be rejected")


def test_keep_alive_pool_holds_one_connection_per_concurrent_stream():
    convs = [Conversation(id=str(i), turns=(f"q{i}",)) for i in range(40)]
    sp = SamplingParams(max_tokens=6)
    with serve_in_thread(ServerConfig(tokens_per_chunk=2, inter_chunk_delay_s=0.002)) as srv:
        ep = EndpointConfig(base_url=srv.base_url, model="fake-model")
        assert run_drive(ep, sp, convs[:10], concurrency=1).ok == 10
        assert srv.stats()["connections"] == 1
        srv.reset()
        assert run_drive(ep, sp, convs, concurrency=8).ok == 40
        assert srv.stats()["connections"] == 8
