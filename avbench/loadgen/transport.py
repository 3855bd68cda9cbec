"""A lean HTTP/1.1 keep-alive transport for ``httpx.AsyncClient``, built for SSE streaming.

Why not httpx's default transport (httpcore + h11): measured against the local streaming server,
it cost ~19 ms of client CPU per 1000 streamed tokens, ~5x vLLM's aiohttp client. Two causes:
h11 turns every HTTP chunk (one SSE event) into its own event through several Python layers,
and httpcore's pool scans every connection on each request assignment (quadratic in the
concurrency). This transport keeps httpx's API (one ``AsyncClient``, ``client.send(...)``)
and replaces the wire layer:

- one non-blocking socket per connection, read with ``recvmsg`` from a loop reader callback;
  each read carries the kernel's receive timestamp (``SO_TIMESTAMPNS``, Linux), moved onto the
  ``perf_counter`` clock, so arrival times do not depend on how busy the event loop is (falls
  back to ``perf_counter()`` at the read where the kernel gives none). Parsing comes after;
- all chunked framing of a read is decoded with ``bytes.find`` loops, and the body of one read
  is kept as one (arrival, bytes) item; a consumer can ``collect()`` a whole response and is
  then woken once, not per read (exposed as ``response.extensions["arrivals"]``);
- an idle pool per (host, port) capped at ``max_connections``: O(1) acquire and release;
- a lazily re-armed watchdog per connection for the read timeout, not a timer per read; it
  also looks at a connection silent for a second (a reset uvloop did not report, see _probe);
- the read timeout counts *progress*: the response head, or bytes of SSE data lines. SSE
  comment lines (``: ping`` keep-alives) and blank lines are not progress, so a server that
  only pings times out like a silent one. Every connection also moves one shared
  :class:`Progress` clock, which the load driver reads to tell a stalled server (no progress on
  any in-flight request) and :meth:`FastTransport.abort` fails every in-flight response at once;
- httpcore's ``trace`` extension is honoured for ``http11.send_request_headers.started``, so
  callers learn the moment the request is written.

Failures raise httpx's own exceptions, so code written against httpx handles them unchanged:
every OS error becomes ConnectError / ReadError / WriteError, a peer that closes early
RemoteProtocolError, bytes that break HTTP/1.1 framing :class:`MalformedResponseError` (a
RemoteProtocolError), and the connect / read / write / pool timeouts ConnectTimeout /
ReadTimeout / WriteTimeout / PoolTimeout. A failed request always gives its pool slot back.

Connecting tries every address the resolver returns, in its order, each within the connect
timeout (``localhost`` often resolves to ``::1`` first while a server listens on 127.0.0.1
only); the one that answered is tried first from then on.

One retry, for the keep-alive race: a request that fails on a connection taken from the idle
pool before any byte of its response arrived (reset, broken pipe, or the peer closing) is sent
once more, on a new connection. The server closed that connection while it sat idle (uvicorn,
which serves vLLM, drops idle connections after 5 s) and the request crossed the close on the
wire, so the server never ran it: RFC 9112 §9.3.1 allows an automatic retry of a non-idempotent
request when the client can tell it was not applied, and browsers retry exactly this case. In
the rare event that the server did read it before dying, a completion has no side effect but the
work, so the retry costs a duplicate generation, never a wrong record (the caller's ``trace``
hook fires again, so its send time is the retry's). Nothing else is retried: not a timeout or a
failure after the first response byte (the request may be running), nor a failure on a new
connection.

Interim 1xx responses (100 Continue, 103 Early Hints) are skipped. Plain http:// only (vLLM
serves plain HTTP).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator

import httpx

_perf = time.perf_counter
_HEADERS, _BODY_CL, _BODY_CHUNKED, _BODY_EOF, _DONE = range(5)
_READ_SIZE = 1 << 18
# SO_TIMESTAMPNS: the kernel stamps each received packet; Python does not export the constant.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else -1)
_TS = struct.Struct("qq")  # struct timespec
_CMSG_SPACE = socket.CMSG_SPACE(_TS.size) if hasattr(socket, "CMSG_SPACE") else 0
_HEX = b"0123456789abcdefABCDEF"
# A connection silent this long while a response is awaited is checked directly (_probe).
_PROBE_S = 1.0
# Where an SSE body stands between reads: at the start of a line, in a field line, in a comment.
_LINE_START, _FIELD_LINE, _COMMENT_LINE = range(3)
_NOT_A_FIELD = b":\r\n"  # first bytes of a line that carry no event data


class Progress:
    """When any in-flight response of a transport last made progress (perf_counter).

    ``begin``/``end`` bracket each request; the clock restarts when a request starts while none
    is in flight, so idle time between requests never counts as a stall."""

    __slots__ = ("in_flight", "last")

    def __init__(self) -> None:
        self.in_flight = 0
        self.last = _perf()

    def begin(self) -> None:
        if not self.in_flight:
            self.last = _perf()
        self.in_flight += 1

    def end(self) -> None:
        self.in_flight -= 1

    def saw(self, t: float) -> None:
        if t > self.last:
            self.last = t

    def silent_for(self, now: float) -> float:
        """Seconds without progress while some request is in flight (0 when none is)."""
        return now - self.last if self.in_flight else 0.0


class MalformedResponseError(httpx.RemoteProtocolError):
    """The server's bytes break HTTP/1.1 framing (status line, headers or chunk framing)."""


class _Conn:
    """One HTTP/1.1 connection on a non-blocking socket; parses one response at a time."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, progress: Progress | None = None
    ):
        self.loop = loop
        self.sock = sock
        self.progress = progress or Progress()  # shared by a transport's connections
        self.closed = False
        self.pending = b""  # request bytes the kernel did not take yet
        self.drained: asyncio.Future | None = None  # resolves when pending is written (or lost)
        self.reset()

    def reset(self) -> None:
        self.state = _HEADERS
        self.buf = b""
        self.items: collections.deque = collections.deque()  # (arrival, bytes) of body data
        self.head: asyncio.Future | None = None  # resolves to (status, reason, headers)
        self.waiter: asyncio.Future | None = None
        self.error: Exception | None = None
        self.remaining = 0  # bytes left in the current chunk / content-length body
        self.keep_alive = True
        self.got_bytes = False
        self.collecting = False
        self.last_data = _perf()  # any byte (the probe of a silent socket)
        self.last_progress = self.last_data  # the head or SSE data (the read timeout)
        self.sse = False  # the response is text/event-stream
        self.sse_line = _LINE_START
        self.read_timeout: float | None = None
        self.timer: asyncio.TimerHandle | None = None

    # -- socket I/O -------------------------------------------------------------------
    def start(self) -> None:
        self.loop.add_reader(self.sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        try:
            data, anc, _, _ = self.sock.recvmsg(_READ_SIZE, _CMSG_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        if not data or self.head is None:
            # EOF, or bytes on an idle connection nobody asked anything: it is unusable.
            self._lost(None)
            return
        if anc:
            # Kernel receive time (CLOCK_REALTIME) moved onto the perf_counter clock: the
            # arrival time no longer depends on how busy this event loop is.
            lvl, typ, raw = anc[0]
            if lvl == socket.SOL_SOCKET and typ == _SO_TIMESTAMPNS and len(raw) >= 16:
                sec, nsec = _TS.unpack_from(raw)
                off = time.time_ns() - time.perf_counter_ns()
                self.data_received(data, (sec * 1_000_000_000 + nsec - off) * 1e-9)
                return
        self.data_received(data, _perf())

    def _lost(self, exc: OSError | None, writing: bool = False) -> None:
        """The socket failed (exc) or the peer closed it (None): close and report once."""
        self.close()
        self.connection_lost(exc, writing)

    def send(self, data: bytes) -> None:
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:  # EPIPE / ECONNRESET: the peer is gone
            self._lost(exc, writing=True)
            return
        if n < len(data):
            self.pending = data[n:]
            self.loop.add_writer(self.sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        try:
            n = self.sock.send(self.pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc, writing=True)
            return
        self.pending = self.pending[n:]
        if not self.pending:
            self.loop.remove_writer(self.sock.fileno())
            self._drained()

    async def drain(self, timeout: float | None) -> None:
        """Wait until the kernel took the whole request or the connection ended."""
        self.drained = self.loop.create_future()
        try:
            async with asyncio.timeout(timeout):
                await self.drained
        except TimeoutError as exc:
            raise httpx.WriteTimeout(f"request not written within {timeout:g} s") from exc
        finally:
            self.drained = None

    def _drained(self) -> None:
        d = self.drained
        if d is not None and not d.done():
            d.set_result(None)

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            if self.pending:
                self.loop.remove_writer(self.sock.fileno())
            self.sock.close()
        self.closed = True
        self.finish()  # a closed connection needs no watchdog
        self._drained()

    def connection_lost(self, exc: OSError | None, writing: bool = False) -> None:
        self.closed = True
        if self.state == _BODY_EOF and exc is None:
            self.state = _DONE
            self._wake()
            return
        if self.state != _DONE and self.head is not None:
            if exc is None:
                err: Exception = httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                    if self.state != _HEADERS
                    else "server disconnected without sending a response"
                )
            elif writing or self.pending:
                err = httpx.WriteError(f"sending the request: {exc}")
            else:
                err = httpx.ReadError(str(exc))
            self._fail(err)

    def data_received(self, data: bytes, t: float) -> None:
        # t: arrival time (kernel receive stamp when available), taken before any parsing
        self.last_data = t
        self.got_bytes = True
        if self.buf:
            data = self.buf + data
            self.buf = b""
        try:
            if self.state == _HEADERS:
                while self.state == _HEADERS:  # more than once only after an interim 1xx
                    rest = self._parse_head(data)
                    if rest is None:
                        return
                    data = rest
                self._progressed(t)  # the final response head
            out = self._parse_body(data)
        except ValueError as exc:
            self._fail(MalformedResponseError(f"malformed HTTP response: {exc}"))
            self.close()
            return
        if out:
            self.items.append((t, out))
            # Inline fast path: a read that starts a data line and ends a line is progress.
            if not self.sse or (
                self.sse_line == _LINE_START and out[0] not in _NOT_A_FIELD and out[-1] == 10
            ):
                self._progressed(t)
            elif self._sse_progress(out):
                self._progressed(t)
        # A collecting consumer is woken once, at the end, not per read (halves per-read cost).
        if self.state == _DONE or (out and not self.collecting):
            self._wake()

    def _progressed(self, t: float) -> None:
        self.last_progress = t
        self.progress.saw(t)

    def _sse_progress(self, out: bytes) -> bool:
        """Whether ``out`` holds a byte of an SSE field line (data, event, id, retry), and where
        the body stands after it. Comment lines (':...') and blank lines are not progress."""
        state, pos, n = self.sse_line, 0, len(out)
        while pos < n:
            if state == _LINE_START:
                first = out[pos]
                if first in _NOT_A_FIELD[1:]:  # a blank line: the end of an event
                    pos += 1
                    continue
                if first != 58:  # not ':': a field line, progress; only the end state is left
                    self.sse_line = _tail_state(out, _FIELD_LINE)
                    return True
                state = _COMMENT_LINE
            elif state == _FIELD_LINE:  # a field line continued from the previous read
                if out[pos] not in _NOT_A_FIELD[1:]:
                    self.sse_line = _tail_state(out, _FIELD_LINE)
                    return True
                pos, state = pos + 1, _LINE_START  # only its line end came now
                continue
            eol = out.find(b"\n", pos)
            if eol < 0:
                break
            pos, state = eol + 1, _LINE_START
        self.sse_line = state
        return False

    # -- parsing ----------------------------------------------------------------------
    def _parse_head(self, data: bytes) -> bytes | None:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            if len(data) > 1 << 20:
                raise ValueError("response head larger than 1 MiB")
            self.buf = data
            return None
        lines = data[:end].split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if (
            len(parts) < 2
            or not parts[0].startswith(b"HTTP/1.")
            or len(parts[1]) != 3
            or not parts[1].isdigit()
        ):
            raise ValueError(f"bad status line {lines[0][:80]!r}")
        status = int(parts[1])
        if status < 200:
            if status == 101:
                raise ValueError("101 Switching Protocols to a request that asked no upgrade")
            return data[end + 4 :]  # interim (100 Continue, 103 Early Hints): the final follows
        reason = parts[2] if len(parts) > 2 else b""
        headers = []
        chunked = False
        length = None
        keep_alive = parts[0] != b"HTTP/1.0"
        for line in lines[1:]:
            k, sep, v = line.partition(b":")
            if not sep:
                raise ValueError(f"bad header line {line[:80]!r}")
            k, v = k.strip(), v.strip()
            headers.append((k, v))
            lk = k.lower()
            if lk == b"content-type":
                self.sse = v.lower().startswith(b"text/event-stream")
            elif lk == b"transfer-encoding" and b"chunked" in v.lower():
                chunked = True
            elif lk == b"content-length":
                length = int(v)
                if length < 0:
                    raise ValueError(f"negative content-length {v[:20]!r}")
            elif lk == b"connection":
                lv = v.lower()
                if b"close" in lv:
                    keep_alive = False
                elif b"keep-alive" in lv:
                    keep_alive = True
        self.keep_alive = keep_alive
        if status in (204, 304):
            self.state = _DONE  # no body, whatever the headers say
        elif chunked:
            self.state, self.remaining = _BODY_CHUNKED, -1  # -1: expecting a size line
        elif length is not None:
            self.state, self.remaining = _BODY_CL, length
            if length == 0:
                self.state = _DONE
        else:
            self.state, self.keep_alive = _BODY_EOF, False
        if self.head is not None and not self.head.done():
            self.head.set_result((status, reason, headers))
        return data[end + 4 :]

    def _parse_body(self, data: bytes) -> bytes:
        st = self.state
        if st == _BODY_CHUNKED:
            return self._dechunk(data)
        if st == _BODY_CL:
            if len(data) >= self.remaining:
                if len(data) > self.remaining:
                    self.keep_alive = False  # bytes beyond the body: the connection is unusable
                out, self.remaining = data[: self.remaining], 0
                self.state = _DONE
                return out
            self.remaining -= len(data)
            return data
        if st == _BODY_EOF:
            return data
        if data:
            self.keep_alive = False
        return b""

    def _dechunk(self, data: bytes) -> bytes:
        # remaining: >0 payload bytes left in this chunk; -1 size line next; -2 CRLF after a
        # payload next; -3 trailers after the last chunk.
        out = []
        pos, n = 0, len(data)
        rem = self.remaining
        find = data.find
        while pos < n:
            if rem == -1:
                eol = find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > 1024:
                        raise ValueError("chunk size line too long")
                    break
                line = data[pos:eol]
                if line.strip(_HEX):  # not bare hex: a chunk extension, or garbage
                    line = line.split(b";", 1)[0].rstrip(b" \t")
                    if line.strip(_HEX):
                        raise ValueError(f"bad chunk size line {data[pos:eol][:40]!r}")
                size = int(line, 16)  # an empty line raises too
                start = eol + 2
                if size == 0:
                    rem, pos = -3, start
                    continue
                end = start + size
                if end + 2 <= n:  # common case: the whole chunk and its CRLF are here
                    if data[end : end + 2] != b"\r\n":
                        raise ValueError(f"chunk of {size} bytes not followed by CRLF")
                    out.append(data[start:end])
                    pos = end + 2
                    continue
                take = min(size, n - start)
                out.append(data[start : start + take])
                pos = start + take
                rem = size - take or -2
            elif rem > 0:
                take = min(rem, n - pos)
                out.append(data[pos : pos + take])
                pos += take
                rem = rem - take or -2
            elif rem == -2:
                if n - pos < 2:
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise ValueError("chunk data not followed by CRLF")
                pos += 2
                rem = -1
            else:  # -3: trailer lines, ended by an empty line
                eol = find(b"\r\n", pos)
                if eol < 0:
                    break
                done = eol == pos
                pos = eol + 2
                if done:
                    self.state = _DONE
                    break
        self.remaining = rem
        if pos < n:
            if self.state == _DONE:
                self.keep_alive = False  # bytes beyond the body: the connection is unusable
            else:
                self.buf = data[pos:]
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)

    # -- consumer side ----------------------------------------------------------------
    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self.error = exc
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(exc)

    def _arm(self) -> None:
        if self.timer is None:
            now = _perf()
            due = self.last_data + _PROBE_S
            if due <= now:
                due = now + _PROBE_S
            if self.read_timeout is not None:
                due = min(due, self.last_progress + self.read_timeout)
            # loop.time() and perf_counter() are both CLOCK_MONOTONIC based; convert via offset.
            self.timer = self.loop.call_at(self.loop.time() + (due - now), self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if self.state == _DONE or self.error is not None:
            return
        now = _perf()
        if self.read_timeout is not None and now - self.last_progress >= self.read_timeout - 1e-3:
            only = " (only SSE comments)" if self.last_data > self.last_progress else ""
            self._fail(httpx.ReadTimeout(f"no data for {self.read_timeout:g} s{only}"))
            self.close()
            return
        if now - self.last_data >= _PROBE_S - 1e-3:
            self._probe()
            if self.closed:
                return
        self._arm()

    def _probe(self) -> None:
        """Look at a silent socket directly. uvloop (libuv's uv_poll) treats POLLERR as fatal:
        when a reset arrives with data still unread, it runs the reader once (which reads the
        data) and then drops it, so the reset itself is never reported."""
        try:
            peek = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return  # alive, just silent
        except OSError as exc:
            self._lost(exc)
            return
        if peek:
            self._on_readable()  # bytes the loop did not deliver
        else:
            self._lost(None)

    async def next_item(self) -> tuple[float, bytes] | None:
        while True:
            if self.items:
                return self.items.popleft()
            if self.error is not None:
                raise self.error
            if self.state == _DONE:
                return None
            self.waiter = self.loop.create_future()
            self._arm()
            await self.waiter
            self.waiter = None

    def finish(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _Stream(httpx.AsyncByteStream):
    """Body items of one response; ``last_arrival`` is the read time of the last yielded item."""

    def __init__(self, transport: FastTransport, key, conn: _Conn):
        self._t = transport
        self._key = key
        self._conn = conn
        self.last_arrival = 0.0
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            item = await conn.next_item()
            if item is None:
                break
            self.last_arrival = item[0]
            yield item[1]
        self._release(reuse=True)

    def _release(self, reuse: bool) -> None:
        if self._released:
            return
        self._released = True
        conn = self._conn
        conn.finish()
        ok = reuse and conn.state == _DONE and conn.keep_alive and not conn.closed and not conn.buf
        self._t._release(self._key, conn, ok)

    async def timed(self) -> AsyncIterator[tuple[float, bytes]]:
        """Yield (arrival perf_counter, body bytes) per socket read: no httpx layers between."""
        conn = self._conn
        while True:
            item = await conn.next_item()
            if item is None:
                break
            yield item
        self._release(reuse=True)

    async def collect(self, into: list) -> None:
        """Wait for the whole body; append its (arrival, bytes) reads to ``into``.

        The reads received before a failure are appended too, then the error is raised.
        """
        conn = self._conn
        conn.collecting = True
        try:
            while conn.state != _DONE:
                if conn.error is not None:
                    raise conn.error
                conn.waiter = conn.loop.create_future()
                conn._arm()
                await conn.waiter
                conn.waiter = None
        finally:
            into.extend(conn.items)
            conn.items.clear()
        self._release(reuse=True)

    async def aclose(self) -> None:
        self._release(reuse=False)


def _tail_state(out: bytes, open_line: int) -> int:
    """Where an SSE body stands after ``out``: ``open_line`` when it holds no line end."""
    if out[-1] == 10:
        return _LINE_START
    eol = out.rfind(b"\n")
    if eol < 0:
        return open_line
    return _COMMENT_LINE if out[eol + 1] == 58 else _FIELD_LINE


def _fmt_addr(family: int, addr: tuple) -> str:
    return f"[{addr[0]}]:{addr[1]}" if family == socket.AF_INET6 else f"{addr[0]}:{addr[1]}"


class FastTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 keep-alive transport (no TLS, no HTTP/2) with O(1) pooling."""

    def __init__(self, max_connections: int = 100, progress: Progress | None = None):
        self.max_connections = max_connections
        self.progress = progress or Progress()
        self._idle: dict[tuple, list[_Conn]] = {}
        # asyncio binds a semaphore to the running loop at its first wait, not here
        self._sem = asyncio.Semaphore(max_connections)
        self._all: set[_Conn] = set()
        self._addrs: dict[tuple, list[tuple]] = {}  # resolved once per (host, port)

    async def _acquire(self, key, tmo: dict, fresh: bool) -> tuple[_Conn, bool]:
        """A pooled connection (unless ``fresh``), else a new one; ``(conn, reused)``."""
        idle = self._idle.get(key)
        while idle and not fresh:
            conn = idle.pop()
            if not conn.closed:
                return conn, True
            self._all.discard(conn)
            self._sem.release()  # the slot of an idle connection the server closed
        try:
            async with asyncio.timeout(tmo.get("pool")):
                await self._sem.acquire()
        except TimeoutError as exc:
            raise httpx.PoolTimeout("no free connection in the pool") from exc
        try:
            sock = await self._connect(key, tmo.get("connect"))
        except BaseException:
            self._sem.release()
            raise
        conn = _Conn(asyncio.get_running_loop(), sock, self.progress)
        conn.start()
        self._all.add(conn)
        return conn, False

    async def _connect(self, key, timeout: float | None) -> socket.socket:
        """A connected socket to the first of the host's addresses that accepts."""
        loop = asyncio.get_running_loop()
        host, port = key
        infos = self._addrs.get(key)
        if infos is None:  # getaddrinfo runs in a thread: once per host
            try:
                async with asyncio.timeout(timeout):
                    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except TimeoutError as exc:
                raise httpx.ConnectTimeout(f"resolving {host} timed out") from exc
            except OSError as exc:
                raise httpx.ConnectError(f"cannot resolve {host}: {exc}") from exc
            if not infos:
                raise httpx.ConnectError(f"cannot resolve {host}: no address")
            infos = self._addrs[key] = list(infos)
        tried = []
        timeouts = 0
        for info in list(infos):
            family, _, proto, _, addr = info
            try:
                sock = socket.socket(family, socket.SOCK_STREAM, proto)
            except OSError as exc:
                tried.append(f"{_fmt_addr(family, addr)}: {exc}")
                continue
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with contextlib.suppress(OSError):  # kernel RX timestamps (Linux)
                    sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                async with asyncio.timeout(timeout):  # each address gets the whole timeout
                    await loop.sock_connect(sock, addr)
            except TimeoutError:  # before OSError: TimeoutError is one
                sock.close()
                timeouts += 1
                tried.append(f"{_fmt_addr(family, addr)}: timed out after {timeout:g} s")
                continue
            except OSError as exc:
                sock.close()
                tried.append(f"{_fmt_addr(family, addr)}: {exc.strerror or exc}")
                continue
            except BaseException:
                sock.close()
                raise
            if info is not infos[0] and info in infos:  # answered after others failed: try it first
                infos.remove(info)
                infos.insert(0, info)
            return sock
        cls = httpx.ConnectTimeout if timeouts == len(tried) else httpx.ConnectError
        raise cls(f"connect to {host}:{port} failed: " + "; ".join(tried))

    def _release(self, key, conn: _Conn, reuse: bool) -> None:
        if reuse:
            conn.reset()
            self._idle.setdefault(key, []).append(conn)
        else:
            # A reused connection keeps its slot; a dropped one frees it.
            self._all.discard(conn)
            conn.close()
            self._sem.release()

    async def _exchange(self, conn: _Conn, wire: bytes, request: httpx.Request, tmo: dict):
        """Write the request on ``conn`` and wait for the head of its final response."""
        conn.read_timeout = tmo.get("read")
        conn.head = conn.loop.create_future()
        trace = request.extensions.get("trace")
        if trace is not None:
            await trace("http11.send_request_headers.started", {"request": request})
        if not conn.closed:  # the peer may have closed it while trace ran
            conn.send(wire)
        if conn.pending and not conn.closed:
            await conn.drain(tmo.get("write"))
        conn.last_data = conn.last_progress = _perf()
        conn._arm()
        return await conn.head

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol("FastTransport speaks plain http:// only")
        tmo = request.extensions.get("timeout", {})
        key = (request.url.host, request.url.port or 80)
        body = request.read()
        target = request.url.raw_path
        lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
        for k, v in request.headers.raw:
            if k.lower() not in (b"content-length", b"transfer-encoding"):
                lines.append(k + b": " + v)
        lines.append(b"content-length: " + str(len(body)).encode())
        wire = b"\r\n".join(lines) + b"\r\n\r\n" + body
        fresh = False
        while True:
            conn, reused = await self._acquire(key, tmo, fresh)
            try:
                status, reason, headers = await self._exchange(conn, wire, request, tmo)
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
                self._release(key, conn, False)
                if reused and not conn.got_bytes:
                    fresh = True  # the keep-alive race (module docstring): once, on a new one
                    continue
                raise
            except BaseException:
                self._release(key, conn, False)
                raise
            stream = _Stream(self, key, conn)
            return httpx.Response(
                status,
                headers=headers,
                stream=stream,
                extensions={
                    "http_version": b"HTTP/1.1",
                    "reason_phrase": reason,
                    "arrivals": stream,
                },
            )

    def abort(self, exc: Exception) -> None:
        """Fail every response in flight with ``exc`` (a stalled server: nothing to wait for);
        what each one received so far stays with its caller."""
        for conn in list(self._all):
            if conn.head is not None and conn.state != _DONE and conn.error is None:
                conn._fail(exc)
                conn.close()

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
