"""The load driver: streams requests to an OpenAI-compatible server and records every chunk.

One shared ``httpx.AsyncClient`` (HTTP/1.1 keep-alive, pool sized to the concurrency) sends
``stream=true`` requests with ``stream_options.include_usage``. Two schedules:

- closed loop (``concurrency=N``): N workers, each runs one conversation at a time, so exactly N
  conversations are in flight;
- open loop (``rate=R``): conversation *i* starts at ``t0 + i/R`` (or at seeded Poisson
  arrivals), an absolute schedule so that per-request costs never accumulate into drift;
  ``concurrency`` then caps how many are in flight. (asyncio-throttle does not fit here: its
  Throttler is a sliding window that polls with a fixed sleep, 10 ms by default, so the send
  times it yields drift from the schedule; awaiting each absolute due time meets the 1% target.)

Timing is ``time.perf_counter()``. ``sent_at`` is taken when the request is about to be written
(httpcore's ``trace`` hook, honoured by our transport), so pool waits and connects are not
charged to TTFT. Each socket read is stamped on arrival, before any parsing, with the kernel's
receive time where Linux provides it (see ``transport.py``); every SSE event gets the time of
the read that completed it. All JSON parsing of a response is done once, after its last byte
(one msgspec decode over all its events, reading only the fields used), which keeps the per-read
work to the socket read and the HTTP chunk framing.

Token counts per chunk: vLLM (0.32 and later) honours ``"return_token_ids": true`` in streaming
chat and completions requests and then puts each chunk's generated ``token_ids`` in it, so the
count is exact. When a server does not send them (another server, or vLLM hiding a reasoning
parser's tokens) each content-bearing chunk counts as one token (vLLM streams a chunk even for a
token that decodes to ""), and if the server's ``usage.completion_tokens`` is larger, the
difference is spread over the chunks in proportion to their text length (speculative chunks
carry several tokens and proportionally more text); the record's total then equals the usage.

Waiting is bounded (``EndpointConfig.timeouts``): each request by ``request_s`` and by
``read_s`` without progress (SSE comments are not progress, see ``transport.py``), and the whole
drive by two cell-level guards. When no in-flight request made progress for ``stall_s`` the
server's ``/health`` is asked (its answer goes into the reason: vLLM's reports a dead engine,
not a stuck one) and, if still nothing came, the drive stops as "server stalled": every
in-flight request fails at once with what it received kept, and no further request starts.
After ``cell_s`` the drive stops the same way as "cell deadline".
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import msgspec

from avbench.inputs.request import EndpointConfig, SamplingParams
from avbench.loadgen.records import RequestRecord
from avbench.loadgen.transport import FastTransport, MalformedResponseError, Progress
from avbench.workloads.base import Conversation

_perf = time.perf_counter
_DONE = b"data: [DONE]"
_HEALTH_TIMEOUT_S = 5.0  # the /health question of a stall (or stall_s when shorter)
_STOP_GRACE_S = 2.0  # after a stop, how long in-flight requests get to record their failure


@dataclass(frozen=True)
class Stop:
    """Why a drive ended before its conversations did."""

    kind: Literal["stalled", "deadline"]
    reason: str


class StreamAborted(httpx.TransportError):
    """An in-flight request failed by the drive itself (a stall or the cell deadline)."""

    def __init__(self, stop: Stop):
        super().__init__(stop.reason)
        self.kind = stop.kind


@dataclass(frozen=True)
class Load:
    """How a drive issues its conversations: closed loop (``concurrency``) or open loop
    (``rate``, with ``concurrency`` capping how many are in flight); the first ``warmup`` are
    warmup. ``poisson_seed``: seeded Poisson arrivals instead of evenly spaced ones."""

    concurrency: int | None = None
    rate: float | None = None
    warmup: int = 0
    poisson_seed: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency is None and self.rate is None:
            raise ValueError("drive: give concurrency (closed loop) or rate (open loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"drive: concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"drive: rate must be > 0 req/s, got {self.rate}")


@dataclass(frozen=True)
class DriveHooks:
    """What the caller plugs into a drive.

    ``on_record``: called with every finished record (warmup too). ``render_prompt``: turns chat
    messages into a completions prompt. ``before_measure``/``after_measure``: awaited around the
    measured phase (the metrics scrapes); a server frozen there stalls the drive like a request.
    ``finish_when``: asked as each measured request finishes; once it says True no new
    conversation starts, those in flight finish, and the window ends with the last of them."""

    on_record: Callable[[RequestRecord], None] | None = None
    render_prompt: Callable[[list[dict]], str] | None = None
    before_measure: Callable[[], Awaitable[None]] | None = None
    after_measure: Callable[[], Awaitable[None]] | None = None
    finish_when: Callable[[RequestRecord], bool] | None = None


@dataclass(repr=False)
class DriveResult:
    records: list[RequestRecord]  # warmup records included, flagged warmup=True
    window_start: float | None  # perf_counter when the first measured request was sent
    window_end: float | None  # perf_counter when the last measured request finished
    sent: int = 0  # measured requests sent (turns that were actually attempted)
    ok: int = 0
    failed: int = 0
    skipped: int = 0  # measured turns not sent because an earlier turn of theirs failed
    warmup_sent: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # error_kind -> count (measured)
    stop: Stop | None = None  # set when a stall or the cell deadline ended the drive early

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.warmup]

    def __repr__(self) -> str:
        # Short on purpose: asyncio formats the finished task's result with repr().
        return (
            f"DriveResult(sent={self.sent}, ok={self.ok}, failed={self.failed}, "
            f"skipped={self.skipped}, warmup_sent={self.warmup_sent}, errors={self.errors}, "
            f"window_s={self.window_s:.3f}, stop={self.stop})"
        )

    @property
    def window_s(self) -> float:
        if self.window_start is None or self.window_end is None:
            return 0.0
        return self.window_end - self.window_start


def build_messages(conv: Conversation, turn: int, answers: Sequence[str]) -> list[dict]:
    """Messages for ``turn`` of ``conv``: earlier turns with the model's actual answers."""
    msgs: list[dict] = []
    if conv.system:
        msgs.append({"role": "system", "content": conv.system})
    for k in range(turn):
        msgs.append({"role": "user", "content": conv.turns[k]})
        msgs.append({"role": "assistant", "content": answers[k]})
    msgs.append({"role": "user", "content": conv.turns[turn]})
    return msgs


def default_render_prompt(messages: list[dict]) -> str:
    """Plain-text rendering for /v1/completions when no chat template is given."""
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant:"


def build_body(
    endpoint: EndpointConfig,
    sampling: SamplingParams,
    messages: list[dict],
    render_prompt: Callable[[list[dict]], str] | None = None,
) -> bytes:
    body: dict = {"model": endpoint.model}
    if endpoint.api == "chat":
        body["messages"] = messages
    else:
        body["prompt"] = (render_prompt or default_render_prompt)(messages)
    body.update(
        stream=True,
        stream_options={"include_usage": True},
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=sampling.max_tokens,
    )
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.chat_template_kwargs and endpoint.api == "chat":
        body["chat_template_kwargs"] = sampling.chat_template_kwargs
    if endpoint.return_token_ids:
        body["return_token_ids"] = True
    return json.dumps(body, ensure_ascii=False).encode()


class _Fail(Exception):
    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind = kind


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    role: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _SpecDecoding(msgspec.Struct):
    acceptance_histogram: list[int] | None = None
    per_step_accepted: list[int] | None = None
    per_step_drafted: list[int] | None = None


class _Metrics(msgspec.Struct):
    # vLLM's --per-request-spec-decode-metrics rides the final usage chunk (n == 1 only).
    speculative_decoding: _SpecDecoding | None = None


class _Error(msgspec.Struct):
    # vLLM's error body, also sent as an SSE event when generation fails after the 200 (its
    # engine died): {"error": {"message", "type", "param", "code"}}.
    message: str | None = None
    type: str | None = None
    code: int | str | None = None


class _Chunk(msgspec.Struct):
    # Only the fields avbench reads: msgspec skips the rest without building objects for them.
    id: str | None = None  # the response id; the vLLM plugin's captures are keyed by it
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    metrics: _Metrics | None = None
    error: _Error | None = None


_decode_all = msgspec.json.Decoder(list[_Chunk]).decode
_decode_one = msgspec.json.Decoder(_Chunk).decode
_DONE_EVENT = b"data: [DONE]\n\n"


def split_events(reads: list[tuple[float, bytes]]) -> tuple[list[bytes], list[float]]:
    """SSE events of a body, each with the arrival time of the read that completed it."""
    events: list[bytes] = []
    times: list[float] = []
    buf = b""
    for t, data in reads:
        if buf:
            data = buf + data
        parts = data.split(b"\n\n")
        buf = parts.pop()
        for p in parts:
            p = p.strip(b"\r\n")
            if p:
                events.append(p)
                times.append(t)
    if buf.strip():
        events.append(buf.strip())
        times.append(reads[-1][0])
    return events, times


def _fast_decode(reads: list[tuple[float, bytes]]) -> tuple[list[_Chunk], list[float], bool] | None:
    """Whole-body decode for the common well-formed case: one C-level decode per response.

    Returns None when the body is not plain ``data: {json}\\n\\n`` events (comments, a cut or
    broken event...), and the caller takes the per-event path that can say what is wrong.
    """
    if not reads:
        return None
    body = b"".join([d for _, d in reads]) if len(reads) > 1 else reads[0][1]
    done = body.endswith(_DONE_EVENT)
    core = body[: -len(_DONE_EVENT)] if done else body
    if not core.startswith(b"data: ") or not core.endswith(b"\n\n"):
        return None
    # Arrival time per event: the read holding its terminating blank line.
    times: list[float] = []
    prev_nl = False
    for t, d in reads:
        k = d.count(b"\n\n")
        if prev_nl and d[:1] == b"\n":
            k += 1
        if k:
            times += [t] * k
        prev_nl = d[-1:] == b"\n" and d[-2:] != b"\n\n"
    try:
        objs = _decode_all(b"[" + core[6:-2].replace(b"\n\ndata: ", b",") + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if len(objs) + done != len(times):
        return None
    return objs, times, done


def _server_error_text(err: _Error) -> str:
    """One line for an error the server sent: its type and code, then its message."""
    what = " ".join(str(x) for x in (err.type, err.code) if x is not None) or "error"
    return f"server error ({what}): {err.message or 'no message'}"[:300]


def _error_body_text(body: bytes) -> str | None:
    """The error a non-stream body carries ({"error": {...}}), or None when it is none."""
    try:
        obj = _decode_one(body.strip())
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return _server_error_text(obj.error) if obj.error is not None else None


def parse_stream(rec: RequestRecord, reads: list[tuple[float, bytes]]) -> None:
    """Fill the record from a whole response body and judge it: an error the server sent
    (in the stream, or as the body) fails it as ``server_error``; a stream that ended without a
    finish reason fails as ``incomplete`` when it reached ``[DONE]``, else as ``stream_cut``."""
    done = _parse_events(rec, reads)
    if rec.error is None and not rec.chunk_times and reads:
        body_error = _error_body_text(b"".join(d for _, d in reads))
        if body_error is not None:
            rec.error_kind, rec.error = "server_error", body_error
    if rec.error is not None or rec.finish_reason is not None:
        return
    n = len(rec.chunk_times)
    if done:
        rec.error_kind = "incomplete"
        rec.error = f"[DONE] without a finish_reason after {n} token chunk(s)"
    else:
        rec.error_kind = "stream_cut"
        rec.error = f"stream ended before [DONE] after {n} chunks"


def _decode_events(
    rec: RequestRecord, reads: list[tuple[float, bytes]]
) -> tuple[list[_Chunk], list[float], bool]:
    """The body's chunks with their arrival times, and whether it reached ``[DONE]``: one
    decode when well formed, else event by event (a broken one sets the record's error)."""
    fast = _fast_decode(reads)
    if fast is not None:
        return fast
    events, ev_times = split_events(reads)
    objs: list[_Chunk] = []
    times: list[float] = []
    for i, (ev, t) in enumerate(zip(events, ev_times, strict=True)):
        if not ev.startswith(b"data:"):
            continue  # SSE comment / keep-alive
        p = ev[5:].lstrip()
        if p == b"[DONE]":
            continue
        try:
            objs.append(_decode_one(p))
        except (msgspec.DecodeError, msgspec.ValidationError):
            if rec.error is None:
                rec.error_kind = "malformed"
                rec.error = f"malformed chunk #{i}: {p[:120]!r}"
            continue
        times.append(t)
    return objs, times, bool(events) and events[-1] == _DONE


def _parse_events(rec: RequestRecord, reads: list[tuple[float, bytes]]) -> bool:
    """Fill the record from the response body (an error event sets its error). Returns
    whether the stream reached ``[DONE]``."""
    objs, times, done = _decode_events(rec, reads)
    texts: list[str] = []
    counts: list[int] = []
    ctimes: list[float] = []
    token_ids: list[int] = []
    exact = True
    for obj, t in zip(objs, times, strict=False):
        if obj.error is not None and rec.error_kind != "server_error":
            rec.error_kind, rec.error = "server_error", _server_error_text(obj.error)
        if rec.response_id is None and obj.id is not None:
            rec.response_id = obj.id
        if obj.usage is not None:
            rec.prompt_tokens = obj.usage.prompt_tokens
            rec.completion_tokens = obj.usage.completion_tokens
            spec = obj.metrics.speculative_decoding if obj.metrics is not None else None
            if spec is not None:
                rec.spec_per_step_accepted = spec.per_step_accepted or []
                rec.spec_per_step_drafted = spec.per_step_drafted or []
                rec.spec_acceptance_histogram = spec.acceptance_histogram or []
        if not obj.choices:
            continue
        c = obj.choices[0]
        if c.finish_reason:
            rec.finish_reason = c.finish_reason
            if c.finish_reason == "error" and rec.error is None:  # vLLM's failed generation
                rec.error_kind, rec.error = "server_error", "server error: finish_reason error"
        d = c.delta
        if d is not None:
            if d.role is not None and not c.token_ids:
                continue  # the role-only first chunk carries no token
            text = d.content
            r = d.reasoning_content if d.reasoning_content is not None else d.reasoning
            if r is not None:  # thinking tokens count as output (docs/measurement.md)
                text = r if text is None else r + text
        else:
            text = c.text
        ids = c.token_ids
        if ids is not None:
            n = len(ids)
            token_ids += ids
        elif text is not None:
            n = 1
            exact = False
        else:
            continue
        if n:
            texts.append(text or "")
            counts.append(n)
            ctimes.append(t)
    if not exact and rec.completion_tokens is not None:
        counts = reconcile_counts(counts, texts, rec.completion_tokens)
    rec.output_text = "".join(texts)
    rec.output_token_ids = token_ids if exact else []
    s = rec.sent_at
    rec.chunk_times = [t - s for t in ctimes]
    rec.chunk_tokens = counts
    if ctimes:
        rec.ttft = ctimes[0] - s
    return done


def reconcile_counts(counts: list[int], texts: list[str], total: int) -> list[int]:
    """Spread ``total - sum(counts)`` extra tokens over chunks by text length (estimate).

    Used only when the server sent no token ids; keeps every chunk at >= 1 token.
    """
    extra = total - sum(counts)
    if extra <= 0 or not counts:
        return counts
    weights = [max(len(t), 1) for t in texts]
    wsum = sum(weights)
    shares = [extra * w / wsum for w in weights]
    add = [math.floor(x) for x in shares]
    # Largest remainders get the leftover tokens, so the sum is exact.
    left = extra - sum(add)
    for i in sorted(range(len(shares)), key=lambda i: add[i] - shares[i])[:left]:
        add[i] += 1
    return [c + a for c, a in zip(counts, add, strict=True)]


async def _stamped(it, progress: Progress):
    # Fallback for other transports: stamp each item as the client receives it (every byte
    # counts as progress here: SSE comments are told apart by FastTransport only).
    async for data in it:
        t = _perf()
        progress.saw(t)
        yield t, data


class _Driver:
    def __init__(
        self,
        endpoint: EndpointConfig,
        sampling: SamplingParams,
        client: httpx.AsyncClient,
        transport: FastTransport | None,
        hooks: DriveHooks,
    ):
        self.endpoint = endpoint
        # Asked as each measured request finishes; True: issue no more (a sequential cell).
        self.finish_when = hooks.finish_when
        self.stopping = False
        self.sampling = sampling
        self.client = client
        self.transport = transport
        self.progress = transport.progress if transport is not None else Progress()
        self.stop: Stop | None = None
        self.render_prompt = hooks.render_prompt
        self.on_record = hooks.on_record
        self.chat = endpoint.api == "chat"
        self.path = "/v1/chat/completions" if self.chat else "/v1/completions"
        self.url = endpoint.base_url.rstrip("/") + self.path
        self.headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            "accept-encoding": "identity",  # the body is split raw; no compression
        }
        if endpoint.api_key is not None:
            self.headers["authorization"] = "Bearer " + endpoint.api_key.get_secret_value()
        self._url = httpx.URL(self.url)
        self._headers = httpx.Headers({**dict(client.headers), **self.headers})
        self._timeout = client.timeout.as_dict()
        self.records: list[RequestRecord] = []
        self.window_start: float | None = None
        self.window_end: float | None = None
        self.skipped = 0

    async def request(self, rec: RequestRecord, body: bytes) -> None:
        """One streamed request; never raises for server or network trouble."""
        self.progress.begin()
        try:
            await self._request(rec, body)
        finally:
            self.progress.end()

    async def _request(self, rec: RequestRecord, body: bytes) -> None:
        rec.sent_at = 0.0
        reads: list[tuple[float, bytes]] = []
        append = reads.append

        async def trace(name: str, info: dict) -> None:
            if name == "http11.send_request_headers.started":
                rec.sent_at = _perf()

        started = _perf()
        try:
            async with asyncio.timeout(self.endpoint.timeouts.request_s):
                # A Request built from pre-parsed URL and headers: client.stream() would re-parse
                # and merge them on every request (a third of the per-request cost).
                req = httpx.Request(
                    "POST",
                    self._url,
                    headers=self._headers,
                    content=body,
                    extensions={"trace": trace, "timeout": self._timeout},
                )
                resp = await self.client.send(req, stream=True)
                try:
                    rec.status = resp.status_code
                    if resp.status_code >= 400:
                        snippet = (await resp.aread())[:300].decode("utf-8", "replace")
                        kind = "http_5xx" if resp.status_code >= 500 else "http_4xx"
                        raise _Fail(kind, f"HTTP {resp.status_code}: {snippet}")
                    fast = resp.extensions.get("arrivals")
                    if fast is not None:  # FastTransport: reads stamped on arrival, in bulk
                        await fast.collect(reads)
                    else:
                        async for item in _stamped(resp.aiter_raw(), self.progress):
                            append(item)
                finally:
                    await resp.aclose()
            end = _perf()
            if not rec.sent_at:
                rec.sent_at = started
            parse_stream(rec, reads)
            rec.e2e = (reads[-1][0] if reads else end) - rec.sent_at
        except _Fail as exc:
            rec.error_kind, rec.error = exc.kind, str(exc)
        except TimeoutError:
            self._partial(rec, reads, started)
            rec.error_kind = "timeout"
            rec.error = f"request exceeded {self.endpoint.timeouts.request_s:g} s"
        except httpx.TimeoutException as exc:
            self._partial(rec, reads, started)
            kind = (
                "connect"
                if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout)
                else "timeout"
            )
            rec.error_kind = kind
            # Which timeout it was (connect, pool, write, read) is in the type and message.
            detail = str(exc) or f"no data for {self.endpoint.timeouts.read_s:g} s"
            rec.error = f"{type(exc).__name__}: {detail}"[:300]
        except httpx.ConnectError as exc:
            rec.sent_at = rec.sent_at or started
            rec.error_kind, rec.error = "connect", f"ConnectError: {exc}"
        except MalformedResponseError as exc:  # the bytes broke HTTP framing: not a cut
            self._partial(rec, reads, started)
            rec.error_kind, rec.error = "malformed", f"{type(exc).__name__}: {exc}"[:300]
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            self._partial(rec, reads, started)
            rec.error_kind = "stream_cut" if rec.sent_at else "connect"
            rec.error = f"{type(exc).__name__}: {exc}"[:300]
        except StreamAborted as exc:
            self._partial(rec, reads, started)
            rec.error_kind, rec.error = exc.kind, str(exc)[:300]
        except httpx.HTTPError as exc:
            self._partial(rec, reads, started)
            rec.error_kind, rec.error = "connect", f"{type(exc).__name__}: {exc}"[:300]
        if rec.error is not None and rec.error_kind is None:
            rec.error_kind = "malformed"

    def _partial(self, rec: RequestRecord, reads, started: float) -> None:
        # Keep what arrived before the failure: chunk times still say how far it got.
        if not rec.sent_at:
            rec.sent_at = started
        if reads:
            err, kind = rec.error, rec.error_kind
            _parse_events(rec, reads)
            if rec.error is None:
                rec.error, rec.error_kind = err, kind
        rec.e2e = _perf() - rec.sent_at

    async def conversation(self, conv: Conversation, warmup: bool, queued_at: float) -> None:
        answers: list[str] = []
        for k, user in enumerate(conv.turns):
            messages = build_messages(conv, k, answers)
            sampling = self.sampling
            if conv.max_tokens is not None:
                sampling = sampling.model_copy(update={"max_tokens": conv.max_tokens})
            body = build_body(self.endpoint, sampling, messages, self.render_prompt)
            rec = RequestRecord(conversation_id=conv.id, turn=k, warmup=warmup)
            rec.queued_at = queued_at if k == 0 else _perf()
            rec.prompt_text = user
            rec.prompt_messages = json.dumps(messages, ensure_ascii=False)
            await self.request(rec, body)
            self.records.append(rec)
            if not warmup:
                if self.window_start is None or rec.sent_at < self.window_start:
                    self.window_start = rec.sent_at
                self.window_end = _perf()
            if self.on_record is not None:
                self.on_record(rec)
            if not warmup and self.finish_when is not None and self.finish_when(rec):
                self.stopping = True
            if not rec.ok:
                if not warmup:
                    self.skipped += len(conv.turns) - k - 1
                return
            answers.append(rec.output_text)

    async def closed_loop(self, convs: Sequence[Conversation], n: int, warmup: bool) -> None:
        it: Iterator[Conversation] = iter(convs)

        async def worker() -> None:
            for conv in it:  # shared iterator: each conversation goes to exactly one worker
                if self.stop is not None or self.stopping:
                    return
                await self.conversation(conv, warmup, _perf())

        await asyncio.gather(*(worker() for _ in range(min(n, len(convs)))))

    async def open_loop(
        self,
        convs: Sequence[Conversation],
        rate: float,
        cap: int | None,
        seed: int | None,
        warmup: bool,
    ) -> None:
        sem = asyncio.Semaphore(cap) if cap else None
        offsets = arrival_offsets(len(convs), rate, seed)
        tasks: set[asyncio.Task] = set()

        async def run(conv: Conversation, due: float) -> None:
            if sem is None:
                await self.conversation(conv, warmup, due)
                return
            async with sem:
                await self.conversation(conv, warmup, due)

        t0 = _perf()
        for conv, off in zip(convs, offsets, strict=True):
            if self.stopping:
                break
            due = t0 + off
            delay = due - _perf()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.stop is not None:
                break
            task = asyncio.create_task(run(conv, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def watched(self, body: Awaitable[None]) -> None:
        """Run ``body`` (the whole drive) under the stall detector and the cell deadline."""
        task = asyncio.ensure_future(body)
        watch = asyncio.ensure_future(self._watch(task))
        try:
            await asyncio.wait({task})
        finally:
            watch.cancel()
            if not task.done():  # this drive was cancelled from outside (Ctrl-C)
                task.cancel()
        if not task.cancelled():
            task.result()  # a bug inside the drive surfaces here
        elif self.stop is None:
            raise asyncio.CancelledError

    async def _watch(self, task: asyncio.Future) -> None:
        t = self.endpoint.timeouts
        progress = self.progress
        deadline = _perf() + t.cell_s
        while self.stop is None:
            now = _perf()
            due = progress.last + t.stall_s if progress.in_flight else now + t.stall_s
            await asyncio.sleep(max(min(due, deadline) - now, 0.05))
            now = _perf()
            if now >= deadline:
                self._stop(Stop("deadline", f"cell deadline: not finished within {t.cell_s:g} s"))
            elif progress.silent_for(now) >= t.stall_s:
                n, health = progress.in_flight, await self._health()
                silent = progress.silent_for(_perf())
                if silent >= t.stall_s:  # nothing came while /health was asked either
                    self._stop(
                        Stop(
                            "stalled",
                            f"server stalled: no progress on any of {n} in-flight request(s) "
                            f"for {silent:.0f} s (stall timeout {t.stall_s:g} s); GET /health: "
                            f"{health}",
                        )
                    )
        await asyncio.wait({task}, timeout=_STOP_GRACE_S)
        task.cancel()  # what did not finish in the grace period (e.g. https requests)

    async def _health(self) -> str:
        """What the server's /health says now, in a few words for the stall's reason."""
        wait = min(_HEALTH_TIMEOUT_S, self.endpoint.timeouts.stall_s)
        auth = {k: v for k, v in self.headers.items() if k == "authorization"}
        try:
            async with httpx.AsyncClient(timeout=wait, trust_env=False) as client:
                r = await client.get(self.endpoint.base_url.rstrip("/") + "/health", headers=auth)
        except httpx.TimeoutException:
            return f"no answer within {wait:g} s"
        except httpx.HTTPError as exc:
            return f"failed ({type(exc).__name__}: {exc})"[:200]
        if r.status_code == 200:  # vLLM's /health fails only once the engine is dead
            return "HTTP 200 (the HTTP server answers; its engine produces nothing)"
        return f"HTTP {r.status_code}"

    def _stop(self, stop: Stop) -> None:
        self.stop = stop
        if self.transport is not None:
            self.transport.abort(StreamAborted(stop))


def arrival_offsets(n: int, rate: float, seed: int | None = None) -> list[float]:
    """Send offsets from t0: i/rate, or cumulative exponential gaps (Poisson) when seeded."""
    if seed is None:
        return [i / rate for i in range(n)]
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _raise_fd_limit(want: int) -> None:
    """Lift the soft open-files limit towards ``want`` (one socket per connection)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < want:
            cap = want if hard == resource.RLIM_INFINITY else min(want, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (cap, hard))
    except (ImportError, ValueError, OSError):
        pass


def make_client(
    endpoint: EndpointConfig, pool: int, transport: FastTransport | None
) -> httpx.AsyncClient:
    """One shared client: through ``transport`` (http://), else httpx's own (pool of ``pool``)."""
    t = endpoint.timeouts
    timeout = httpx.Timeout(
        connect=min(30.0, t.request_s), read=t.read_s, write=t.read_s, pool=t.request_s
    )
    kw: dict = {}
    if transport is not None:
        kw["transport"] = transport
    else:  # https: httpx's own transport (TLS)
        kw["limits"] = httpx.Limits(max_connections=pool, max_keepalive_connections=pool)
    return httpx.AsyncClient(timeout=timeout, trust_env=False, **kw)


async def drive(
    endpoint: EndpointConfig,
    sampling: SamplingParams,
    conversations: Sequence[Conversation],
    load: Load,
    hooks: DriveHooks = DriveHooks(),
) -> DriveResult:
    """Run ``conversations`` (the first ``load.warmup`` of them as warmup) and record every turn."""
    warm, measured = list(conversations[: load.warmup]), list(conversations[load.warmup :])
    # Closed loop: one connection per worker. Open loop: connections open lazily as needed;
    # a large cap so that slow responses never turn it into a hidden closed loop.
    pool = load.concurrency or 16384
    _raise_fd_limit(pool + 256)
    http = endpoint.base_url.startswith("http://")
    transport = FastTransport(max_connections=pool) if http else None
    async with make_client(endpoint, pool, transport) as client:
        d = _Driver(endpoint, sampling, client, transport, hooks)

        async def phase(convs: list[Conversation], is_warmup: bool) -> None:
            if not convs or d.stop is not None:
                return
            if load.rate is not None:
                await d.open_loop(convs, load.rate, load.concurrency, load.poisson_seed, is_warmup)
            elif load.concurrency is not None:
                await d.closed_loop(convs, load.concurrency, is_warmup)

        async def hook(fn: Callable[[], Awaitable[None]] | None) -> None:
            if fn is None or d.stop is not None:  # no scrape of a stalled server
                return
            d.progress.begin()  # in flight like a request: a server frozen here stalls too
            try:
                await fn()
            finally:
                d.progress.end()

        async def body() -> None:
            await phase(warm, True)
            await hook(hooks.before_measure)
            await phase(measured, False)
            await hook(hooks.after_measure)

        await d.watched(body())
    res = DriveResult(d.records, d.window_start, d.window_end, skipped=d.skipped, stop=d.stop)
    for r in d.records:
        if r.warmup:
            res.warmup_sent += 1
            continue
        res.sent += 1
        if r.ok:
            res.ok += 1
        else:
            res.failed += 1
            res.errors[r.error_kind or "unknown"] = res.errors.get(r.error_kind or "unknown", 0) + 1
    return res


def run_drive(
    endpoint: EndpointConfig,
    sampling: SamplingParams,
    conversations: Sequence[Conversation],
    load: Load,
    hooks: DriveHooks = DriveHooks(),
) -> DriveResult:
    """Synchronous :func:`drive` on a fresh event loop (the one provenance.event_loop names)."""
    from avbench.loadgen.provenance import event_loop

    with asyncio.Runner(loop_factory=event_loop()[2]) as runner, _DeferredSigterm() as sigterm:
        try:
            return runner.run(sigterm.guard(drive(endpoint, sampling, conversations, load, hooks)))
        finally:
            sigterm.handle_deferred()  # after a drive cancelled, or one that finished first


class _DeferredSigterm:
    """While a drive runs, SIGTERM cancels it, as asyncio.Runner does on SIGINT, and the
    process's own SIGTERM handler (avbench's raises KeyboardInterrupt) runs once the loop has
    stopped. Raised inside the loop, an exception can land in a C callback (uvloop's resolver),
    which prints and drops it: the drive went on, and its server with it."""

    def __init__(self) -> None:
        self.previous: Any = None
        self.task: asyncio.Task[Any] | None = None
        self.received = False

    def __enter__(self) -> _DeferredSigterm:
        if threading.current_thread() is threading.main_thread():
            handler = signal.getsignal(signal.SIGTERM)
            if callable(handler):
                self.previous = handler
                signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

    async def guard(self, drive: Coroutine[Any, Any, DriveResult]) -> DriveResult:
        self.task = asyncio.current_task()
        if self.received:  # before the loop got going
            drive.close()
            raise asyncio.CancelledError
        return await drive

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.received:  # a second SIGTERM: the handler's own way, at once
            self.previous(signum, frame)
            return
        self.received = True
        task = self.task
        if task is not None and not task.done():
            task.get_loop().call_soon_threadsafe(task.cancel)

    def handle_deferred(self) -> None:
        if self.received:
            self.previous(signal.SIGTERM, None)
