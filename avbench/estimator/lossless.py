"""Exact check that trimming keeps speculative decoding lossless (docs/losslessness.md).

One draft slot, target p, drafter q. The drafter draws x ~ q. If the trim rule says "trim"
for (q, x), the slot is not verified and the target samples from p itself. Otherwise standard
rejection sampling: accept x with min(1, p(x)/q(x)), else resample from norm(max(0, p - q)).
The output distribution is computed in closed form (no sampling) and compared with p.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from avbench.estimator.features import FEATURES, ScoreOfQ

TOLERANCE = 1e-12  # float64 round-off on distributions that sum to 1


def output_distribution(p: np.ndarray, q: np.ndarray, trim: np.ndarray) -> np.ndarray:
    """Output distribution, batched over leading axes; trim[..., x] = trim when x is drawn."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    trim = np.asarray(trim, dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        acc = np.where(q > 0, np.minimum(1.0, p / q), 0.0)
    resid = np.maximum(0.0, p - q)
    z = resid.sum(axis=-1, keepdims=True)
    # z == 0 only when p == q, where every draft is accepted and the residual never used.
    resid = np.where(z > 0, resid / np.where(z > 0, z, 1.0), 0.0)
    keep = q * ~trim
    p_trim = (q * trim).sum(axis=-1, keepdims=True)
    p_rej = (keep * (1.0 - acc)).sum(axis=-1, keepdims=True)
    return p_trim * p + keep * acc + p_rej * resid


def output_distribution_exact(
    p: list[Fraction], q: list[Fraction], trim: list[bool]
) -> list[Fraction]:
    """Same computation in rational arithmetic, for worked examples."""
    v = len(p)
    acc = [min(Fraction(1), p[i] / q[i]) if q[i] > 0 else Fraction(0) for i in range(v)]
    resid = [max(Fraction(0), p[i] - q[i]) for i in range(v)]
    z = sum(resid, Fraction(0))
    resid = [r / z if z > 0 else Fraction(0) for r in resid]
    p_trim = sum((q[i] for i in range(v) if trim[i]), Fraction(0))
    p_rej = sum((q[i] * (1 - acc[i]) for i in range(v) if not trim[i]), Fraction(0))
    return [p_trim * p[i] + (0 if trim[i] else q[i] * acc[i]) + p_rej * resid[i] for i in range(v)]


@dataclass(frozen=True)
class WorkedExample:
    p: list[Fraction]
    q: list[Fraction]
    threshold: Fraction
    trim: list[bool]
    output: list[Fraction]


def worked_example() -> WorkedExample:
    """docs/losslessness.md: p = [1/2, 1/2], q = [1/5, 4/5], trim when q(x) < 1/2."""
    p = [Fraction(1, 2), Fraction(1, 2)]
    q = [Fraction(1, 5), Fraction(4, 5)]
    thr = Fraction(1, 2)
    trim = [qi < thr for qi in q]
    return WorkedExample(p, q, thr, trim, output_distribution_exact(p, q, trim))


@dataclass(frozen=True)
class LosslessResult:
    key: str
    label: str
    lossless: bool | None  # None: not checkable from (p, q) alone
    max_abs_error: float
    cases: int  # (p, q, threshold) combinations checked
    trimmed_fraction: float  # share of drafted mass trimmed across cases (the rule did act)


def random_pairs(
    n: int, vocab_sizes: tuple[int, ...], seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Random (p, q) batches: Dirichlet draws from flat to very peaked, per vocabulary size."""
    rng = np.random.default_rng(seed)
    out = []
    for v in vocab_sizes:
        conc = rng.choice([0.1, 0.5, 1.0, 5.0], size=(n, 1))
        p = rng.gamma(conc, size=(n, v))
        q = rng.gamma(conc[rng.permutation(n)], size=(n, v))
        p = np.maximum(p, 1e-300)
        q = np.maximum(q, 1e-300)
        out.append((p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)))
    return out


def check_rule(
    score_of_q: ScoreOfQ, pairs: list[tuple[np.ndarray, np.ndarray]], n_thresholds: int = 16
) -> tuple[float, int, float]:
    """Max |output - p| over every pair and threshold ("trim when score < threshold").

    Thresholds: every midpoint between consecutive distinct scores of a pair's tokens (so every
    split the rule can make is tried) plus shared quantiles of all scores."""
    worst, cases, trimmed, drafted = 0.0, 0, 0.0, 0.0
    for p, q in pairs:
        s = score_of_q(q)
        ss = np.sort(s, axis=-1)
        mids = (ss[:, 1:] + ss[:, :-1]) / 2.0
        qs = np.quantile(s, np.linspace(0.0, 1.0, n_thresholds))
        thr = np.concatenate(
            [mids, np.broadcast_to(qs, (len(s), n_thresholds)), ss[:, -1:] + 1.0], axis=1
        )
        for j in range(thr.shape[1]):
            trim = s < thr[:, j : j + 1]
            out = output_distribution(p, q, trim)
            worst = max(worst, float(np.max(np.abs(out - p))))
            trimmed += float((q * trim).sum())
            drafted += len(p)
            cases += len(p)
    return worst, cases, trimmed / max(drafted, 1.0)


def check_features(
    n: int = 500, vocab_sizes: tuple[int, ...] = (2, 3, 5, 16), seed: int = 0
) -> list[LosslessResult]:
    """The lossless flag of every feature in `features.FEATURES`."""
    pairs = random_pairs(n, vocab_sizes, seed)
    results = []
    for feat in FEATURES:
        if feat.score_of_q is None:
            results.append(
                LosslessResult(feat.key, feat.label, None, float("nan"), 0, float("nan"))
            )
            continue
        worst, cases, frac = check_rule(feat.score_of_q, pairs)
        results.append(LosslessResult(feat.key, feat.label, worst <= TOLERANCE, worst, cases, frac))
    return results


def render_worked_example(ex: WorkedExample | None = None) -> str:
    ex = ex or worked_example()
    fmt = lambda xs: "[" + ", ".join(str(float(x)) for x in xs) + "]"  # noqa: E731
    lines = [
        "Worked example (docs/losslessness.md), computed exactly in rational arithmetic:",
        f"  target p = {fmt(ex.p)}, drafter q = {fmt(ex.q)}, trim a draft x when q(x) < {float(ex.threshold)}",
        f"  trimmed when drawn: {['ab'[i] for i, t in enumerate(ex.trim) if t]}",
        f"  output distribution = {fmt(ex.output)}  (exact: {[str(x) for x in ex.output]})",
        f"  target              = {fmt(ex.p)}  -> {'lossless' if ex.output == ex.p else 'NOT lossless'}",
    ]
    return "\n".join(lines)


def render_check(results: list[LosslessResult]) -> str:
    lines = [
        f"Exact check over random (p, q) pairs and thresholds (tolerance {TOLERANCE:g}):",
        "| feature | lossless | max abs error | cases | trimmed mass |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        if r.lossless is None:
            lines.append(
                f"| {r.label} | yes (by construction; not checkable from p, q) | - | - | - |"
            )
        else:
            lines.append(
                f"| {r.label} | {'yes' if r.lossless else 'NO'} | {r.max_abs_error:.3g} | {r.cases} | {r.trimmed_fraction:.3f} |"
            )
    return "\n".join(lines)
