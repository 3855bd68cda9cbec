"""Numpy reference of vLLM's online acceptance estimator (docs/adaptive-verification.md, PR #52228).

p[i] = sigmoid(omega * f + beta[i]) with f = logit(q_max), one shared slope and one intercept per
draft position. Labels are accumulated over a round of N decode steps into O(K) sums and one
damped Newton step is taken at the end of the round; the arrowhead Hessian makes the solve O(K).

Conventions here: positions are 0-based inside this module (beta[0] is draft position 1).
A "step" is one call of the estimator's ``step()`` (one engine decode step): every draft graded
in that call shares the step id, and calls that grade nothing still count toward the round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from avbench.vllm_feature import F_CLAMP


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


@dataclass(frozen=True)
class Refit:
    """Parameters after one end-of-round update."""

    round: int
    end_step: int  # step id of the last step of the round
    omega: float
    beta: np.ndarray
    n: np.ndarray  # labels per position in the round
    moved: bool  # the refit changed the slope or at least one intercept
    slope_masked: str = ""  # why the slope step was masked ("nan", "negative-slope"), else ""


def newton_update(
    omega: float,
    beta: np.ndarray,
    sums: np.ndarray,
    cfg: EstimatorConfig,
) -> tuple[float, np.ndarray, str]:
    """One damped arrowhead Newton step from per-position sums (rows a, b, c, g0, g1, n).

    The guard is vLLM's refit kernel's (docs/adaptive-verification.md): only the slope step is masked, to 0,
    when it is NaN or would make the slope negative; the intercepts always take their step,
    solved with the slope step actually taken, and a NaN intercept step is zeroed for its
    position alone. Returns (omega, beta, why the slope step was masked or "").
    """
    a_k, b_k, c_k, g0_k, g1_k, n_k = sums
    lam = cfg.ridge
    den = c_k + lam
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        schur = a_k.sum() + lam - np.sum(b_k * b_k / den)
        d_omega = (g0_k.sum() - np.sum(b_k * g1_k / den)) / schur
        # The slope learns from every position: damped by the round's total count.
        n_tot = n_k.sum()
        d_omega *= n_tot / (n_tot + cfg.damping)
    masked = ""
    if not np.isfinite(d_omega):
        masked = "nan"
    elif omega + d_omega < 0.0:  # a negative slope would invert the ranking of drafts
        masked = "negative-slope"
    if masked:
        d_omega = 0.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d_beta = (g1_k - b_k * d_omega) / den * (n_k / (n_k + cfg.damping))
    d_beta = np.where(np.isfinite(d_beta), d_beta, 0.0)
    return float(omega + d_omega), beta + d_beta, masked


def _refit_record(
    r: int, end_step: int, before: tuple[float, np.ndarray], after: tuple, n: np.ndarray
) -> Refit:
    omega, beta, masked = after
    moved = omega != before[0] or bool(np.any(beta != before[1]))
    return Refit(r, end_step, omega, beta.copy(), n, moved, masked)


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
        """Feed the labeled drafts of one ``step()`` call (empty arrays for a call that graded
        nothing: it still counts toward the round); returns the predictions made for them."""
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
        after = newton_update(self.omega, self.beta, self._sums, self.cfg)
        rec = _refit_record(len(self.refits), self._last_step, (self.omega, self.beta), after, n)
        self.omega, self.beta = rec.omega, rec.beta.copy()
        self.refits.append(rec)
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
    num_steps: int | None = None,
) -> ReplayResult:
    """Feed labeled drafts to the estimator round by round, vectorised inside a round.

    ``step`` is the 0-based index of the estimator's ``step()`` call that graded the draft;
    ``position`` is 0-based. As in vLLM, calls that grade nothing still count: a step id
    missing from ``step`` is such a call, so round r holds steps [r·N, (r+1)·N) and every
    complete round ends in a refit, even one without a labeled draft (which moves nothing).
    ``num_steps`` is how many calls the stream made (default: last step id + 1); only
    complete rounds are refit. Parameters are constant inside a round, so every prediction of
    the round and the six sums are computed at once.
    """
    position = np.asarray(position, dtype=np.int64)
    step = np.asarray(step, dtype=np.int64)
    if cfg is None:
        cfg = EstimatorConfig(num_positions=int(position.max()) + 1 if position.size else 1)
    n = position.size
    last = int(step.max()) if n else -1
    if n and int(step.min()) < 0:
        raise ValueError("replay: step ids must be >= 0 (indices of step() calls)")
    if num_steps is None:
        num_steps = last + 1
    elif num_steps <= last:
        raise ValueError(f"replay: num_steps={num_steps} but a draft has step id {last}")
    rs = cfg.round_steps
    n_full = num_steps // rs  # only complete rounds are refit
    order = np.argsort(step, kind="stable")
    rounds = step[order] // rs
    n_rounds = max(n_full, int(rounds[-1]) + 1 if n else 0)
    bounds = np.searchsorted(rounds, np.arange(n_rounds + 1))
    fs = np.clip(np.asarray(f, dtype=np.float64)[order], -cfg.clamp, cfg.clamp)
    ps = position[order]
    ys = np.asarray(label, dtype=np.float64)[order]
    omega, beta = cfg.omega0, np.full(cfg.num_positions, cfg.beta0)
    refits: list[Refit] = []
    pred_sorted = np.empty(n, dtype=np.float64)
    for r in range(n_rounds):
        lo, hi = bounds[r], bounds[r + 1]
        p = sigmoid(omega * fs[lo:hi] + beta[ps[lo:hi]])
        pred_sorted[lo:hi] = p
        if r < n_full:
            sums = round_sums(fs[lo:hi], ps[lo:hi], ys[lo:hi], p, cfg.num_positions)
            after = newton_update(omega, beta, sums, cfg)
            rec = _refit_record(r, (r + 1) * rs - 1, (omega, beta), after, sums[5])
            omega, beta = rec.omega, rec.beta.copy()
            refits.append(rec)
    pred = np.empty(n, dtype=np.float64)
    pred[order] = pred_sorted
    return ReplayResult(pred, refits)
