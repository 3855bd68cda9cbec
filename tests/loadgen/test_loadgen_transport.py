"""FastTransport: chunked decoding under arbitrary read splits, keep-alive pooling."""

from __future__ import annotations

import asyncio
import random
import socket

import pytest

from avbench.inputs.request import EndpointConfig, SamplingParams
from avbench.loadgen.client import Load, run_drive
from avbench.loadgen.transport import _DONE, MalformedResponseError, _Conn
from avbench.testing.fake_server import ServerConfig, serve_in_thread
from avbench.workloads.base import Conversation


def _feed(conn: _Conn, wire: bytes, rng: random.Random) -> int:
    """Feed ``wire`` in randomly cut reads (read i stamped i); returns the number of cuts."""
    cuts = sorted(rng.sample(range(1, len(wire)), min(len(wire) - 1, rng.randrange(0, 8))))
    prev = 0
    for i, x in enumerate([*cuts, len(wire)]):
        conn.data_received(wire[prev:x], float(i))
        prev = x
    return len(cuts)


INTERIM = [
    b"",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n",
]


def test_chunked_body_decodes_whatever_the_read_boundaries():
    rng = random.Random(3)
    for k in range(300):
        parts = [rng.randbytes(rng.randrange(1, 40)) for _ in range(rng.randrange(0, 12))]
        wire = INTERIM[k % 3] + b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        ext = b";name=value" if k % 5 == 0 else b""
        wire += b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in parts)
        wire += b"0\r\nx-trailer: 1\r\n\r\n" if k % 4 == 0 else b"0\r\n\r\n"
        conn = _Conn(None, None)
        ncuts = _feed(conn, wire, rng)
        assert b"".join(d for _, d in conn.items) == b"".join(parts)
        assert conn.state == _DONE and conn.error is None and conn.keep_alive
        # each piece is stamped with the read it came in
        assert all(0 <= t <= ncuts for t, _ in conn.items)


BAD_FRAMING = {
    "no CRLF after data": b"5\r\nhelloXX0\r\n\r\n",
    "LF only after data": b"5\r\nhello\n0\r\n\r\n",
    "size not hex": b"zz\r\nhello\r\n0\r\n\r\n",
    "negative size": b"-5\r\nhello\r\n0\r\n\r\n",
    "0x prefix": b"0x5\r\nhello\r\n0\r\n\r\n",
    "underscore": b"0_5\r\nhello\r\n0\r\n\r\n",
    "empty size line": b"\r\nhello\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("wire", BAD_FRAMING.values(), ids=BAD_FRAMING.keys())
def test_bad_chunk_framing_is_a_malformed_response_whatever_the_splits(wire):
    rng = random.Random(5)
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    loop = asyncio.new_event_loop()  # not run: close() only unregisters the socket
    try:
        for _ in range(50):
            a, b = socket.socketpair()  # a real socket for the connection to close
            with a, b:
                conn = _Conn(loop, a)
                _feed(conn, head + wire, rng)
                assert isinstance(conn.error, MalformedResponseError), conn.error
                assert conn.closed
    finally:
        loop.close()


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
    ],
)
def test_bad_heads_are_malformed(head):
    loop = asyncio.new_event_loop()
    a, b = socket.socketpair()
    try:
        conn = _Conn(loop, a)
        conn.data_received(head, 0.0)
        assert isinstance(conn.error, MalformedResponseError) and conn.closed
    finally:
        a.close()
        b.close()
        loop.close()


def test_a_body_without_length_on_204_and_extra_bytes_end_reuse():
    conn = _Conn(None, None)
    conn.data_received(b"HTTP/1.1 204 No Content\r\n\r\n", 0.0)
    assert conn.state == _DONE and conn.keep_alive
    conn = _Conn(None, None)
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA", 0.0)
    assert [d for _, d in conn.items] == [b"ok"] and conn.state == _DONE
    assert not conn.keep_alive  # bytes nobody asked for: the connection is not reused
    conn = _Conn(None, None)
    conn.data_received(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", 0.0)
    assert conn.state == _DONE and not conn.keep_alive


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
        assert run_drive(ep, sp, convs[:10], Load(concurrency=1)).ok == 10
        assert srv.stats()["connections"] == 1
        srv.reset()
        assert run_drive(ep, sp, convs, Load(concurrency=8)).ok == 40
        assert srv.stats()["connections"] == 8
