"""The numpy online estimator against known truth, an independent MLE and a dense solve."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from avbench.estimator.online import (
    EstimatorConfig,
    OnlineEstimator,
    logit_qmax_from_logits,
    newton_update,
    replay,
    round_sums,
    sigmoid,
)
from avbench.estimator.synthetic import AcceptanceModel, simulate

TRUE_OMEGA = 0.55
TRUE_BETA = np.array([0.6, 0.3, 0.1, -0.1, -0.3])


def _replay_df(df, cfg=None):
    return replay(
        df["step"].to_numpy(),
        df["position"].to_numpy() - 1,
        df["label"].to_numpy(),
        df["logit_q_max"].to_numpy(),
        cfg,
    )


@pytest.fixture(scope="module")
def sim():
    # 3000 steps x 32 concurrent requests: 30 rounds, about 170k labeled drafts.
    return simulate(AcceptanceModel(TRUE_OMEGA, TRUE_BETA), steps=3000, requests=32, seed=1)


def _mle(df):
    import statsmodels.api as sm

    pos = df["position"].to_numpy() - 1
    x = np.zeros((len(df), 1 + len(TRUE_BETA)))
    x[:, 0] = df["logit_q_max"].to_numpy()
    x[np.arange(len(df)), 1 + pos] = 1.0
    fit = sm.Logit(df["label"].to_numpy(), x).fit(disp=0, tol=1e-12, maxiter=100)
    return fit.params[0], fit.params[1:]


def test_recovers_true_parameters(sim):
    res = _replay_df(sim)
    assert len(res.refits) == 30 and all(r.moved and not r.slope_masked for r in res.refits)
    late = res.refits[len(res.refits) // 2 :]
    omega = np.mean([r.omega for r in late])
    beta = np.mean([r.beta for r in late], axis=0)
    # Stated tolerance: slope within 0.03, every intercept within 0.1 (round-to-round noise
    # of one Newton step on ~5k labels per round, averaged over the last 15 rounds).
    assert abs(omega - TRUE_OMEGA) < 0.03
    assert np.max(np.abs(beta - TRUE_BETA)) < 0.1


def test_agrees_with_unpenalised_mle_on_same_data(sim):
    omega_mle, beta_mle = _mle(sim)
    res = _replay_df(sim)
    late = res.refits[len(res.refits) // 2 :]
    assert abs(np.mean([r.omega for r in late]) - omega_mle) < 0.02
    assert np.max(np.abs(np.mean([r.beta for r in late], axis=0) - beta_mle)) < 0.06


def test_fixed_point_is_the_mle():
    # The same 100 steps fed again and again: lambda sits in the Hessian only, so the
    # iteration's fixed point has a zero gradient, i.e. it is the unpenalised MLE itself.
    base = simulate(AcceptanceModel(TRUE_OMEGA, TRUE_BETA), steps=100, requests=32, seed=2)
    reps = 80
    frames = []
    for i in range(reps):
        d = base.copy()
        d["step"] = d["step"] + 100 * i
        frames.append(d)
    df = pd.concat(frames, ignore_index=True)
    res = _replay_df(df)
    omega_mle, beta_mle = _mle(base)
    assert res.omega == pytest.approx(omega_mle, abs=1e-6)
    np.testing.assert_allclose(res.beta, beta_mle, atol=1e-6)


def test_cold_start_and_first_round_predictions(sim):
    res = _replay_df(sim)
    first = sim["step"].to_numpy() < 100
    expect = sigmoid(0.5 * sim["logit_q_max"].to_numpy()[first] - 0.2)
    np.testing.assert_allclose(res.pred[first], expect, rtol=0, atol=1e-15)
    second = (sim["step"].to_numpy() >= 100) & (sim["step"].to_numpy() < 200)
    r0 = res.refits[0]
    pos = sim["position"].to_numpy()[second] - 1
    np.testing.assert_allclose(
        res.pred[second], sigmoid(r0.omega * sim["logit_q_max"].to_numpy()[second] + r0.beta[pos])
    )


def test_arrowhead_solve_matches_dense_solve():
    rng = np.random.default_rng(3)
    k, n = 4, 300
    f = rng.normal(size=n) * 3
    pos = rng.integers(0, k, n)
    y = (rng.random(n) < sigmoid(f + 0.5)).astype(float)  # true slope 1: the step stays positive
    cfg = EstimatorConfig(num_positions=k)
    omega, beta = 0.7, rng.normal(size=k) * 0.3
    p = sigmoid(omega * f + beta[pos])
    x = np.zeros((n, 1 + k))
    x[:, 0] = f
    x[np.arange(n), 1 + pos] = 1
    h = x.T @ (x * (p * (1 - p))[:, None]) + cfg.ridge * np.eye(1 + k)
    delta = np.linalg.solve(h, x.T @ (y - p))
    nk = np.bincount(pos, minlength=k)
    d_omega = delta[0] * n / (n + 50)
    # As vLLM's kernel: each intercept row of the system is solved with the damped slope step.
    g = x.T @ (y - p)
    d_beta = (g[1:] - h[1:, 0] * d_omega) / np.diag(h)[1:] * nk / (nk + 50)
    w, b, masked = newton_update(omega, beta, round_sums(f, pos, y, p, k), cfg)
    assert masked == ""
    assert w == pytest.approx(omega + d_omega, abs=1e-12)
    np.testing.assert_allclose(b, beta + d_beta, atol=1e-12)


def test_guard_masks_only_the_slope_step():
    rng = np.random.default_rng(4)
    f = rng.normal(size=2000) * 3
    pos = rng.integers(0, 2, 2000)
    y = (f < 0).astype(float)  # the fit wants omega < 0
    p = sigmoid(0.5 * f - 0.2)
    sums = round_sums(f, pos, y, p, 2)
    cfg = EstimatorConfig(num_positions=2)
    w, b, masked = newton_update(0.5, np.full(2, -0.2), sums, cfg)
    assert (masked, w) == ("negative-slope", 0.5)
    a_k, b_k, c_k, g0_k, g1_k, n_k = sums
    expected = -0.2 + g1_k / (c_k + 1e-3) * n_k / (n_k + 50)  # intercepts solved with Δω = 0
    np.testing.assert_allclose(b, expected, atol=1e-12)
    # A NaN in position 2's gradient makes the slope step NaN (masked) and that position's
    # intercept step NaN (zeroed): position 1 still moves.
    sums[4, 1] = np.nan
    w, b, masked = newton_update(0.5, np.full(2, -0.2), sums, cfg)
    assert (masked, w) == ("nan", 0.5) and b[1] == -0.2 and b[0] != -0.2


def test_stateful_estimator_matches_vectorised_replay():
    df = simulate(AcceptanceModel(TRUE_OMEGA, TRUE_BETA), steps=350, requests=4, seed=5)
    res = _replay_df(df)
    est = OnlineEstimator(EstimatorConfig(num_positions=5))
    preds = np.empty(len(df))
    for s, g in df.groupby("step", sort=True):
        preds[g.index] = est.observe_step(g["logit_q_max"], g["position"] - 1, g["label"], int(s))
    assert len(est.refits) == len(res.refits) == 3
    np.testing.assert_allclose(preds, res.pred, atol=1e-12)
    assert est.omega == pytest.approx(res.omega, abs=1e-12)


def test_f_is_stable_and_clamped():
    logits = np.array([[2.0, 1.0, 0.5], [100.0, 0.0, 0.0], [0.0, 0.0, -1.0], [-60.0, 0.0, 0.0]])
    f = logit_qmax_from_logits(logits)
    q = np.exp(logits[0] - logits[0].max())
    q /= q.sum()
    assert f[0] == pytest.approx(np.log(q.max() / (1 - q.max())), abs=1e-12)
    assert f[1] == 40.0  # true value is about 99.3: clamped, not inf or nan
    assert f[2] == pytest.approx(
        -np.log(1 + np.exp(-1.0)), abs=1e-12
    )  # tie: the other max stays in
    assert np.all(np.isfinite(f))


def test_masked_slope_steps_still_move_the_intercepts():
    # Acceptance far above the cold start's prediction and a weak slope: the first Newton step
    # overshoots below zero, so the slope step is masked, yet the refit moves the intercepts
    # and the estimator leaves its cold start.
    rng = np.random.default_rng(6)
    steps, req = 800, 2
    f = rng.normal(-1.5, 1.6, size=(steps * req,))
    y = (rng.random(len(f)) < sigmoid(0.1 * f + 1.8)).astype(np.int8)
    step = np.repeat(np.arange(steps), req)
    res = replay(step, np.zeros(len(f), dtype=np.int64), y, f, EstimatorConfig(num_positions=1))
    assert res.refits[0].slope_masked == "negative-slope" and res.refits[0].omega == 0.5
    assert res.refits[0].moved and res.refits[0].beta[0] > -0.2
    assert all(r.moved for r in res.refits) and res.beta[0] > 1.0


def _drop_steps(df: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """The same stream with ``n`` whole steps removed: calls that graded nothing."""
    steps = np.unique(df["step"].to_numpy())
    gone = np.random.default_rng(seed).choice(steps, size=n, replace=False)
    return df[~df["step"].isin(gone)].reset_index(drop=True)


def test_steps_without_labels_count_toward_the_round(sim):
    # 3000 calls, 182 of which grade nothing: vLLM still refits 30 times, every 100 calls.
    df = _drop_steps(sim, 182, seed=7)
    assert df["step"].nunique() == 3000 - 182 and df["step"].max() == 2999
    res = _replay_df(df)
    assert len(res.refits) == 30
    assert [r.end_step for r in res.refits] == [100 * (i + 1) - 1 for i in range(30)]
    step = df["step"].to_numpy()
    for r in res.refits[:3]:
        in_round = (step // 100) == r.round
        counts = np.bincount(df["position"].to_numpy()[in_round] - 1, minlength=5)
        np.testing.assert_array_equal(r.n, counts)


def test_replay_matches_the_stateful_estimator_fed_empty_steps():
    df = _drop_steps(
        simulate(AcceptanceModel(TRUE_OMEGA, TRUE_BETA), steps=350, requests=4, seed=8), 60, seed=9
    )
    est = OnlineEstimator(EstimatorConfig(num_positions=5))
    by_step = dict(tuple(df.groupby("step", sort=True)))
    empty = np.array([], dtype=np.float64)
    preds = np.empty(len(df))
    for s in range(350):
        g = by_step.get(s)
        if g is None:
            est.observe_step(empty, empty.astype(np.int64), empty, s)
            continue
        preds[g.index] = est.observe_step(g["logit_q_max"], g["position"] - 1, g["label"], s)
    res = _replay_df(df)
    assert len(est.refits) == len(res.refits) == 3
    np.testing.assert_allclose(preds, res.pred, atol=1e-12)
    assert [r.end_step for r in est.refits] == [r.end_step for r in res.refits]


def test_trailing_calls_and_empty_rounds():
    # Labels only in the first 150 calls of 420: the replay is told how many calls there were.
    df = simulate(AcceptanceModel(TRUE_OMEGA, TRUE_BETA), steps=150, requests=4, seed=10)
    short = _replay_df(df)
    full = replay(
        df["step"].to_numpy(),
        df["position"].to_numpy() - 1,
        df["label"].to_numpy(),
        df["logit_q_max"].to_numpy(),
        EstimatorConfig(num_positions=5),
        num_steps=420,
    )
    assert len(short.refits) == 1 and len(full.refits) == 4
    assert full.refits[1].moved  # calls 100-149 carried labels
    # Rounds without a label end in a refit that moves nothing.
    assert [r.moved for r in full.refits[2:]] == [False, False]
    assert full.refits[-1].omega == full.refits[1].omega
    with pytest.raises(ValueError, match="num_steps"):
        replay(df["step"], df["position"] - 1, df["label"], df["logit_q_max"], num_steps=100)
