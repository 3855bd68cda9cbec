"""A small, fast OpenAI-style streaming server for the tests and the client benchmarks.

It stands in for a vLLM server where the point is the *client*: it speaks the exact streaming
format vLLM 0.32 sends (role chunk, content chunks, finish chunk, usage chunk, ``[DONE]``, each
SSE event as one HTTP/1.1 chunk, as uvicorn frames them), emits several tokens per chunk on a
configured cadence, can inject faults, and logs its own emission times (``time.perf_counter``,
the same system-wide monotonic clock the client uses) so measured times can be checked.

Written on raw asyncio streams (uvloop when installed) so that it costs far less per chunk than
any client it serves. Run it with :func:`serve_in_thread` (tests) or :func:`serve_in_subprocess`
(benchmarks: the server gets its own process and CPU), or ``python -m
avbench.testing.fake_server --port 8000`` (``--help``: its options) to try the client by hand.

Faults (per request): ``http_5xx``, ``http_4xx``, ``cut`` (connection closed mid-stream),
``stall`` (half the stream, then silence), ``malformed`` (one chunk of broken JSON),
``slow_first`` (first token after ``slow_first_delay_s``), ``reset`` (TCP reset mid-stream),
``bad_chunk`` (one HTTP chunk whose data is not followed by CRLF), ``interim`` (``100 Continue``
and ``103 Early Hints`` before the response), ``pings`` (half the stream, then only SSE comments,
``: ping``, every ``ping_interval_s``: a server alive on the wire whose generation stopped),
``engine_dead`` (half the stream, then vLLM's in-stream error event and ``[DONE]``, what its API
server sends when the engine behind it dies; from then on, as vLLM's, every request gets that
event at once and ``/health`` answers 503), ``no_finish`` (the whole stream and ``[DONE]``
with no finish_reason).
Chosen by the ``x-fake-fault`` header, a ``@fault:<kind>`` marker in the last user message /
prompt, the request's arrival index (``faults_by_index``) or a seeded probability
(``fault_probs``). ``tokenize=False`` drops vLLM's /tokenize, as other OpenAI-style servers do.

``idle_timeout_s`` closes a keep-alive connection left idle that long after a response, as
uvicorn's keep-alive timeout does (with a TCP reset when ``idle_reset``): the race of a client
that reuses the connection just as the server drops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from avbench.capture_protocol import PREFIX_RESET_PATH
from avbench.commands.request import Request, command

FAULT_KINDS = (
    "http_5xx",
    "http_4xx",
    "cut",
    "stall",
    "malformed",
    "slow_first",
    "reset",
    "bad_chunk",
    "interim",
    "pings",
    "engine_dead",
    "no_finish",
)
# What vLLM 0.32's API server streams when its engine core dies mid-generation.
ENGINE_DEAD_EVENT = (
    b'data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for '
    b'the root cause.", "type": "InternalServerError", "param": null, "code": 500}}\n\n'
)
_FAULT_MARK = re.compile(r"@fault:([a-z_0-9]+)")
# Token texts: plain ASCII words so the JSON needs no escaping work per chunk.
_VOCAB = [f" w{i}" for i in range(97)]
_WORD_ID = re.compile(r"w(\d{1,2})")


@dataclass
class ServerConfig:
    model: str = "fake-model"
    tokens_per_chunk: int = 3
    output_tokens: int | None = None  # None: the request's max_tokens
    first_token_delay_s: float = 0.0
    inter_chunk_delay_s: float = 0.0  # 0: as fast as the loop goes (each chunk still yields)
    # Explicit schedule, overriding the cadence: [(delay before chunk i, tokens in chunk i)].
    chunk_script: list[tuple[float, int]] | None = None
    faults_by_index: dict[int, str] = field(default_factory=dict)
    fault_probs: dict[str, float] = field(default_factory=dict)
    fault_seed: int = 0
    slow_first_delay_s: float = 0.5
    stall_s: float = 3600.0  # how long a stalled stream stays silent before the server drops it
    ping_interval_s: float = 0.1  # the "pings" fault: one SSE comment this often
    tokenize: bool = True  # serve vLLM's /tokenize and /detokenize (False: 404, like other servers)
    record: bool = True  # keep per-request emission logs (served at GET /_emissions)
    keep_bodies: bool = False  # keep each request's JSON body in its log (for multi-turn tests)
    idle_timeout_s: float | None = None  # close keep-alive connections idle this long
    idle_reset: bool = False  # ... with a TCP reset (SO_LINGER 0) instead of a FIN
    api_key: str | None = None  # like vLLM's --api-key: 401 without "Bearer <key>"


@dataclass
class Emission:
    index: int  # arrival order on this server
    received_at: float  # perf_counter when the request body was complete
    api: str
    fault: str | None
    text_prefix: str  # the unique first token, e.g. "<17>", identifying the response
    times: list[float] = field(default_factory=list)  # write time of each token-bearing chunk
    tokens: list[int] = field(default_factory=list)
    body: dict | None = None


class _State:
    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        self.count = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.connections = 0  # connections that carried completions (keep-alive reuse: few)
        self.idle_closed = 0  # of those, closed by idle_timeout_s
        self.prefix_resets = 0
        self.emissions: list[Emission] = []
        self.rng = random.Random(cfg.fault_seed)
        self.stop = asyncio.Event()
        self.engine_dead = False  # an engine_dead fault happened: the HTTP front serves on


def _choose_fault(st: _State, idx: int, headers: dict[str, str], body: dict) -> str | None:
    fault = headers.get("x-fake-fault")
    if fault is None:
        text = body.get("prompt")
        if text is None:
            msgs = body.get("messages") or []
            text = next((m.get("content") for m in reversed(msgs) if m.get("role") == "user"), "")
        m = _FAULT_MARK.search(str(text or ""))
        fault = m.group(1) if m else st.cfg.faults_by_index.get(idx)
    if fault is None and st.cfg.fault_probs:
        r = st.rng.random()
        acc = 0.0
        for kind, p in st.cfg.fault_probs.items():
            acc += p
            if r < acc:
                fault = kind
                break
    return fault


def _schedule(cfg: ServerConfig, n_out: int, fault: str | None) -> list[tuple[float, int]]:
    if cfg.chunk_script is not None:
        sched = [(float(d), int(n)) for d, n in cfg.chunk_script]
    else:
        sched = []
        left = n_out
        while left > 0:
            n = min(cfg.tokens_per_chunk, left)
            sched.append((cfg.first_token_delay_s if not sched else cfg.inter_chunk_delay_s, n))
            left -= n
    if fault == "slow_first" and sched:
        sched[0] = (cfg.slow_first_delay_s, sched[0][1])
    return sched


_MID_STREAM_FAULTS = ("cut", "stall", "malformed", "reset", "bad_chunk", "pings", "engine_dead")


def _frame(payload: bytes) -> bytes:
    # One SSE event = one HTTP chunk, as uvicorn writes vLLM's StreamingResponse.
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _head(rid: str, obj: str, created: int, model: str) -> str:
    return (
        f'{{"id":"{rid}","object":"{obj}","created":{created},"model":"{model}",'
        '"choices":[{"index":0,'
    )


class _Renderer:
    """Pre-built byte templates of vLLM 0.32's chunk JSON (see the captured fixtures)."""

    def __init__(self, api: str, rid: str, model: str, created: int, token_ids: bool):
        self.api = api
        self.token_ids = token_ids
        self.role: str | None
        if api == "chat":
            head = _head(f"chatcmpl-{rid}", "chat.completion.chunk", created, model)
            self.role = (
                "data: "
                + head
                + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
                + '"prompt_token_ids":%s,"prompt_text":null}\n\n'
            )
            self.pre = ("data: " + head + '"delta":{"content":"').encode()
            self.mid = b'"},"logprobs":null,"finish_reason":'
        else:
            head = _head(f"cmpl-{rid}", "text_completion", created, model)
            self.role = None
            self.pre = ("data: " + head + '"text":"').encode()
            self.mid = b'","logprobs":null,"finish_reason":'
        self.usage_head = ("data: " + head.split('"choices"')[0] + '"choices":[],').encode()

    def chunk(self, text: str, ids: list[int], finish: str | None) -> bytes:
        fin = b"null" if finish is None else b'"%s","stop_reason":null' % finish.encode()
        if self.api == "completions" and finish is None:
            fin = b'null,"stop_reason":null,"prompt_token_ids":null'
        elif self.api == "completions":
            fin += b',"prompt_token_ids":null'
        tid = ("[" + ",".join(map(str, ids)) + "]").encode() if self.token_ids else b"null"
        return self.pre + text.encode() + self.mid + fin + b',"token_ids":' + tid + b"}]}\n\n"

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return (
            self.usage_head
            + (
                f'"usage":{{"prompt_tokens":{prompt_tokens},'
                f'"total_tokens":{prompt_tokens + completion_tokens},'
                f'"completion_tokens":{completion_tokens}}},'
                '"system_fingerprint":"fake-0.32.0"}\n\n'
            ).encode()
        )


_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else -1)
_TS = struct.Struct("qq")
_CMSG = socket.CMSG_SPACE(_TS.size) if hasattr(socket, "CMSG_SPACE") else 0


class _SConn:
    """One server-side connection on a non-blocking socket.

    Reads use recvmsg with the kernel's receive timestamps, so a request's ``received_at`` is
    when its first byte reached this host, not when this (possibly busy) loop got to it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket):
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.rbuf = b""
        self.rbuf_t = 0.0  # arrival of rbuf's first byte
        self.eof = False
        self.closed = False
        self.waiter: asyncio.Future | None = None
        self.wbuf = bytearray()
        self.drained: asyncio.Future | None = None
        loop.add_reader(self.fd, self._on_readable)

    def _wake(self, fut: asyncio.Future | None) -> None:
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _on_readable(self) -> None:
        try:
            data, anc, _, _ = self.sock.recvmsg(1 << 16, _CMSG)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, anc = b"", []
        if not data:
            self.eof = True
            self.loop.remove_reader(self.fd)
            self._wake(self.waiter)
            return
        t = time.perf_counter()
        if anc and anc[0][1] == _SO_TIMESTAMPNS:
            sec, nsec = _TS.unpack_from(anc[0][2])
            t = (sec * 1_000_000_000 + nsec - (time.time_ns() - time.perf_counter_ns())) * 1e-9
        if not self.rbuf:
            self.rbuf_t = t
        self.rbuf += data
        self._wake(self.waiter)

    async def _more(self) -> bool:
        if self.eof:
            return False
        self.waiter = self.loop.create_future()
        await self.waiter
        self.waiter = None
        return True

    async def wait_request(self, timeout: float) -> bool:
        """Whether request bytes (or EOF) came within ``timeout`` seconds."""
        if self.rbuf or self.eof:
            return True
        try:
            async with asyncio.timeout(timeout):
                await self._more()
        except TimeoutError:
            self.waiter = None
            return False
        return True

    async def read_request(self) -> tuple[float, str, str, dict, bytes] | None:
        while (end := self.rbuf.find(b"\r\n\r\n")) < 0:
            if not await self._more():
                return None
        t = self.rbuf_t
        lines = self.rbuf[:end].decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        while len(self.rbuf) < end + 4 + n:
            if not await self._more():
                return None
        body = self.rbuf[end + 4 : end + 4 + n]
        self.rbuf = self.rbuf[end + 4 + n :]
        return t, method, path, headers, body

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self.wbuf:
            self.wbuf += data
            return
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self.abort()
            return
        if n < len(data):
            self.wbuf += data[n:]
            self.loop.add_writer(self.fd, self._on_writable)

    def _on_writable(self) -> None:
        try:
            n = self.sock.send(self.wbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort()
            return
        del self.wbuf[:n]
        if not self.wbuf:
            self.loop.remove_writer(self.fd)
            self._wake(self.drained)

    def buffered(self) -> int:
        return len(self.wbuf)

    async def drain(self) -> None:
        while self.wbuf and not self.closed:
            self.drained = self.loop.create_future()
            await self.drained

    def abort(self, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if reset:  # SO_LINGER 0: close() sends a TCP RST, not a FIN
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.loop.remove_reader(self.fd)
        if self.wbuf:
            self.loop.remove_writer(self.fd)
        self.sock.close()
        self._wake(self.waiter)
        self._wake(self.drained)


def _plain(writer: _SConn, status: int, reason: str, body: bytes) -> None:
    writer.write(
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (status, reason.encode(), len(body), body)
    )


def _refused(writer: _SConn, fault: str | None) -> bool:
    """Answer with an error status when the fault asks for one (or is unknown)."""
    if fault is not None and fault not in FAULT_KINDS:  # a misspelt fault must not pass silently
        known = ", ".join(FAULT_KINDS)
        msg = json.dumps({"error": {"message": f"unknown fault {fault!r} (known: {known})"}})
        _plain(writer, 400, "Bad Request", msg.encode())
    elif fault == "http_5xx":
        _plain(writer, 500, "Internal Server Error", b'{"error":{"message":"injected 5xx"}}')
    elif fault == "http_4xx":
        _plain(writer, 400, "Bad Request", b'{"error":{"message":"injected 4xx"}}')
    else:
        return False
    return True


async def _mid_stream_fault(st: _State, writer: _SConn, fault: str | None) -> bool:
    """The fault injected halfway through the stream; True when it ended the stream."""
    if fault in ("cut", "reset"):
        # No terminating chunk: the client sees the stream end early (or reset).
        writer.abort(reset=fault == "reset")
        return True
    if fault == "engine_dead":
        st.engine_dead = True
        writer.write(_frame(ENGINE_DEAD_EVENT) + _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True
    if fault == "bad_chunk":
        writer.write(b"5\r\nhelloXX")  # the CRLF after the data is missing
    if fault in ("stall", "pings"):
        # Silent (or pinging) until the client gives up (EOF), the server stops, or stall_s.
        t_end = time.perf_counter() + st.cfg.stall_s
        t_ping = time.perf_counter()
        while not (writer.eof or st.stop.is_set() or time.perf_counter() > t_end):
            if fault == "pings" and time.perf_counter() >= t_ping:
                writer.write(_frame(b": ping\n\n"))
                t_ping += st.cfg.ping_interval_s
            await asyncio.sleep(0.02)
        writer.abort()
        return True
    if fault == "malformed":
        writer.write(_frame(b'data: {"id":"broken","choices":[{"delta":{"content":"x\n\n'))
    return False


async def _sleep_until(t_next: float) -> None:
    wait = t_next - time.perf_counter()
    if wait <= 0:
        await asyncio.sleep(0)  # yield so all streams interleave, like engine steps
    # uvloop's timers have 1 ms granularity and can fire a little early: sleep until due.
    while wait > 0:
        await asyncio.sleep(wait)
        wait = t_next - time.perf_counter()


def _prompt_tokens(api: str, body: dict) -> int:
    if api == "completions":
        return max(1, len(tokenize(str(body.get("prompt")))))
    return max(1, len(json.dumps(body.get("messages"))) // 4)


def _open_stream(writer: _SConn, r: _Renderer, fault: str | None, prompt_tokens: int) -> None:
    """The response head (after interim responses when the fault asks) and the role chunk."""
    if fault == "interim":
        writer.write(
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 103 Early Hints\r\nlink: </v1/models>; rel=preload\r\n\r\n"
        )
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    if r.role is not None:
        pids = "[" + ",".join(["1"] * prompt_tokens) + "]" if r.token_ids else "null"
        writer.write(_frame((r.role % pids).encode()))


async def _stream(
    st: _State, writer: _SConn, api: str, headers: dict, raw: bytes, received: float
) -> None:
    cfg = st.cfg
    body = json.loads(raw)
    idx = st.count
    st.count += 1
    fault = "engine_dead" if st.engine_dead else _choose_fault(st, idx, headers, body)
    if _refused(writer, fault):
        return
    max_tokens = int(body.get("max_tokens") or 16)
    n_out = cfg.output_tokens if cfg.output_tokens is not None else max_tokens
    sched = _schedule(cfg, n_out, fault)
    n_out = sum(n for _, n in sched)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    prompt_tokens = _prompt_tokens(api, body)
    em = Emission(idx, received, api, fault, f"<{idx}>", body=body if cfg.keep_bodies else None)
    if cfg.record:
        st.emissions.append(em)
    want_ids = bool(body.get("return_token_ids"))
    r = _Renderer(api, f"{idx:016x}", cfg.model, int(time.time()), want_ids)
    _open_stream(writer, r, fault, prompt_tokens)
    cut_at = len(sched) // 2 if fault in _MID_STREAM_FAULTS else -1
    if st.engine_dead:
        cut_at = 0
    t_next = time.perf_counter()
    tok = 0
    for i, (delay, n) in enumerate(sched):
        if i == cut_at and await _mid_stream_fault(st, writer, fault):
            return
        # Absolute schedule so that write/loop costs do not accumulate into drift.
        t_next += delay
        await _sleep_until(t_next)
        if i == 0:
            text = em.text_prefix + "".join(_VOCAB[(idx + k) % 97] for k in range(1, n))
        else:
            text = "".join(_VOCAB[(idx + tok + k) % 97] for k in range(n))
        ids = list(range(tok, tok + n))
        tok += n
        finish = "length" if i == len(sched) - 1 and fault != "no_finish" else None
        data = _frame(r.chunk(text, ids, finish))
        if cfg.record:
            # Stamped just before the write: once written, the client may wake and preempt us.
            em.times.append(time.perf_counter())
            em.tokens.append(n)
        writer.write(data)
        if writer.buffered() > 1 << 16:
            await writer.drain()
        if writer.closed:
            return
    if include_usage:
        writer.write(_frame(r.usage(prompt_tokens, n_out)))
    writer.write(_frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")


def tokenize(text: str) -> list[int]:
    """The server's tokenizer: one token per whitespace-separated word, id from the word
    (" w<i>" is token i, as streamed); a completion prompt is counted with it."""
    ids = []
    for word in text.split():
        m = _WORD_ID.fullmatch(word)
        n = int(m.group(1)) if m is not None else len(_VOCAB)
        ids.append(n if n < len(_VOCAB) else zlib.crc32(word.encode()) % len(_VOCAB))
    return ids


def _tokenizer_endpoint(path: str, raw: bytes) -> bytes:
    """vLLM's POST /tokenize ({"prompt"} -> {"tokens", "count"}) and /detokenize."""
    body = json.loads(raw or b"{}")
    if path == "/tokenize":
        ids = tokenize(str(body.get("prompt", "")))
        return json.dumps({"tokens": ids, "count": len(ids), "max_model_len": 1 << 20}).encode()
    return json.dumps({"prompt": "".join(_VOCAB[i % len(_VOCAB)] for i in body["tokens"])}).encode()


def _make_handler(st: _State):
    async def handle(writer: _SConn) -> None:
        streamed = False
        served = False
        idle = st.cfg.idle_timeout_s
        try:
            while True:
                if served and idle is not None and not await writer.wait_request(idle):
                    writer.abort(reset=st.cfg.idle_reset)
                    if streamed:
                        st.idle_closed += 1
                    break
                served = True
                req = await writer.read_request()
                if req is None:
                    break
                received, method, path, headers, raw = req
                if (
                    st.cfg.api_key is not None
                    and (path.startswith("/v1/") or path == PREFIX_RESET_PATH)
                    and headers.get("authorization") != f"Bearer {st.cfg.api_key}"
                ):
                    _plain(writer, 401, "Unauthorized", b'{"error":"Unauthorized"}')
                elif path == "/v1/chat/completions" or path == "/v1/completions":
                    if not streamed:
                        streamed = True
                        st.connections += 1
                    st.in_flight += 1
                    st.max_in_flight = max(st.max_in_flight, st.in_flight)
                    try:
                        api = "chat" if "chat" in path else "completions"
                        await _stream(st, writer, api, headers, raw, received)
                    finally:
                        st.in_flight -= 1
                    if writer.closed:
                        break
                elif path == PREFIX_RESET_PATH:  # as avbench's route in a launched vLLM
                    st.prefix_resets += 1
                    _plain(writer, 200, "OK", b'{"success":true}')
                elif path == "/_emissions":
                    _plain(
                        writer, 200, "OK", json.dumps([asdict(e) for e in st.emissions]).encode()
                    )
                elif path == "/_stats":
                    stats = {
                        "requests": st.count,
                        "in_flight": st.in_flight,
                        "max_in_flight": st.max_in_flight,
                        "connections": st.connections,
                        "idle_closed": st.idle_closed,
                        "prefix_resets": st.prefix_resets,
                    }
                    _plain(writer, 200, "OK", json.dumps(stats).encode())
                elif path == "/_revive":  # the engine back, as after a restart; no more faults
                    st.engine_dead = False
                    st.cfg.faults_by_index.clear()
                    st.cfg.fault_probs.clear()
                    _plain(writer, 200, "OK", b"{}")
                elif path == "/_reset":
                    st.emissions.clear()
                    st.count = st.max_in_flight = st.connections = st.idle_closed = 0
                    st.prefix_resets = 0
                    _plain(writer, 200, "OK", b"{}")
                elif path in ("/tokenize", "/detokenize") and st.cfg.tokenize:
                    _plain(writer, 200, "OK", _tokenizer_endpoint(path, raw))
                elif path == "/health" and st.engine_dead:
                    _plain(writer, 503, "Service Unavailable", b"")
                elif path in ("/health", "/v1/models"):
                    models = {"object": "list", "data": [{"id": st.cfg.model, "object": "model"}]}
                    _plain(writer, 200, "OK", json.dumps(models).encode())
                else:
                    _plain(writer, 404, "Not Found", b'{"error":"not found"}')
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.abort()

    return handle


class RunningServer:
    """Handle on a started server: its URL and (in-thread) its live state."""

    def __init__(self, port: int, state: _State | None = None, proc=None):
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self._state = state
        self.proc = proc

    def _get(self, path: str):
        import httpx

        return httpx.get(self.base_url + path, timeout=30).json()

    def emissions(self) -> list[dict]:
        return self._get("/_emissions")

    def stats(self) -> dict:
        return self._get("/_stats")

    def reset(self) -> None:
        self._get("/_reset")

    def revive(self) -> None:
        """A dead engine serves again and no further fault is injected."""
        self._get("/_revive")


def _forget(conns: set[_SConn], conn: _SConn, task: asyncio.Task) -> None:
    conns.discard(conn)


async def _serve(cfg: ServerConfig, host: str, port: int, ready) -> None:
    st = _State(cfg)
    loop = asyncio.get_running_loop()
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((host, port))
    lsock.listen(4096)
    lsock.setblocking(False)
    handler = _make_handler(st)
    conns: set[_SConn] = set()
    tasks: set[asyncio.Task] = set()

    async def accept() -> None:
        while True:
            sock, _ = await loop.sock_accept(lsock)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            conn = _SConn(loop, sock)
            conns.add(conn)
            task = loop.create_task(handler(conn))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            task.add_done_callback(functools.partial(_forget, conns, conn))

    acceptor = loop.create_task(accept())
    ready(lsock.getsockname()[1], st)
    try:
        await st.stop.wait()
    finally:
        acceptor.cancel()
        for c in list(conns):
            c.abort()
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(acceptor, *tasks, return_exceptions=True)
        lsock.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


@contextlib.contextmanager
def serve_in_thread(
    cfg: ServerConfig | None = None, host: str = "127.0.0.1"
) -> Iterator[RunningServer]:
    """Run the server on its own event loop in a daemon thread (tests)."""
    cfg = cfg or ServerConfig()
    loop = _new_loop()
    box: dict = {}
    started = threading.Event()

    def ready(port, st):
        box["port"], box["state"] = port, st
        started.set()

    def run():
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(_serve(cfg, host, 0, ready))
        except BaseException as exc:  # surface start-up errors to the caller
            box["error"] = exc
            started.set()

    th = threading.Thread(target=run, daemon=True, name="fake-stream-server")
    th.start()
    started.wait(10)
    if "error" in box:
        raise box["error"]
    try:
        yield RunningServer(box["port"], box["state"])
    finally:
        loop.call_soon_threadsafe(box["state"].stop.set)
        th.join(10)


@contextlib.contextmanager
def serve_in_subprocess(
    cfg: ServerConfig | None = None, cpus: Sequence[int] | None = None
) -> Iterator[RunningServer]:
    """Run the server in its own process group (optionally pinned to ``cpus``); killed on exit."""
    cfg = cfg or ServerConfig()
    cmd = [
        sys.executable,
        "-m",
        "avbench.testing.fake_server",
        "--port",
        "0",
        "--config-json",
        json.dumps(asdict(cfg)),
    ]
    if cpus is not None:
        cmd += ["--cpus", ",".join(map(str, cpus))]
    # The package root on PYTHONPATH, so `-m avbench...` works from a checkout too.
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, start_new_session=True, text=True, env=env)
    try:
        assert proc.stdout is not None  # stdout=PIPE
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"fake stream server did not start (got {line!r})")
        yield RunningServer(int(line.split()[1]), proc=proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _config_from_json(text: str) -> ServerConfig:
    d = json.loads(text)
    d["faults_by_index"] = {int(k): v for k, v in d.get("faults_by_index", {}).items()}
    if d.get("chunk_script") is not None:
        d["chunk_script"] = [tuple(x) for x in d["chunk_script"]]
    return ServerConfig(**d)


_MAX_DELAY_MS = 3_600_000.0  # an hour: past it a delay is a typo

cli = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
Opt = typer.Option


class ServeRequest(Request):
    """What ``python -m avbench.testing.fake_server`` was asked."""

    port: Annotated[int, Opt(help="Port to listen on (0: any free port).")] = 8000
    host: Annotated[str, Opt(help="Address to bind.")] = "127.0.0.1"
    tokens_per_chunk: Annotated[int, Opt(min=1, max=1 << 20, help="Tokens in each chunk.")] = 3
    inter_chunk_ms: Annotated[
        float, Opt(min=0, max=_MAX_DELAY_MS, help="Delay between chunks (ms).")
    ] = 0.0
    first_token_ms: Annotated[
        float, Opt(min=0, max=_MAX_DELAY_MS, help="Delay before the first chunk (ms).")
    ] = 0.0
    model: Annotated[str, Opt(help="Model name the server reports.")] = "fake-model"
    config_json: Annotated[
        str | None,
        Opt(help="Every ServerConfig field as JSON (faults, scripts), in place of the above."),
    ] = None
    cpus: Annotated[str | None, Opt(help="Pin to these CPUs, e.g. 1,2")] = None

    def config(self) -> ServerConfig:
        if self.config_json:
            return _config_from_json(self.config_json)
        return ServerConfig(
            model=self.model,
            tokens_per_chunk=self.tokens_per_chunk,
            inter_chunk_delay_s=self.inter_chunk_ms / 1e3,
            first_token_delay_s=self.first_token_ms / 1e3,
            record=False,  # by hand the logs would only grow
        )


@cli.command()
@command(ServeRequest)
def serve(req: ServeRequest) -> None:
    """Serve until Ctrl-C; prints ``PORT <n>`` once listening."""
    from avbench.errors import AvbenchError
    from avbench.inputs.checks import check_port
    from avbench.serving.server import port_holder

    port, host = req.port, req.host
    if port != 0:
        check_port(port)
    if req.cpus:
        os.sched_setaffinity(0, {int(c) for c in req.cpus.split(",")})
    try:
        _run(req.config(), host, port)
    except OSError as exc:  # bind: a busy port, an address this host does not have
        if exc.errno == errno.EADDRINUSE:
            holder = port_holder(port)
            who = f" by pid {holder[0]} ({holder[1][:120]})" if holder else ""
            raise AvbenchError(
                f"--port {port}: already in use on {host}{who}; pass another --port (0: any)"
            ) from None
        raise AvbenchError(
            f"--host {host} --port {port}: cannot listen ({exc.strerror or exc})"
        ) from None


def _run(cfg: ServerConfig, host: str, port: int) -> None:
    loop = _new_loop()
    asyncio.set_event_loop(loop)

    def ready(port, st):
        print(f"PORT {port}", flush=True)
        loop.add_signal_handler(signal.SIGTERM, st.stop.set)
        loop.add_signal_handler(signal.SIGINT, st.stop.set)

    loop.run_until_complete(_serve(cfg, host, port, ready))


if __name__ == "__main__":
    from avbench.cli import main

    main(cli)
