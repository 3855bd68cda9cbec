"""Step timing capture: one JSON line per engine step, timed without a device sync.

What a step line holds (``steps.<pid>.<token>.jsonl``): the step index (steps that scheduled work,
counted in this worker, as the drafts capture counts them), its start (unix time), requests in
the batch, scheduled tokens, draft tokens scheduled and verified (after AV's trim), how many
requests accepted j drafts (``acc_hist``, j = 0..K, over requests with drafts), and times:

- ``forward_ms``: ``execute_model`` (input preparation and the target forward);
- ``sample_ms``: ``sample_tokens`` minus drafting (sampling, rejection sampling, bookkeeping);
- ``draft_ms``: the drafter's proposal; ``draft_pos_ms``: the time from its start to the end of
  each draft position's sampling (Model Runner V1 only: V2 drafts inside one CUDA graph), and
  ``draft_first_ms`` to the start of the first one (the drafter's first pass alone);
- ``interval_ms``: from the previous step's start to this one's (host wall clock always).

``timing`` says how: ``host-wall`` where the runner executes synchronously (the CPU build:
``time.perf_counter`` around the calls is the work itself), ``cuda-events`` on a GPU (events
recorded around the same calls, resolved on this module's thread after they complete: the
engine's thread never waits on the device).

Each step line lists its requests as small integer codes (``reqs``); a request line
(``"kind": "request"``), written when a request is first scheduled, gives a code's client id
(the response id the client sees) and engine id. A sweep files both per cell
(``avbench/run/cell_captures.py``). ``steps.<pid>.flushed`` holds the time up to which every step
enqueued is on disk, rewritten by the writer thread four times a second.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from avbench.vllm_plugin.ids import client_request_id
from avbench.vllm_plugin.runtime import Health, guarded, upload_index, when_imported, wrap_method

TIMING_WALL, TIMING_CUDA = "host-wall", "cuda-events"
_V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
_V1_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer"
_V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
_V2_SPECULATOR = "vllm.v1.worker.gpu.spec_decode.speculator"
_HOOK = "steps"


class _Clock:
    """Marks on the host clock, or CUDA events on a GPU (elapsed time read once complete)."""

    def __init__(self, device_type: str):
        self.cuda = device_type == "cuda"
        self.timing = TIMING_CUDA if self.cuda else TIMING_WALL

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        import torch

        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def ready(self, mark) -> bool:
        return not self.cuda or mark.query()

    def ms(self, a, b) -> float | None:
        if a is None or b is None:
            return None
        return a.elapsed_time(b) if self.cuda else (b - a) * 1000.0


@dataclass
class _Step:
    step: int
    time: float
    clock: _Clock
    n_reqs: int
    tokens: int
    drafts: int
    spec: dict  # engine id -> drafts scheduled for verification in this step
    interval_ms: float | None
    codes: list  # the batch's requests, as codes of request lines
    marks: dict = field(default_factory=dict)
    positions: list = field(default_factory=list)  # (entry, exit) marks per draft position
    acc: Any = None  # accepted drafts per request with drafts (a list, or a pending copy)
    verified: int | None = None  # drafts left after AV's trim (None: all scheduled)
    batch_ids: list = field(default_factory=list)  # V2: engine ids in the input batch's order

    def ready(self) -> bool:
        last = self.marks.get("sample_end")
        if last is not None and not self.clock.ready(last):
            return False
        return getattr(self.acc, "ready", lambda: True)()

    def line(self) -> dict:
        m, ms = self.marks, self.clock.ms
        draft = ms(m.get("draft_start"), m.get("draft_end"))
        sample = ms(m.get("sample_start"), m.get("sample_end"))
        acc = self.acc.get() if hasattr(self.acc, "get") else self.acc
        hist: list[int] = []
        for a in acc or ():
            hist += [0] * (int(a) + 1 - len(hist))
            hist[int(a)] += 1
        return {
            "kind": "step", "step": self.step, "time": self.time, "pid": os.getpid(),
            "n_reqs": self.n_reqs, "tokens": self.tokens, "drafts": self.drafts,
            "verified": self.drafts if self.verified is None else self.verified,
            "n_verify": sum(1 for d in self.spec.values() if d), "acc_hist": hist,
            "reqs": self.codes,
            "forward_ms": ms(m.get("forward_start"), m.get("forward_end")),
            "sample_ms": None if sample is None else sample - (draft or 0.0),
            "draft_ms": draft,
            "draft_first_ms": ms(m.get("draft_start"), self.positions[0][0])
            if self.positions else None,
            "draft_pos_ms": [ms(m.get("draft_start"), b) for _, b in self.positions] or None,
            "interval_ms": self.interval_ms, "timing": self.clock.timing,
        }  # fmt: skip


class _Accepted:
    """Accepted drafts per request from a device tensor, copied without blocking (V2)."""

    def __init__(self, num_sampled, rows):
        import torch

        acc = (num_sampled.index_select(0, rows) - 1).clamp_min(0).int()
        self._event = None
        if acc.is_cuda:
            host = torch.empty(acc.shape, dtype=acc.dtype, pin_memory=True)
            host.copy_(acc, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            acc = host
        self._host = acc

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def get(self) -> list[int]:
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()


class StepCapture:
    """One per worker process: the step being timed, request membership, the writer."""

    def __init__(self, capture_dir: Path, health: Health):
        self.dir = capture_dir
        self.health = health
        # pids are reused across servers in a long run: a per-writer token keeps names unique.
        name = f"steps.{os.getpid()}.{os.urandom(3).hex()}"
        self.path = capture_dir / f"{name}.jsonl"
        self.flushed_path = capture_dir / f"{name}.flushed"
        self.step = 0
        self.cur: _Step | None = None
        self.clock: _Clock | None = None
        self._last_start: float | None = None
        self._codes: dict[str, int] = {}  # engine id -> code, while the request lives
        self._next_code = 0
        self._q: deque[_Step | dict] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ engine thread
    def begin(self, so, device_type: str) -> None:
        """Before ``execute_model``: a new step when the scheduler sent work."""
        for eid in so.finished_req_ids or ():
            self._codes.pop(eid, None)
        self.cur = None
        if so.total_num_scheduled_tokens <= 0:
            return
        if self.clock is None:
            self.clock = _Clock(device_type)
        self.step += 1
        now = time.perf_counter()
        interval = None if self._last_start is None else (now - self._last_start) * 1000.0
        self._last_start = now
        spec = {k: len(v) for k, v in (so.scheduled_spec_decode_tokens or {}).items()}
        sched = so.num_scheduled_tokens
        self.cur = _Step(self.step, time.time(), self.clock, len(sched),
                         int(so.total_num_scheduled_tokens), sum(spec.values()), spec,
                         interval, [self._code(e) for e in sched])  # fmt: skip
        self.mark("forward_start")

    def mark(self, name: str) -> None:
        if self.cur is not None:
            self.cur.marks[name] = self.cur.clock.mark()

    def submit(self, step: _Step | dict) -> None:
        self._q.append(step)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="avbench-steps", daemon=True)
            self._thread.start()
            atexit.register(self.close)

    def _code(self, eid: str) -> int:
        code = self._codes.get(eid)
        if code is None:
            code = self._codes[eid] = self._next_code
            self._next_code += 1
            self.submit({"kind": "request", "code": code, "request_id": client_request_id(eid),
                         "engine_request_id": eid, "pid": os.getpid()})  # fmt: skip
        return code

    # ------------------------------------------------------------------ writer thread
    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            guarded(self.health, "steps.writer", self.drain, False)
        guarded(self.health, "steps.writer", self.drain, True)

    def drain(self, block: bool) -> None:
        """Write every step whose timings have landed (all of them when ``block``)."""
        started = time.time()
        lines = []
        while self._q:
            head = self._q[0]
            if isinstance(head, _Step) and not block and not head.ready():
                break
            self._q.popleft()
            lines.append(json.dumps(head.line() if isinstance(head, _Step) else head))
        if lines:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
        # What is left starts with a step whose timings have not landed (request lines go at once).
        first = self._q[0] if self._q else None
        flushed = first.time if isinstance(first, _Step) else started
        tmp = self.flushed_path.with_name(f".{self.flushed_path.name}.tmp")
        tmp.write_text(repr(flushed))
        os.replace(tmp, self.flushed_path)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)


# ----------------------------------------------------------------------------- V1 hooks
def _execute_model(cap: StepCapture, orig):
    def execute_model(self, scheduler_output, *args, **kwargs):
        if kwargs.get("dummy_run", False):
            return orig(self, scheduler_output, *args, **kwargs)
        dev = getattr(getattr(self, "device", None), "type", "cpu")
        guarded(cap.health, "steps.v2", _instrument_v2, cap, self)
        guarded(cap.health, "steps.begin", cap.begin, scheduler_output, dev)
        out = orig(self, scheduler_output, *args, **kwargs)
        guarded(cap.health, "steps.mark", cap.mark, "forward_end")
        return out

    return execute_model


def _sample_tokens_v1(cap: StepCapture, orig):
    def sample_tokens(self, grammar_output, *args, **kwargs):
        guarded(cap.health, "steps.mark", cap.mark, "sample_start")
        out = orig(self, grammar_output, *args, **kwargs)
        step, cap.cur = cap.cur, None
        if step is not None:
            guarded(cap.health, "steps.v1", _finish_v1, cap, step, out)
        return out

    return sample_tokens


def _finish_v1(cap: StepCapture, step: _Step, out) -> None:
    step.marks["sample_end"] = step.clock.mark()

    def verdict(res) -> None:
        index, sampled = res.req_id_to_index, res.sampled_token_ids
        # Accepted = tokens kept - 1, as the scheduler counts spec_decode_num_accepted_tokens.
        step.acc = [
            max(len(sampled[index[e]]) - 1, 0)
            for e, d in step.spec.items()
            if d and e in index and len(sampled[index[e]])
        ]
        cap.submit(step)

    if isinstance(getattr(out, "sampled_token_ids", None), list):
        verdict(out)
        return
    get = getattr(out, "get_output", None)
    if get is None:
        cap.submit(step)  # no verdict to read: timings alone
        return

    def get_output(*args, **kwargs):  # async scheduling: read when the engine resolves it
        res = get(*args, **kwargs)
        guarded(cap.health, "steps.v1_output", verdict, res)
        return res

    out.get_output = get_output


def _bracket(cap: StepCapture, orig):
    """The drafter's proposal between two marks (V1 ``propose_draft_token_ids``, V2
    ``speculator.propose``)."""

    def propose(*args, **kwargs):
        guarded(cap.health, "steps.mark", cap.mark, "draft_start")
        try:
            return orig(*args, **kwargs)
        finally:
            guarded(cap.health, "steps.mark", cap.mark, "draft_end")

    return propose


def _position(cap: StepCapture, orig):
    def _sample_draft_tokens(self, *args, **kwargs):
        step = cap.cur
        if step is None or "draft_start" not in step.marks:
            return orig(self, *args, **kwargs)
        entry = step.clock.mark()
        out = orig(self, *args, **kwargs)
        step.positions.append((entry, step.clock.mark()))
        return out

    return _sample_draft_tokens


# ----------------------------------------------------------------------------- V2 hooks
def _sample_tokens_v2(cap: StepCapture, orig):
    def sample_tokens(self, grammar_output, *args, **kwargs):
        batch = getattr(getattr(self, "execute_model_state", None), "input_batch", None)
        if cap.cur is not None and batch is not None:
            cap.cur.batch_ids = list(batch.req_ids)
        guarded(cap.health, "steps.mark", cap.mark, "sample_start")
        out = orig(self, grammar_output, *args, **kwargs)
        step, cap.cur = cap.cur, None
        if step is not None:
            step.marks["sample_end"] = step.clock.mark()
            cap.submit(step)
        return out

    return sample_tokens


def _instrument_v2(cap: StepCapture, runner) -> None:
    """Once per V2 runner (V1 has neither attribute): bracket its speculator's ``propose`` and
    read AV's draft budget from ``reallocate_drafts`` (instance attributes: every speculator
    class has its own propose)."""
    spec = getattr(runner, "speculator", None)
    if spec is not None and "propose" not in vars(spec):
        spec.propose = _bracket(cap, spec.propose)
    av = getattr(runner, "adaptive_verification", None)
    if av is not None and "reallocate_drafts" not in vars(av):
        inner = av.reallocate_drafts

        def reallocate_drafts(*args, **kwargs):
            out = inner(*args, **kwargs)
            if cap.cur is not None:
                cap.cur.verified = int(out[2])  # (cu_num_logits, query_start_loc, budget, ...)
            return out

        av.reallocate_drafts = reallocate_drafts


def _observe(cap: StepCapture, orig):
    def observe_verification(self, idx_mapping, num_sampled, num_rejected, *args, **kwargs):
        step = cap.cur
        if step is not None and step.spec:
            guarded(cap.health, "steps.v2_verdict", _verdict_v2, step, num_sampled)
        return orig(self, idx_mapping, num_sampled, num_rejected, *args, **kwargs)

    return observe_verification


def _verdict_v2(step: _Step, num_sampled) -> None:
    # num_sampled follows the input batch's rows; rows without drafts have nothing to count.
    rows = [i for i, e in enumerate(step.batch_ids) if step.spec.get(e)]
    step.acc = _Accepted(num_sampled, upload_index(rows, num_sampled.device))


# ----------------------------------------------------------------------------- install
# module -> (class, method -> wrapper factory): V1 (the CPU build) and V2 (GPU, vLLM >= 0.33).
_HOOKS = {
    _V1_RUNNER: (
        "GPUModelRunner",
        {"execute_model": _execute_model, "sample_tokens": _sample_tokens_v1,
         "propose_draft_token_ids": _bracket},
    ),
    _V1_PROPOSER: ("SpecDecodeBaseProposer", {"_sample_draft_tokens": _position}),
    _V2_RUNNER: (
        "GPUModelRunner", {"execute_model": _execute_model, "sample_tokens": _sample_tokens_v2}
    ),
    _V2_SPECULATOR: ("DraftModelSpeculator", {"observe_verification": _observe}),
}  # fmt: skip


def _patch(cap: StepCapture, module_name: str, module) -> None:
    cls_name, wrappers = _HOOKS[module_name]
    cls = getattr(module, cls_name, None)
    if cls is None:
        cap.health.mismatch(f"{module_name}.{cls_name} not found (step timing)")
        return
    for name, make in wrappers.items():
        wrap_method(cap.health, cls, name, functools.partial(make, cap), _HOOK)


def install_steps_capture(capture_dir: Path, health: Health) -> StepCapture:
    """Patch the V1 and V2 model runners when (and if) this process imports them."""
    cap = StepCapture(capture_dir, health)
    for name in _HOOKS:
        when_imported(
            name, lambda module, n=name: guarded(health, f"install {n}", _patch, cap, n, module)
        )
    atexit.register(cap.close)
    return cap
