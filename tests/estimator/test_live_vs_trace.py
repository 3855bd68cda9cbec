"""Live per-position acceptance against a trace: the comparison."""

from __future__ import annotations

import numpy as np
import pytest

from avbench.estimator.live_vs_trace import TraceAcceptance, captured_acceptance, compare


def _trace(expected, se=0.01):
    k = len(expected)
    return TraceAcceptance(
        1000, np.array(expected), np.array(expected), np.full(k, se), np.full(k, 0.01)
    )


def test_compare_uses_the_live_rate_and_a_tolerance_from_the_drafts():
    res = compare(400, np.array([200, 80]), _trace([0.5, 0.2]))
    assert [p.live for p in res] == [0.5, 0.2]
    # 4 standard errors: binomial over 400 drafts combined with the trace's.
    assert res[0].tolerance == pytest.approx(4 * np.hypot(np.sqrt(0.25 / 400), 0.01))
    assert all(p.passed for p in res)
    off = compare(400, np.array([200, 80]), _trace([0.5, 0.3]))
    assert off[0].passed and not off[1].passed and off[1].diff == pytest.approx(-0.1)
    loose = compare(400, np.array([200, 80]), _trace([0.5, 0.3]), tolerance=0.15)
    assert all(p.passed for p in loose)


def test_a_trace_whose_labels_disagree_with_its_expectation_fails_the_self_check():
    tr = TraceAcceptance(1000, np.array([0.6]), np.array([0.5]), np.array([0.01]), np.array([0.01]))
    (p,) = compare(1000, np.array([500]), tr)
    assert p.live_ok and not p.self_ok and not p.passed


def test_captured_acceptance_counts_as_the_counters_do():
    import pandas as pd

    df = pd.DataFrame({"position": [1, 2, 3, 1, 2, 1], "label": [1, 1, 0, 1, 0, 0]})
    np.testing.assert_allclose(captured_acceptance(df, 3), [2 / 3, 1 / 3, 0.0])
    assert captured_acceptance(df.iloc[:0], 3) is None
