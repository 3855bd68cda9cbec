"""Refit capture: one JSON line per refit of vLLM's online acceptance estimator.

vLLM (Model Runner V2, ``spec_decode/acceptance_estimator.py``) keeps the estimator's slope,
intercepts and per-round label counts on the device and logs none of them. The wrapper reads
them only at refit boundaries. ``step()`` refits on its ``REFIT_INTERVAL``-th call (calls that
observe nothing count too) and the refit kernel zeroes the round's label counts, so on a
boundary call the wrapper runs vLLM's own ``step`` twice: first with the refit postponed (the
accumulation alone), then, after a device-side copy of the counts, with an empty batch, which
adds nothing and launches the refit. Other calls pay one host-side integer comparison.

The copy to the host is asynchronous on a GPU: a writer thread of the process waits for its
CUDA event and appends the line at once, so no ``step()`` waits on the device and a line never
waits for a later step or for the process to exit (a worker SIGKILLed after vLLM's shutdown
grace period loses at most a copy still in flight). Lines go to
``<capture dir>/refits.<pid>.jsonl``. A mismatch with the class's expected attributes leaves
the estimator untouched (one warning naming the vLLM version); an exception inside the wrapper
is caught and counted (``capture_errors`` in every line), never raised into the engine.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import logging
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from avbench.capture_protocol import estimator_name, refits_name
from avbench.vllm_plugin.runtime import ESTIMATOR_MODULE, vllm_version

log = logging.getLogger(__name__)

_STEP_PARAMS = ["self", "idx_mapping", "num_sampled", "num_rejected"]
_INSTANCE_ATTRS = ("_steps_since_refit", "_refits", "slope", "intercepts", "counts")
_WRAPPED = "__avbench_refit_capture__"
_capture: RefitCapture | None = None  # this process's capture, once installed


def _ranks() -> tuple[int | None, int | None]:
    """(TP rank, DP rank) from vLLM's parallel state when this process has set it up."""
    ps = sys.modules.get("vllm.distributed.parallel_state")
    tp = getattr(getattr(ps, "_TP", None), "rank_in_group", None)
    dp = getattr(getattr(ps, "_DP", None), "rank_in_group", None)
    if dp is None and "VLLM_DP_RANK" in os.environ:
        dp = int(os.environ["VLLM_DP_RANK"])
    return tp, dp


@dataclass
class _Pending:
    meta: dict[str, Any]
    values: Any  # host tensor: slope, K intercepts, K label counts
    event: Any  # CUDA event recorded after the copy, or None on CPU


def _to_host(values: Any) -> tuple[Any, Any]:
    """(host tensor, CUDA event that completes with the copy, or None): never waits."""
    if not values.is_cuda:
        return values, None
    import torch

    values = values.to("cpu", non_blocking=True)  # a pinned destination: no sync
    event = torch.cuda.Event()
    event.record()
    return values, event


@dataclass
class RefitCapture:
    """Per-process capture state: the output file, lines not written yet, error count."""

    path: Path
    errors: int = 0
    pending: queue.Queue = field(default_factory=queue.Queue)
    _unsupported: set[int] = field(default_factory=set)  # ids of instances left alone
    _seen: set[int] = field(default_factory=set)  # ids of instances that stepped
    _writer: threading.Thread | None = None

    def fail(self, where: str) -> None:
        self.errors += 1
        if self.errors == 1 or self.errors % 1000 == 0:
            log.warning(
                "avbench refit capture: error in %s (%d so far); serving continues",
                where,
                self.errors,
                exc_info=self.errors == 1,
            )

    def at_boundary(self, est: Any) -> bool:
        """True when this ``step()`` call of ``est`` will refit (host-side state only)."""
        try:
            if id(est) in self._unsupported:
                return False
            if id(est) not in self._seen:
                self._started(est)
            missing = [a for a in _INSTANCE_ATTRS if not hasattr(est, a)]
            if missing:
                self._unsupported.add(id(est))
                log.warning(
                    "avbench refit capture: %s's estimator has no %s; capture off",
                    vllm_version(),
                    ", ".join(missing),
                )
                return False
            return est._steps_since_refit + 1 >= est.REFIT_INTERVAL
        except Exception:
            self.fail("boundary check")
            return False

    def _started(self, est: Any) -> None:
        """One line per process saying an estimator runs here (a one-off small write)."""
        self._seen.add(id(est))
        tp, dp = _ranks()
        marker = {
            "time": time.time(),
            "pid": os.getpid(),
            "tp_rank": tp,
            "dp_rank": dp,
            "num_speculative_steps": getattr(est, "num_speculative_steps", None),
        }
        path = self.path.with_name(estimator_name(os.getpid()))
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(marker))
        os.replace(tmp, path)

    def snapshot_counts(self, est: Any) -> Any:
        try:
            return est.counts.clone()  # device-side copy, queued like any kernel
        except Exception:
            self.fail("count snapshot")
            return None

    def record(self, est: Any, counts: Any, started: float) -> None:
        """Queue the refit's K+1 coefficients and K counts for the writer, without a device
        wait."""
        if counts is None:
            return
        try:
            import torch

            values, event = _to_host(torch.cat([est.slope.reshape(1), est.intercepts, counts]))
            tp, dp = _ranks()
            meta = {
                "time": started,
                "pid": os.getpid(),
                "tp_rank": tp,
                "dp_rank": dp,
                "refit_index": est._refits - 1,
                "step_count": est._refits * est.REFIT_INTERVAL,
            }
            self.pending.put(_Pending(meta, values, event))
            if self._writer is None or not self._writer.is_alive():  # none yet, or forked
                self._writer = threading.Thread(
                    target=self._write_loop, name="avbench-refits", daemon=True
                )
                self._writer.start()
        except Exception:
            self.fail("refit record")

    def _write_loop(self) -> None:
        while True:
            item = self.pending.get()
            try:
                self._write(item)
            except Exception:
                self.fail("refit write")
            finally:
                self.pending.task_done()

    def _write(self, item: _Pending) -> None:
        if item.event is not None:
            item.event.synchronize()  # this thread waits, the engine's does not
        v = item.values.tolist()
        k = (len(v) - 1) // 2
        line = {
            **item.meta,
            "slope": v[0],
            "intercepts": v[1 : 1 + k],
            "label_counts": [int(c) for c in v[1 + k :]],
            "capture_errors": self.errors,
        }
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

    def close(self) -> None:
        """Wait until every queued line is written (the device copies included)."""
        if self._writer is not None and self._writer.is_alive():
            self.pending.join()


def _wrap_step(step: Any, capture: RefitCapture) -> Any:
    @functools.wraps(step)
    def wrapped(self, idx_mapping, num_sampled, num_rejected):
        if not capture.at_boundary(self):
            return step(self, idx_mapping, num_sampled, num_rejected)
        started = time.time()
        # Accumulate only: the instance attribute shadows the class's interval for this call.
        self.REFIT_INTERVAL = sys.maxsize
        try:
            step(self, idx_mapping, num_sampled, num_rejected)
        finally:
            del self.REFIT_INTERVAL
        counts = capture.snapshot_counts(self)
        # Empty views of the same tensors (valid pointers): nothing is observed, the call
        # count reaches the interval and vLLM's step launches the refit exactly as it would.
        step(self, idx_mapping[:0], num_sampled[:0], num_rejected[:0])
        capture.record(self, counts, started)

    setattr(wrapped, _WRAPPED, True)
    return wrapped


def install_refit_capture(capture_dir: Path) -> bool:
    """Wrap ``OnlineAcceptanceEstimator.step`` so every refit appends one line under
    ``capture_dir``. Returns False (estimator untouched) when vLLM's class is absent or differs
    from what the wrapper expects."""
    try:
        import importlib

        cls = importlib.import_module(ESTIMATOR_MODULE).OnlineAcceptanceEstimator
    except Exception as exc:  # no vLLM, no GPU worker code, or an import error inside it
        log.warning(
            "avbench refit capture: %s has no usable %s (%s); capture off",
            vllm_version(),
            ESTIMATOR_MODULE,
            exc,
        )
        return False
    global _capture
    step: Any = getattr(cls, "step", None)
    if getattr(step, _WRAPPED, False):
        return True
    try:
        params = list(inspect.signature(step).parameters)
    except (TypeError, ValueError):
        params = []
    if params != _STEP_PARAMS or not isinstance(getattr(cls, "REFIT_INTERVAL", None), int):
        log.warning(
            "avbench refit capture: %s's OnlineAcceptanceEstimator differs from the expected "
            "one (step%s, REFIT_INTERVAL); capture off",
            vllm_version(),
            tuple(params[1:]),
        )
        return False
    capture_dir = Path(capture_dir)
    capture_dir.mkdir(parents=True, exist_ok=True)
    _capture = RefitCapture(capture_dir / refits_name(os.getpid()))
    cls.step = _wrap_step(step, _capture)
    atexit.register(flush_refits)
    return True


def flush_refits() -> None:
    """Wait until every refit line is written (waits for the device copies)."""
    if _capture is not None:
        _capture.close()
