"""Sequential cells: a cell runs until its numbers are known (docs/measurement.md).

A closed loop keeps the same requests in flight for a request's lifetime and the server's speed
drifts, so consecutive requests are not independent: a standard error over requests would be
too narrow. The intervals here are batch means over time (*sectioning*): the measured window is
cut into equal stretches of time, each stretch gives its own estimate (tokens of the requests
that finished in it / its length; the median TPOT of those requests), and the spread of those
estimates around the whole window's estimate gives a t interval. Stretches count only once each
spans ``MEMORY_SPANS`` median request latencies, so the loop has turned over between them; the
window is cut 10, 20 and 40 ways (as far as it allows) and the widest interval is kept.

The centre of each interval is the row's own number (output tokens / window; the median TPOT of
all requests), so the interval is the sampling noise of exactly what the row reports.

:class:`~avbench.inputs.suite.StoppingRule` is the sweep setting (target, floors, ceilings);
:class:`SequentialMonitor` watches a cell's finished requests and says when and why to stop.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from avbench.inputs.suite import SequentialMetric as Metric
from avbench.inputs.suite import StoppingRule
from avbench.loadgen.records import RequestRecord
from avbench.metrics.data import output_token_count, tpot_seconds

# Few long stretches catch slow drift, many short ones steady the noise estimate: keeping the
# widest of the three guards against both (docs/measurement.md).
BATCHINGS = (10, 20, 40)
# Student's t 0.975 quantile (two-sided 95%) for batches - 1 degrees of freedom
# (scipy.stats.t.ppf; a test checks them).
T_QUANTILES = {10: 2.262157162798205, 20: 2.0930240544083087, 40: 2.022690920036761}
# A stretch spans at least this many median request latencies (send -> last byte): a closed
# loop replaces every request in flight within about one.
MEMORY_SPANS = 2.0
# Looks at the data come each time the requests grew by this factor: every look is a chance to
# stop on a noise estimate that happens to be low, so they are few.
LOOK_GROWTH = 1.25

StopReason = Literal["target_reached", "request_ceiling", "time_ceiling"]
METRICS: tuple[Metric, ...] = get_args(Metric)


@dataclass(frozen=True)
class Interval:
    """A 95% interval around an estimate."""

    estimate: float
    low: float
    high: float

    @property
    def rel_half_width(self) -> float:
        if self.estimate == 0:
            return math.inf
        return (self.high - self.low) / 2 / abs(self.estimate)


def _half_width(estimate: float, batch_estimates: np.ndarray) -> float:
    """Sectioning: t half-width from the spread of batch estimates around the whole window's."""
    b = batch_estimates.size
    s2 = float(np.sum((batch_estimates - estimate) ** 2)) / (b - 1)
    return T_QUANTILES[b] * math.sqrt(s2 / b)


def _batch_of(times: np.ndarray, span: tuple[float, float], batches: int) -> np.ndarray:
    """Index of the stretch of ``span`` = (start, end] each time falls in (right-closed)."""
    start, end = span
    k = np.ceil((times - start) / (end - start) * batches).astype(np.int64) - 1
    return np.clip(k, 0, batches - 1)


def rate_interval(
    finish_s: np.ndarray,
    amounts: np.ndarray,
    span: tuple[float, float],
    batchings: Sequence[int] = BATCHINGS,
) -> Interval | None:
    """Interval of sum(amounts) / window over ``span``, each amount credited at its finish."""
    start, end = span
    if not end > start or not batchings:
        return None
    estimate = float(np.sum(amounts)) / (end - start)
    half = 0.0
    for b in batchings:
        sums = np.bincount(_batch_of(finish_s, span, b), weights=amounts, minlength=b)
        half = max(half, _half_width(estimate, sums * b / (end - start)))
    return Interval(estimate, estimate - half, estimate + half)


def median_interval(
    finish_s: np.ndarray,
    values: np.ndarray,
    span: tuple[float, float],
    batchings: Sequence[int] = BATCHINGS,
) -> Interval | None:
    """Interval of the median of ``values`` over ``span``, from the batchings whose every
    stretch holds a value (None when none does)."""
    if not span[1] > span[0] or values.size == 0:
        return None
    estimate = float(np.median(values))
    halves = []
    for b in batchings:
        k = _batch_of(finish_s, span, b)
        order = np.argsort(k, kind="stable")
        bounds = np.searchsorted(k[order], np.arange(b + 1))
        if np.any(np.diff(bounds) == 0):
            continue
        ordered = values[order]
        medians = np.array([np.median(ordered[i:j]) for i, j in itertools.pairwise(bounds)])
        halves.append(_half_width(estimate, medians))
    if not halves:
        return None
    return Interval(estimate, estimate - max(halves), estimate + max(halves))


@dataclass(frozen=True)
class Stream:
    """A cell's finished measured requests, one entry each."""

    finish_s: np.ndarray  # when it finished (last byte)
    tokens: np.ndarray  # output tokens credited to throughput (0: failed)
    tpot_ms: np.ndarray  # NaN where the request has none
    e2e_s: np.ndarray  # send -> last byte


def intervals(stream: Stream, span: tuple[float, float]) -> dict[Metric, Interval | None]:
    """The interval of each metric over ``span`` = (start, end]; None while the window is too
    short for ten stretches that each outlast the loop's memory."""
    if stream.e2e_s.size == 0 or not span[1] > span[0]:
        return dict.fromkeys(METRICS, None)
    memory = MEMORY_SPANS * float(np.median(stream.e2e_s))
    batchings = [b for b in BATCHINGS if (span[1] - span[0]) / b >= memory]
    has_tpot = np.isfinite(stream.tpot_ms)
    return {
        "output_tok_s": rate_interval(stream.finish_s, stream.tokens, span, batchings),
        "tpot_ms_median": median_interval(
            stream.finish_s[has_tpot], stream.tpot_ms[has_tpot], span, batchings
        ),
    }


def request_point(r: RequestRecord) -> tuple[float, float, float, float]:
    """(sent, finished, output tokens credited, TPOT ms) of one measured request; a failed one
    is credited no tokens and has no TPOT, as in the cell's metrics (metrics/data.py)."""
    e2e = r.e2e if r.e2e is not None else math.nan
    finish = r.sent_at + (r.e2e or 0.0)
    if not r.ok:
        return r.sent_at, finish, 0.0, math.nan
    tokens = output_token_count(r)
    ttft = r.ttft if r.ttft is not None else math.nan
    tpot = float(tpot_seconds(np.asarray(e2e), np.asarray(ttft), np.asarray(float(tokens))))
    return r.sent_at, finish, float(tokens), tpot * 1e3


class SequentialMonitor:
    """Watches a cell's measured requests as they finish; says when, and why, to stop."""

    def __init__(self, rule: StoppingRule):
        self.rule = rule
        self._columns: tuple[list[float], ...] = ([], [], [], [])
        self.start = math.inf  # earliest send of a finished request
        self.end = -math.inf  # latest finish
        self.reason: StopReason | None = None
        self.requests_at_stop: int | None = None
        self._next_look = rule.min_requests

    @property
    def requests(self) -> int:
        return len(self._columns[0])

    def stream(self) -> Stream:
        finish, tokens, tpot, e2e = (np.asarray(c, dtype=float) for c in self._columns)
        return Stream(finish, tokens, tpot, e2e)

    def add(
        self, sent_s: float, finish_s: float, tokens: float, tpot_ms: float
    ) -> StopReason | None:
        """One finished request; returns why to stop issuing new ones, or None to go on."""
        for column, value in zip(
            self._columns, (finish_s, tokens, tpot_ms, finish_s - sent_s), strict=True
        ):
            column.append(value)
        self.start, self.end = min(self.start, sent_s), max(self.end, finish_s)
        if self.reason is None:
            self.reason = self._decide()
            if self.reason is not None:
                self.requests_at_stop = self.requests
        return self.reason

    def observe(self, r: RequestRecord) -> bool:
        """The load driver's stop condition: True once the cell should issue no more."""
        if r.warmup:
            return self.reason is not None
        return self.add(*request_point(r)) is not None

    def _decide(self) -> StopReason | None:
        rule, n, elapsed = self.rule, self.requests, self.end - self.start
        if elapsed >= rule.max_time_s:
            return "time_ceiling"
        if n >= rule.max_requests:
            return "request_ceiling"
        if n < self._next_look or elapsed < rule.min_time_s:
            return None
        self._next_look = max(n + 1, math.ceil(n * LOOK_GROWTH))
        found = intervals(self.stream(), (self.start, self.end))
        if all(_within(found[m], rule.target) for m in rule.metrics):
            return "target_reached"
        return None


def _within(interval: Interval | None, target: float) -> bool:
    return interval is not None and interval.rel_half_width <= target


def sequential_columns(
    monitor: SequentialMonitor, records: Sequence[RequestRecord], window: tuple[float, float]
) -> dict:
    """A sequential cell's row columns, its intervals taken over the whole measured window
    (the requests that were in flight at the stop included, as in every other column)."""
    measured = [r for r in records if not r.warmup]
    points = np.array([request_point(r) for r in measured], dtype=float).reshape(-1, 4)
    sent, finish, tokens, tpot = points.T
    found = intervals(Stream(finish, tokens, tpot, finish - sent), window)
    row: dict = {
        "stop_reason": monitor.reason,
        "target_half_width": monitor.rule.target,
        "requests_sent": len(measured),
        "requests_at_stop": monitor.requests_at_stop,
    }
    for name, iv in found.items():
        row |= {
            f"{name}_ci_low": iv.low if iv else None,
            f"{name}_ci_high": iv.high if iv else None,
            f"{name}_ci_rel": iv.rel_half_width if iv else None,
        }
    return row
