"""Labels captured drafts and writes them, on a background thread, as parquet shards.

The hooks only enqueue: a *proposal* (the drafts of one engine step with their features) and a
*verdict* (what the target did with the drafts it verified in a later step). Device tensors are
copied to the host without blocking and read here, after their copy event. The thread pairs
each verdict with the request's latest earlier proposal, labels every scheduled draft, and
writes shards (``drafts-<pid>-<token>-<n>.capture.parquet``) to a temporary name then renames
them, so a reader never sees a torn file; a status file records how far it has flushed.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from avbench.capture_protocol import (
    CAPTURE_SUFFIX,
    FLUSH_REQUEST,
    LABEL_ACCEPTED,
    LABEL_AFTER_REJECTION,
    LABEL_REJECTED,
    LABEL_TRIMMED,
    capture_schema,
)
from avbench.vllm_plugin.runtime import Health, log, write_status


class HostCopy:
    """Tensors on their way to the host: non-blocking copies into pinned memory plus an event
    on a GPU, plain copies on a CPU. ``get()`` waits for the event (off the hot path)."""

    def __init__(self, tensors: dict):
        import torch

        self._event = None
        self._host: dict = {}
        on_gpu = any(t is not None and t.device.type != "cpu" for t in tensors.values())
        for k, t in tensors.items():
            if t is None:
                self._host[k] = None
            elif on_gpu and t.device.type != "cpu":
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
                buf.copy_(t, non_blocking=True)
                self._host[k] = buf
            else:
                self._host[k] = t.detach().clone()
        if on_gpu:
            self._event = torch.cuda.Event()
            self._event.record()

    def get(self) -> dict[str, np.ndarray | None]:
        if self._event is not None:
            self._event.synchronize()
        return {k: (None if v is None else v.numpy()) for k, v in self._host.items()}


@dataclass
class Proposal:
    """Drafts of one step for the sampled requests (rows), positions in columns."""

    step: int
    engine_ids: list[str]
    client_ids: list[str]
    data: HostCopy  # tokens, f, q_max, q_sampled, entropy, pred?, head?, temperature


@dataclass
class Verdict:
    """The target's decision on the drafts verified in ``step``, for the sampled requests."""

    step: int
    time: float
    engine_ids: list[str]
    scheduled: list[int]  # drafts scheduled per request
    accepted: np.ndarray | HostCopy  # (n,) accepted drafts (HostCopy key "accepted")
    admitted: np.ndarray | HostCopy | None = None  # (n,) verified after AV; None: = scheduled
    scheduled_tokens: list[list[int]] | None = None  # for a consistency check (V1)


@dataclass
class _Row:
    step: int
    data: dict
    index: int
    client_id: str


@dataclass
class Labeler:
    """Pure bookkeeping: proposals in, labeled rows out (columns of the capture schema)."""

    pid: int
    dp_rank: int
    pending: dict[str, list[_Row]] = field(default_factory=dict)
    stats: Counter = field(default_factory=Counter)

    def proposal(self, p: Proposal) -> None:
        data = p.data.get()
        for i, (eid, cid) in enumerate(zip(p.engine_ids, p.client_ids, strict=True)):
            rows = self.pending.setdefault(eid, [])
            rows.append(_Row(p.step, data, i, cid))
            del rows[:-2]  # the latest proposal and the one before are all a verdict can need
        self.stats["proposals"] += 1

    def finished(self, engine_ids) -> None:
        for eid in engine_ids:
            self.pending.pop(eid, None)

    def verdict(self, v: Verdict, out: dict[str, list]) -> int:
        acc = v.accepted.get()["accepted"] if isinstance(v.accepted, HostCopy) else v.accepted
        assert acc is not None  # the host copy of a tensor
        adm = v.admitted.get()["admitted"] if isinstance(v.admitted, HostCopy) else v.admitted
        n_rows = 0
        for i, eid in enumerate(v.engine_ids):
            n_sched = int(v.scheduled[i])
            if n_sched <= 0:
                continue
            rows = [r for r in self.pending.get(eid, ()) if r.step < v.step]
            if not rows:
                self.stats["verdict_without_proposal"] += 1
                continue
            row = rows[-1]
            self.pending[eid] = [r for r in self.pending[eid] if r.step >= v.step]
            d, j0 = row.data, row.index
            tokens = d["tokens"][j0]
            k = int((tokens >= 0).sum())
            if n_sched > k:
                self.stats["more_scheduled_than_drafted"] += 1
                continue
            if v.scheduled_tokens is not None:
                sched = v.scheduled_tokens[i]
                if any(t >= 0 for t in sched) and list(sched) != tokens[:n_sched].tolist():
                    self.stats["token_mismatch"] += 1
                    continue
            a = int(acc[i])
            n_adm = n_sched if adm is None else int(adm[i])
            for j in range(n_sched):
                if j < a:
                    label = LABEL_ACCEPTED
                elif j < n_adm:
                    label = LABEL_REJECTED if j == a else LABEL_AFTER_REJECTION
                else:
                    label = LABEL_TRIMMED
                out["request_id"].append(row.client_id)
                out["engine_request_id"].append(eid)
                out["step"].append(v.step)
                out["position"].append(j + 1)
                out["label"].append(label)
                for col, key in (
                    ("q_max", "q_max"),
                    ("logit_q_max", "f"),
                    ("q_sampled", "q_sampled"),
                    ("entropy", "entropy"),
                    ("estimator_pred", "pred"),
                    ("head_score", "head"),
                ):
                    arr = d.get(key)
                    out[col].append(None if arr is None else float(arr[j0, j]))
                out["temperature"].append(float(d["temperature"][j0]))
                out["time"].append(v.time)
                n_rows += 1
            self.stats["dropped_unscheduled"] += k - n_sched
        self.stats["verdicts"] += 1
        return n_rows


_COLUMNS = (
    "request_id", "engine_request_id", "step", "position", "label", "q_max", "logit_q_max",
    "q_sampled", "entropy", "estimator_pred", "head_score", "temperature", "time",
)  # fmt: skip


class ShardWriter:
    """The background thread. ``submit`` is all the hot path calls.

    Every ``tick_s`` it labels what arrived and rewrites its status file; it writes a shard when
    ``max_rows`` rows are waiting, when the oldest has waited ``max_age_s``, when the sweep asks
    (``flush-request`` names a time after the last complete flush) and at exit. ``flushed_at`` in
    the status: everything enqueued before that time is on disk."""

    def __init__(
        self,
        capture_dir: Path,
        health: Health,
        dp_rank: int = 0,
        tick_s: float = 1.0,
        max_age_s: float = 30.0,
        max_rows: int = 200_000,
    ):
        self.dir = capture_dir
        self.health = health
        self.tick_s = tick_s
        self.max_age_s = max_age_s
        self.max_rows = max_rows
        self.labeler = Labeler(os.getpid(), dp_rank)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._cols: dict[str, list] = {c: [] for c in _COLUMNS}
        self._rows = 0
        self._seq = 0
        # pids are reused across servers in a long run: a per-writer token keeps names unique.
        self._token = os.urandom(3).hex()
        self.written = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._flushed_at = self._last_write = time.time()
        self._start_lock = threading.Lock()

    def submit(self, item) -> None:
        if self._thread is None:
            self._start()
        self._q.put(item)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._loop, name="avbench-capture", daemon=True)
            self._thread.start()
            atexit.register(self.close)

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        next_tick = time.monotonic() + self.tick_s
        while True:
            stopping = self._stop.is_set()
            try:
                item = self._q.get(timeout=max(0.0, min(0.2, next_tick - time.monotonic())))
            except queue.Empty:
                item = None
            if item is not None:
                self._handle(item)
            if stopping or self._rows >= self.max_rows or time.monotonic() >= next_tick:
                self._tick(final=stopping)
                next_tick = time.monotonic() + self.tick_s
                if stopping:
                    return

    def _tick(self, final: bool) -> None:
        drained_at = time.time()
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            self._handle(item)
        try:
            if self._rows and (
                final
                or self._rows >= self.max_rows
                or drained_at - self._last_write >= self.max_age_s
                or self._flush_requested()
            ):
                self._write_shard()
                self._last_write = drained_at
            if not self._rows:
                self._flushed_at = drained_at
            write_status(
                self.dir,
                self.health,
                {
                    "flushed_at": self._flushed_at,
                    "rows_written": self.written,
                    "shards": self._seq,
                    "shard_prefix": f"drafts-{self.labeler.pid}-{self._token}",
                    "closed": final,  # the last flush of an exiting process
                    "labeler": dict(self.labeler.stats),
                },
            )
        except Exception as exc:  # noqa: BLE001 - counted, never raised into the engine
            self.health.error("writer", exc)

    def _flush_requested(self) -> bool:
        # The file holds the time the sweep wants covered (file times are too coarse for it).
        try:
            return float((self.dir / FLUSH_REQUEST).read_text()) > self._flushed_at
        except (OSError, ValueError):
            return False

    def _handle(self, item) -> None:
        try:
            if isinstance(item, Proposal):
                self.labeler.proposal(item)
            elif isinstance(item, Verdict):
                self._rows += self.labeler.verdict(item, self._cols)
            else:
                self.labeler.finished(item)
        except Exception as exc:  # noqa: BLE001 - counted, never raised into the engine
            self.health.error("labeler", exc)

    def _write_shard(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        n = self._rows
        cols = self._cols | {
            "pid": [self.labeler.pid] * n,
            "dp_rank": [self.labeler.dp_rank] * n,
        }
        schema = capture_schema()
        table = pa.table({f.name: cols[f.name] for f in schema}, schema=schema)
        self._seq += 1
        name = f"drafts-{self.labeler.pid}-{self._token}-{self._seq:06d}{CAPTURE_SUFFIX}"
        tmp = self.dir / f".{name}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.dir / name)
        self.written += n
        self._cols = {c: [] for c in _COLUMNS}
        self._rows = 0
        log.debug("avbench capture: wrote %s (%d rows)", name, n)
