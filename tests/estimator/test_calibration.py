"""AUC and log-loss against scikit-learn, ECE against a direct loop, bootstrap comparison."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import log_loss as sk_log_loss
from sklearn.metrics import roc_auc_score

from avbench.estimator.calibration import Bootstrap, auc, compare, ece, log_loss, metrics


def _direct_ece(y, p, n_bins):
    """Textbook ECE: loop over equal-width bins [i/n, (i+1)/n), the last one closed at 1."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    total = 0.0
    for i in range(n_bins):
        hi_ok = p <= edges[i + 1] if i == n_bins - 1 else p < edges[i + 1]
        m = (p >= edges[i]) & hi_ok
        if m.any():
            total += m.sum() / len(p) * abs(p[m].mean() - y[m].mean())
    return total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_and_log_loss_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    n = 5000
    y = (rng.random(n) < 0.7).astype(int)
    s = np.clip(rng.random(n) * 0.6 + 0.35 * y, 1e-6, 1 - 1e-6)
    s_ties = np.round(s, 2)  # many ties: the half-credit rule matters
    assert auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-9)
    assert auc(y, s_ties) == pytest.approx(roc_auc_score(y, s_ties), abs=1e-9)
    assert log_loss(y, s) == pytest.approx(sk_log_loss(y, s), abs=1e-9)


@pytest.mark.parametrize("n_bins", [10, 15, 7])
def test_ece_matches_direct_implementation(n_bins):
    rng = np.random.default_rng(n_bins)
    p = rng.random(4000)
    p[:50] = np.round(p[:50], 1)  # values on bin edges
    p[50] = 1.0
    y = (rng.random(4000) < p**1.5).astype(float)
    assert ece(y, p, n_bins) == pytest.approx(_direct_ece(y, p, n_bins), abs=1e-12)
    assert ece(y, p, n_bins) > 0.01  # miscalibrated on purpose


def test_weights_equal_repetition():
    rng = np.random.default_rng(7)
    y = (rng.random(300) < 0.5).astype(float)
    p = np.round(rng.random(300), 2)
    w = rng.integers(0, 4, 300).astype(float)
    rep = np.repeat(np.arange(300), w.astype(int))
    assert auc(y, p, w) == pytest.approx(auc(y[rep], p[rep]), abs=1e-12)
    assert log_loss(y, p, w) == pytest.approx(log_loss(y[rep], p[rep]), abs=1e-12)
    assert ece(y, p, 10, w) == pytest.approx(ece(y[rep], p[rep], 10), abs=1e-12)


def test_metrics_summary_and_comparison():
    rng = np.random.default_rng(8)
    n = 4000
    truth = rng.random(n)
    y = (rng.random(n) < truth).astype(float)
    good, noisy = truth, np.clip(truth + rng.normal(0, 0.3, n), 0.01, 0.99)
    m = metrics(y, good)
    assert m.n == n and m.n_bins == 10
    assert m.mean_pred == pytest.approx(good.mean()) and m.observed == pytest.approx(y.mean())
    c = compare(y, good, noisy, cluster=np.arange(n) // 4, boot=Bootstrap(n_boot=100))
    assert c.diff["auc"] > 0 and c.ci_low["auc"] > 0  # the true probability ranks better
    assert c.ci_low["log_loss"] <= c.diff["log_loss"] <= c.ci_high["log_loss"]
    same = compare(y, good, good, boot=Bootstrap(n_boot=20))
    assert same.diff == {"auc": 0.0, "log_loss": 0.0, "ece": 0.0} and same.ci_high["auc"] == 0.0
