"""Exact expected acceptance sum_x min(p, q) of the trace, and its drafter semantics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from avbench.estimator.live_vs_trace import trace_acceptance
from avbench.estimator.trace import (
    Models,
    TraceConfig,
    draft_probs,
    expected_acceptance,
    load_model,
    load_tokenizer,
    sampling_probs,
    trace_pair,
)


def _brute_force(p: np.ndarray, q: np.ndarray, trials: int, rng) -> float:
    """Acceptance of rejection sampling by simulation: draw x ~ q, accept with min(1, p/q)."""
    x = rng.choice(len(q), size=trials, p=q)
    return float((rng.random(trials) < np.minimum(1.0, p[x] / q[x])).mean())


def test_sum_min_equals_the_acceptance_of_rejection_sampling():
    rng = np.random.default_rng(0)
    for _ in range(5):
        p, q = rng.dirichlet(np.ones(12) * 0.5), rng.dirichlet(np.ones(12) * 0.5)
        exact = expected_acceptance(p, q)
        # The sum over tokens written out: q(x) min(1, p(x)/q(x)).
        by_token = sum(qx * min(1.0, px / qx) for px, qx in zip(p, q, strict=True) if qx > 0)
        assert exact == pytest.approx(by_token, abs=1e-12)
        assert abs(_brute_force(p, q, 200_000, rng) - exact) < 4 * np.sqrt(0.25 / 200_000)
    assert expected_acceptance(p, p) == pytest.approx(1.0)
    assert expected_acceptance(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 0.0


def test_torch_and_numpy_agree():
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(9), size=3), rng.dirichlet(np.ones(9), size=3)
    got = expected_acceptance(torch.tensor(p), torch.tensor(q)).numpy()
    np.testing.assert_allclose(got, expected_acceptance(p, q), atol=1e-12)


def test_top_p_cuts_only_the_target_by_default():
    """vLLM: q is the drafter's temperature softmax; p gets top-p. A drafter equal to the target
    then accepts exactly the target's top-p mass; cutting q too restores 1."""
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    full = torch.softmax(logits / 0.7, -1)
    cfg = TraceConfig(temperature=0.7, top_p=0.8)
    p = sampling_probs(logits, 0.7, 0.8)
    kept = p > 0
    assert 0 < kept.sum() < 5
    torch.testing.assert_close(draft_probs(logits, cfg), full)
    assert float(expected_acceptance(p, draft_probs(logits, cfg))) == pytest.approx(
        float(full[kept].sum())
    )
    both = TraceConfig(temperature=0.7, top_p=0.8, draft_top_p=True)
    assert float(expected_acceptance(p, draft_probs(logits, both))) == pytest.approx(1.0)


def test_top_p_keeps_the_top_token_when_it_alone_passes_the_threshold():
    logits = torch.tensor([[10.0, 0.0, 0.0]])
    p = sampling_probs(logits, 1.0, 0.5)
    assert p[0].tolist() == [1.0, 0.0, 0.0]
    q = sampling_probs(logits, 1.0, 1.0)
    assert float(expected_acceptance(p, q)) == pytest.approx(float(q[0, 0]))


def test_greedy_expected_acceptance_is_the_argmax_match():
    t = torch.tensor([[0.1, 2.0, 0.3], [1.0, 0.0, 0.5]])
    d = torch.tensor([[0.0, 1.0, 0.2], [0.0, 1.0, 0.5]])
    cfg = TraceConfig(temperature=0.0, top_p=0.9)
    got = expected_acceptance(sampling_probs(t, 0.0, 0.9), draft_probs(d, cfg))
    assert got.tolist() == [1.0, 0.0]


def test_trace_acceptance_is_unconditional_on_earlier_positions():
    # Two steps: [1, 1, 0] and [0]; three positions.
    position = np.array([1, 2, 3, 1])
    label = np.array([1, 1, 0, 0])
    expected = np.array([0.8, 0.6, 0.5, 0.4])
    res = trace_acceptance(position, label, expected, 3)
    assert res.steps == 2
    np.testing.assert_allclose(res.sampled, [0.5, 0.5, 0.0])
    np.testing.assert_allclose(res.expected, [0.6, 0.3, 0.25])
    # Position 3: per-step values 0.5 and 0 -> standard error of their mean.
    assert res.se_expected[2] == pytest.approx(np.std([0.5, 0.0], ddof=1) / np.sqrt(2))
    assert res.se_sampled_vs_expected[0] == pytest.approx(np.sqrt(0.8 * 0.2 + 0.4 * 0.6) / 2)


def test_traced_labels_agree_with_their_expected_acceptance(torch_one_thread):
    """A seeded trace of the shipped tiny pair at T = 1, top-p 0.95 (vLLM semantics): per
    position the sampled acceptance is within 3 standard errors of the mean sum min(p, q)."""
    from avbench.assets import tiny_pair_dir

    root = tiny_pair_dir()
    tok = load_tokenizer(root / "target")
    target, drafter = load_model(root / "target"), load_model(root / "drafter")
    prompts = [tok(t)["input_ids"] for t in ("Question: 12 + 30 =", "def add(a, b):", "The")]
    cfg = TraceConfig(num_draft=3, temperature=1.0, top_p=0.95, max_new_tokens=64, seed=3)
    ids = {"run_id": "r", "pair_id": "tiny-cpu", "workload_id": "w"}
    df = trace_pair(Models(target, drafter), prompts * 2, cfg, ids)
    assert df["expected_accept"].between(0, 1).all()
    for pos, g in df.groupby("position"):
        e = g["expected_accept"].to_numpy()
        se = np.sqrt((e * (1 - e)).sum()) / len(e)
        assert len(e) > 20, pos
        assert abs(g["label"].mean() - e.mean()) <= 3 * se, (pos, g["label"].mean(), e.mean())
    res = trace_acceptance(df["position"], df["label"], df["expected_accept"], 3)
    assert (np.abs(res.sampled - res.expected) <= 3 * res.se_sampled_vs_expected).all()
    assert 0.05 < res.expected[0] < 0.95  # the pair is neither useless nor perfect
