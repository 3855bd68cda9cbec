"""A live sweep's per-position acceptance against an offline trace of the same cells.

vLLM's counters give, per draft position i, accepted-at-i / drafts (``accept_pos_<i>``): the
*unconditional* probability that the first i drafts of a step are all accepted. The trace labels
drafts only up to the first rejection, so its rows at position i exist only when positions
1..i-1 were accepted; the same unconditional quantity is then

    sampled_i  = (labels 1 at position i) / steps
    expected_i = (sum of expected_accept at position i) / steps

where steps = drafts at position 1. ``expected_i`` averages exact probabilities instead of coin
flips (same mean, smaller variance), so it is what the live number is compared against; the
sampled one checks the trace's own rejection sampling against it. The check of a run, which
traces its cells' prompts, is ``avbench.run.live_check``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from avbench.errors import AvbenchError

SELF_CHECK_SE = 3.0  # sampled vs expected acceptance of the trace, in standard errors
DEFAULT_TOLERANCE_SE = 4.0  # live vs trace when no absolute tolerance is given


class LiveCheckError(AvbenchError):
    """A run cannot be compared with a trace (no speculative cells, mixed settings, ...)."""


@dataclass(frozen=True)
class TraceAcceptance:
    """Unconditional per-position acceptance of a trace (index 0 = draft position 1)."""

    steps: int
    sampled: np.ndarray
    expected: np.ndarray
    se_expected: np.ndarray  # standard error of ``expected`` as an estimate of the mean
    se_sampled_vs_expected: np.ndarray  # of sampled - expected when rejection sampling is exact


def trace_acceptance(position: np.ndarray, label: np.ndarray, expected: np.ndarray, k: int):
    """Per-position acceptance of labeled drafts (1-based ``position``, one step's rows at
    positions 1..n, label 0 only last) as vLLM's counters define it."""
    position = np.asarray(position, dtype=np.int64)
    label = np.asarray(label, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if np.isnan(expected).any():
        raise LiveCheckError("expected_accept: null in traced drafts (a trace fills every row)")
    steps = int((position == 1).sum())
    if steps == 0:
        raise LiveCheckError("the trace has no drafts")
    sampled, mean, se_mean, se_diff = (np.zeros(k) for _ in range(4))
    for i in range(k):
        e = expected[position == i + 1]
        sampled[i] = label[position == i + 1].sum() / steps
        mean[i] = e.sum() / steps
        # Per step the value is e (row present) or 0 (an earlier draft was rejected).
        var = max((np.square(e).sum() - steps * mean[i] ** 2) / max(steps - 1, 1), 0.0)
        se_mean[i] = math.sqrt(var / steps)
        # label - e has mean 0 and variance e(1 - e) given the step's history.
        se_diff[i] = math.sqrt((e * (1 - e)).sum()) / steps
    return TraceAcceptance(steps, sampled, mean, se_mean, se_diff)


def binomial_se(rate: float, n: float) -> float:
    return math.sqrt(max(rate * (1 - rate), 0.0) / n) if n > 0 else math.nan


@dataclass(frozen=True)
class PositionCheck:
    position: int  # 1-based
    live_drafts: int
    live: float
    captured: float | None  # the same rate from the run's captured drafts, where present
    offline_sampled: float
    offline_expected: float
    offline_steps: int
    tolerance: float
    self_z: float  # (sampled - expected) / its standard error

    @property
    def diff(self) -> float:
        return self.live - self.offline_expected

    @property
    def live_ok(self) -> bool:
        return abs(self.diff) <= self.tolerance

    @property
    def self_ok(self) -> bool:
        return not abs(self.self_z) > SELF_CHECK_SE

    @property
    def passed(self) -> bool:
        return self.live_ok and self.self_ok


def compare(
    live_drafts: int,
    live_accepted: np.ndarray,
    trace: TraceAcceptance,
    tolerance: float | None = None,
    captured: np.ndarray | None = None,
) -> list[PositionCheck]:
    """Per position: live accepted / drafts against the trace. ``tolerance`` is absolute; None
    means DEFAULT_TOLERANCE_SE standard errors of the difference (live binomial + trace)."""
    out = []
    for i, acc in enumerate(live_accepted):
        live = float(acc) / live_drafts
        tol = tolerance
        if tol is None:
            se = math.hypot(binomial_se(live, live_drafts), trace.se_expected[i])
            tol = DEFAULT_TOLERANCE_SE * se
        se_self = trace.se_sampled_vs_expected[i]
        gap = trace.sampled[i] - trace.expected[i]
        out.append(
            PositionCheck(
                i + 1,
                int(live_drafts),
                live,
                None if captured is None else float(captured[i]),
                float(trace.sampled[i]),
                float(trace.expected[i]),
                trace.steps,
                float(tol),
                float(gap / se_self) if se_self > 0 else (0.0 if gap == 0 else math.inf),
            )
        )
    return out


def captured_acceptance(drafts: pd.DataFrame, k: int) -> np.ndarray | None:
    """The counters' quantity from live captured drafts (labels up to the first rejection)."""
    if drafts.empty:
        return None
    pos = drafts["position"].to_numpy()
    lab = drafts["label"].to_numpy()
    steps = (pos == 1).sum()
    return np.array([((pos == i + 1) & (lab == 1)).sum() / steps for i in range(k)])
