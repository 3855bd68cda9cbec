"""Numpy reference of vLLM's online acceptance estimator (DESIGN.md §2, PR #52228).

p[i] = sigmoid(omega * f + beta[i]) with f = logit(q_max), one shared slope and one intercept per
draft position. Labels are accumulated over a round of N decode steps into O(K) sums and one
damped Newton step is taken at the end of the round; the arrowhead Hessian makes the solve O(K).

Conventions here: positions are 0-based inside this module (beta[0] is draft position 1).
A "step" is one engine decode step: every draft verified in that step shares the step id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

F_CLAMP = 40.0


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    # tanh form never overflows, unlike 1 / (1 + exp(-x)) for large negative x.
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def logit_qmax_from_logits(logits: np.ndarray, clamp: float = F_CLAMP) -> np.ndarray:
    """f = m* - logsumexp(other logits), clamped; last axis is the vocabulary.

    This equals log(q_max / (1 - q_max)) without ever forming 1 - q_max, which rounds to 0
    for confident drafts. Ties for the maximum: the other tied entries stay in the "others".
    """
    z = np.asarray(logits, dtype=np.float64)
    idx = np.argmax(z, axis=-1)
    m = np.take_along_axis(z, idx[..., None], axis=-1)
    others = z.copy()
    np.put_along_axis(others, idx[..., None], -np.inf, axis=-1)
    mo = np.max(others, axis=-1, keepdims=True)
    mo = np.where(np.isfinite(mo), mo, 0.0)
    lse = mo[..., 0] + np.log(np.sum(np.exp(others - mo), axis=-1))
    return np.clip(m[..., 0] - lse, -clamp, clamp)


def logit_from_prob(q: np.ndarray, clamp: float = F_CLAMP) -> np.ndarray:
    """logit(q) for stored probabilities (less precise than from logits near q = 1)."""
    q = np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(q) - np.log1p(-q)
    return np.clip(np.nan_to_num(out, nan=0.0, posinf=clamp, neginf=-clamp), -clamp, clamp)


@dataclass(frozen=True)
class EstimatorConfig:
    num_positions: int
    omega0: float = 0.5  # cold start slope
    beta0: float = -0.2  # cold start intercept, every position
    round_steps: int = 100  # N decode steps per refit
    ridge: float = 1e-3  # lambda on the Hessian diagonal (not on the gradient)
    damping: float = 50.0  # step scaled by n / (n + damping)
    clamp: float = F_CLAMP
    # What a NaN slope step, or one that would make the slope negative, does:
    #   "vllm": only the slope step is masked (Δω = 0); the intercepts still take their step,
    #           solved with Δω = 0, and a NaN intercept step is masked per position. This is
    #           what vLLM's refit kernel does (spec_decode/acceptance_estimator.py, read from
    #           the installed wheel), and it lets an estimator whose first Newton steps
    #           overshoot below zero still leave its cold start through the intercepts.
    #   "drop": the literal reading of DESIGN.md §2: the whole step (slope and intercepts) is
    #           dropped. Kept for comparison: such an estimator can stay at (0.5, -0.2) forever.
    negative_slope: Literal["vllm", "drop"] = "vllm"


@dataclass(frozen=True)
class Refit:
    """Parameters after one end-of-round update (applied or dropped)."""

    round: int
    end_step: int  # step id of the last step of the round
    omega: float
    beta: np.ndarray
    n: np.ndarray  # labels per position in the round
    applied: bool
    reason: str = ""  # why a step was dropped ("nan", "negative-slope")


def newton_update(
    omega: float,
    beta: np.ndarray,
    sums: np.ndarray,
    cfg: EstimatorConfig,
) -> tuple[float, np.ndarray, bool, str]:
    """One damped arrowhead Newton step from per-position sums (rows a, b, c, g0, g1, n)."""
    a_k, b_k, c_k, g0_k, g1_k, n_k = sums
    lam = cfg.ridge
    den = c_k + lam
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        schur = a_k.sum() + lam - np.sum(b_k * b_k / den)
        d_omega = (g0_k.sum() - np.sum(b_k * g1_k / den)) / schur
        # The slope learns from every position: damped by the round's total count.
        n_tot = n_k.sum()
        d_omega *= n_tot / (n_tot + cfg.damping)
    reason = ""
    if not np.isfinite(d_omega):
        reason = "nan"
    elif omega + d_omega < 0.0:  # a negative slope would invert the ranking of drafts
        reason = "negative-slope"
    if reason:
        if cfg.negative_slope == "drop":
            return omega, beta, False, reason
        d_omega = 0.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # Intercepts are solved with the (damped, guarded) slope step actually taken.
        d_beta = (g1_k - b_k * d_omega) / den * (n_k / (n_k + cfg.damping))
    finite = np.isfinite(d_beta)
    if not finite.all():
        if cfg.negative_slope == "drop":
            return omega, beta, False, "nan"
        d_beta = np.where(finite, d_beta, 0.0)
        reason = reason or "nan"
    return float(omega + d_omega), beta + d_beta, not reason, reason


def round_sums(
    f: np.ndarray, pos: np.ndarray, y: np.ndarray, p: np.ndarray, num_positions: int
) -> np.ndarray:
    """The six O(K) accumulators of one round, shape (6, K)."""
    w = p * (1.0 - p)
    r = y - p
    k = num_positions
    return np.stack(
        [
            np.bincount(pos, weights=w * f * f, minlength=k),
            np.bincount(pos, weights=w * f, minlength=k),
            np.bincount(pos, weights=w, minlength=k),
            np.bincount(pos, weights=r * f, minlength=k),
            np.bincount(pos, weights=r, minlength=k),
            np.bincount(pos, minlength=k).astype(np.float64),
        ]
    )[:, :k]


@dataclass
class OnlineEstimator:
    """Stateful estimator fed one decode step at a time (the reference behaviour)."""

    cfg: EstimatorConfig
    omega: float = field(init=False)
    beta: np.ndarray = field(init=False)
    refits: list[Refit] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.omega = self.cfg.omega0
        self.beta = np.full(self.cfg.num_positions, self.cfg.beta0, dtype=np.float64)
        self._sums = np.zeros((6, self.cfg.num_positions))
        self._steps = 0
        self._last_step = -1

    def predict(self, f: np.ndarray, pos: np.ndarray) -> np.ndarray:
        f = np.clip(np.asarray(f, dtype=np.float64), -self.cfg.clamp, self.cfg.clamp)
        return sigmoid(self.omega * f + self.beta[np.asarray(pos)])

    def observe_step(
        self, f: np.ndarray, pos: np.ndarray, y: np.ndarray, step: int = -1
    ) -> np.ndarray:
        """Feed the labeled drafts of one decode step; returns the predictions made for them."""
        f = np.clip(np.asarray(f, dtype=np.float64), -self.cfg.clamp, self.cfg.clamp)
        pos = np.asarray(pos, dtype=np.int64)
        p = self.predict(f, pos)
        self._sums += round_sums(f, pos, np.asarray(y, dtype=np.float64), p, self.cfg.num_positions)
        self._steps += 1
        self._last_step = step if step >= 0 else self._last_step + 1
        if self._steps == self.cfg.round_steps:
            self._refit()
        return p

    def _refit(self) -> None:
        n = self._sums[5].copy()
        self.omega, self.beta, ok, why = newton_update(self.omega, self.beta, self._sums, self.cfg)
        self.refits.append(
            Refit(len(self.refits), self._last_step, self.omega, self.beta.copy(), n, ok, why)
        )
        self._sums[:] = 0.0
        self._steps = 0


@dataclass(frozen=True)
class ReplayResult:
    pred: np.ndarray  # prediction made at draft time, in the input order
    refits: list[Refit]

    @property
    def omega(self) -> float:
        return self.refits[-1].omega if self.refits else float("nan")

    @property
    def beta(self) -> np.ndarray:
        return self.refits[-1].beta if self.refits else np.array([])


def replay(
    step: np.ndarray,
    position: np.ndarray,
    label: np.ndarray,
    f: np.ndarray,
    cfg: EstimatorConfig | None = None,
) -> ReplayResult:
    """Feed labeled drafts to the estimator step by step, vectorised per round.

    Parameters are constant inside a round, so every prediction of the round and the six sums
    are computed at once; only the loop over rounds is sequential. ``position`` is 0-based.
    Steps are ordered by their id; steps with no labeled draft are invisible here (in vLLM
    they would still count toward the round of N steps).
    """
    position = np.asarray(position, dtype=np.int64)
    if cfg is None:
        cfg = EstimatorConfig(num_positions=int(position.max()) + 1 if position.size else 1)
    n = position.size
    pred = np.empty(n, dtype=np.float64)
    if n == 0:
        return ReplayResult(pred, [])
    step = np.asarray(step)
    order = np.argsort(step, kind="stable")
    s_sorted = step[order]
    new_step = np.empty(n, dtype=bool)
    new_step[0] = True
    new_step[1:] = s_sorted[1:] != s_sorted[:-1]
    step_starts = np.flatnonzero(new_step)
    round_starts = step_starts[:: cfg.round_steps]
    bounds = np.append(round_starts, n)
    n_full = len(step_starts) // cfg.round_steps  # only complete rounds are refit

    fs = np.clip(np.asarray(f, dtype=np.float64)[order], -cfg.clamp, cfg.clamp)
    ps = position[order]
    ys = np.asarray(label, dtype=np.float64)[order]
    omega, beta = cfg.omega0, np.full(cfg.num_positions, cfg.beta0)
    refits: list[Refit] = []
    pred_sorted = np.empty(n, dtype=np.float64)
    for r in range(len(round_starts)):
        lo, hi = bounds[r], bounds[r + 1]
        p = sigmoid(omega * fs[lo:hi] + beta[ps[lo:hi]])
        pred_sorted[lo:hi] = p
        if r < n_full:
            sums = round_sums(fs[lo:hi], ps[lo:hi], ys[lo:hi], p, cfg.num_positions)
            omega, beta, ok, why = newton_update(omega, beta, sums, cfg)
            refits.append(Refit(r, int(s_sorted[hi - 1]), omega, beta.copy(), sums[5], ok, why))
    pred[order] = pred_sorted
    return ReplayResult(pred, refits)
