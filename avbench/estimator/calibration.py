"""Ranking and calibration metrics of acceptance predictors (docs/losslessness.md, evaluation axes).

All metrics take optional non-negative weights so a bootstrap replicate is a weight vector
(multiplicity of each draft) and never a copy of the data; AUC sorts once per predictor
(`RankedScores`) and each replicate is then O(n).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_BINS = 10
_EPS = np.finfo(np.float64).eps


@dataclass(frozen=True)
class RankedScores:
    """Scores grouped into distinct values in ascending order (ties share a group)."""

    group: np.ndarray  # group id of each sample
    n_groups: int

    @classmethod
    def of(cls, score: np.ndarray) -> RankedScores:
        s = np.asarray(score, dtype=np.float64)
        order = np.argsort(s, kind="stable")
        ss = s[order]
        new = np.empty(len(ss), dtype=bool)
        if len(ss):
            new[0] = True
            new[1:] = ss[1:] != ss[:-1]
        gid_sorted = np.cumsum(new) - 1
        group = np.empty(len(ss), dtype=np.int64)
        group[order] = gid_sorted
        return cls(group, int(gid_sorted[-1]) + 1 if len(ss) else 0)

    def auc(self, y: np.ndarray, w: np.ndarray | None = None) -> float:
        y = np.asarray(y, dtype=np.float64)
        wp = y if w is None else y * w
        wn = (1.0 - y) if w is None else (1.0 - y) * w
        pos = np.bincount(self.group, weights=wp, minlength=self.n_groups)
        neg = np.bincount(self.group, weights=wn, minlength=self.n_groups)
        tp, tn = pos.sum(), neg.sum()
        if tp <= 0 or tn <= 0:
            return float("nan")
        neg_below = np.cumsum(neg) - neg
        # Mann-Whitney: a tie between an accepted and a rejected draft counts one half.
        return float(np.sum(pos * (neg_below + 0.5 * neg)) / (tp * tn))


def auc(y: np.ndarray, score: np.ndarray, w: np.ndarray | None = None) -> float:
    """P(score of a random accepted draft > score of a random rejected one), ties 1/2."""
    return RankedScores.of(score).auc(y, w)


def log_loss(y: np.ndarray, p: np.ndarray, w: np.ndarray | None = None) -> float:
    """Mean -log P(observed label); p clipped to [eps, 1 - eps] like scikit-learn."""
    y = np.asarray(y, dtype=np.float64)
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    ll = -(y * np.log(p) + (1.0 - y) * np.log1p(-p))
    if w is None:
        return float(ll.mean()) if len(ll) else float("nan")
    return float(np.sum(w * ll) / np.sum(w))


def bin_index(p: np.ndarray, n_bins: int = DEFAULT_BINS) -> np.ndarray:
    """Equal-width bins on [0, 1]: [0, 1/n), ..., [(n-1)/n, 1]; edges from linspace."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    return np.clip(
        np.searchsorted(edges, np.asarray(p, dtype=np.float64), side="right") - 1, 0, n_bins - 1
    )


def ece(
    y: np.ndarray, p: np.ndarray, n_bins: int = DEFAULT_BINS, w: np.ndarray | None = None
) -> float:
    """Sum over bins of occupancy * |mean prediction - observed rate|."""
    y = np.asarray(y, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    w = np.ones_like(p) if w is None else np.asarray(w, dtype=np.float64)
    b = bin_index(p, n_bins)
    cnt = np.bincount(b, weights=w, minlength=n_bins)
    sp = np.bincount(b, weights=w * p, minlength=n_bins)
    sy = np.bincount(b, weights=w * y, minlength=n_bins)
    total = cnt.sum()
    if total <= 0:
        return float("nan")
    return float(np.sum(np.abs(sp - sy)) / total)


@dataclass(frozen=True)
class Metrics:
    n: int
    auc: float
    log_loss: float
    ece: float
    mean_pred: float
    observed: float
    n_bins: int


def metrics(y: np.ndarray, p: np.ndarray, n_bins: int = DEFAULT_BINS) -> Metrics:
    """AUC, log-loss, ECE and mean prediction vs observed acceptance of one predictor."""
    y = np.asarray(y, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    if len(y) == 0:
        nan = float("nan")
        return Metrics(0, nan, nan, nan, nan, nan, n_bins)
    return Metrics(
        n=len(y),
        auc=auc(y, p),
        log_loss=log_loss(y, p),
        ece=ece(y, p, n_bins),
        mean_pred=float(p.mean()),
        observed=float(y.mean()),
        n_bins=n_bins,
    )


@dataclass(frozen=True)
class Comparison:
    """A minus B with percentile bootstrap intervals of the paired difference."""

    a: Metrics
    b: Metrics
    diff: dict[str, float]
    ci_low: dict[str, float]
    ci_high: dict[str, float]
    n_boot: int
    level: float
    clusters: int


@dataclass(frozen=True)
class Bootstrap:
    """How the paired bootstrap of :func:`compare` resamples: ``n_boot`` replicates, a
    ``level`` percentile interval, a seeded generator."""

    n_boot: int = 200
    level: float = 0.95
    seed: int = 0


def compare(
    y: np.ndarray,
    pa_: np.ndarray,
    pb: np.ndarray,
    cluster: np.ndarray | None = None,
    boot: Bootstrap = Bootstrap(),
    n_bins: int = DEFAULT_BINS,
) -> Comparison:
    """Compare two predictors on the same drafts with a paired (cluster) bootstrap.

    Drafts of one request are correlated, so by default whole clusters (e.g. requests) are
    resampled: each replicate draws cluster multiplicities from a multinomial and weights the
    drafts by them. Both predictors see the same replicate, so the interval is of the difference.
    """
    n_boot, level = boot.n_boot, boot.level
    y = np.asarray(y, dtype=np.float64)
    ma, mb = metrics(y, pa_, n_bins), metrics(y, pb, n_bins)
    names = ("auc", "log_loss", "ece")
    diff = {k: getattr(ma, k) - getattr(mb, k) for k in names}
    if cluster is None:
        cid = np.arange(len(y))
    else:
        _, cid = np.unique(np.asarray(cluster), return_inverse=True)
    n_cl = int(cid.max()) + 1 if len(cid) else 0
    rng = np.random.default_rng(boot.seed)
    ra, rb = RankedScores.of(pa_), RankedScores.of(pb)
    reps = {k: np.empty(n_boot) for k in names}
    for i in range(n_boot):
        counts = rng.multinomial(n_cl, np.full(n_cl, 1.0 / n_cl)).astype(np.float64)
        w = counts[cid]
        reps["auc"][i] = ra.auc(y, w) - rb.auc(y, w)
        reps["log_loss"][i] = log_loss(y, pa_, w) - log_loss(y, pb, w)
        reps["ece"][i] = ece(y, pa_, n_bins, w) - ece(y, pb, n_bins, w)
    alpha = (1.0 - level) / 2.0
    lo = {k: float(np.nanquantile(v, alpha)) if n_boot else float("nan") for k, v in reps.items()}
    hi = {
        k: float(np.nanquantile(v, 1 - alpha)) if n_boot else float("nan") for k, v in reps.items()
    }
    return Comparison(ma, mb, diff, lo, hi, n_boot, level, n_cl)
