"""Exact losslessness of trimming rules (docs/losslessness.md)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from avbench.estimator.lossless import (
    check_features,
    output_distribution,
    random_pairs,
    worked_example,
)


def test_worked_example_is_exactly_04_06():
    ex = worked_example()
    assert ex.trim == [True, False]
    assert ex.output == [Fraction(2, 5), Fraction(3, 5)]
    # float path agrees
    out = output_distribution(np.array([0.5, 0.5]), np.array([0.2, 0.8]), np.array([True, False]))
    np.testing.assert_allclose(out, [0.4, 0.6], atol=1e-15)


def test_untrimmed_and_fully_trimmed_sampling_give_p():
    for p, q in random_pairs(200, (2, 7, 50), seed=1):
        none = output_distribution(p, q, np.zeros_like(q, dtype=bool))
        full = output_distribution(p, q, np.ones_like(q, dtype=bool))
        np.testing.assert_allclose(none, p, atol=1e-12)
        np.testing.assert_allclose(full, p, atol=1e-12)


def test_feature_flags():
    res = {r.key: r for r in check_features(n=300)}
    for key in ("logit_qmax_fitted", "qmax_nofit", "entropy_fitted"):
        assert res[key].lossless is True and res[key].max_abs_error <= 1e-12
        assert 0.1 < res[key].trimmed_fraction < 0.9  # the rule did trim: not a vacuous pass
    for key in ("logit_qsampled_fitted", "gumbel_qsampled_fitted"):
        assert res[key].lossless is False and res[key].max_abs_error > 0.05
    assert res["head"].lossless is None  # not decidable from (p, q) alone


def test_lossless_command_prints_the_worked_example():
    from typer.testing import CliRunner

    from avbench.cli import app

    r = CliRunner().invoke(app, ["lossless", "--pairs", "50"])
    assert r.exit_code == 0, r.output
    assert "output distribution = [0.4, 0.6]" in r.output and "NOT lossless" in r.output
    assert (
        "| logit(q_sampled), fitted | NO |" in r.output and "| entropy, fitted | yes |" in r.output
    )
