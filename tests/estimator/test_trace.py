"""Offline tracing with real transformers models (small random Llamas built here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from avbench.cli import app
from avbench.estimator.drafts import read_drafts, read_estimator_log, validate_drafts
from avbench.estimator.trace import (
    Models,
    TraceConfig,
    chi_square,
    distribution_test,
    emitted_tokens,
    spec_step,
    target_marginals,
    trace_pair,
)

ALPHA = 0.01  # significance level of the distribution tests
CONTEXT = [3, 17, 42, 8, 5]


def test_trace_rows_follow_schema(small_pair, torch_one_thread):
    target, drafter = small_pair
    cfg = TraceConfig(
        num_draft=4, temperature=1.0, top_p=0.95, max_new_tokens=24, num_prompts=6, concurrency=3
    )
    ids = {"run_id": "r", "pair_id": "rand", "workload_id": "w"}
    df = trace_pair(Models(target, drafter), [CONTEXT, CONTEXT[:3], [1, 2]] * 2, cfg, ids)
    out = validate_drafts(df, "trace", structure=True)  # positions 1..n, 0 only last
    assert len(out) > 50 and set(out["position"]) <= {1, 2, 3, 4}
    assert 0.05 < out["label"].mean() < 0.99  # the drafter is neither useless nor perfect
    # features are consistent: q_sampled <= q_max is not guaranteed (top-p renormalises), but
    # f must equal logit(q_max) where q_max is not close to 1.
    m = out["q_max"] < 0.99
    np.testing.assert_allclose(
        out.loc[m, "logit_q_max"],
        np.log(out.loc[m, "q_max"] / (1 - out.loc[m, "q_max"])),
        atol=1e-6,
    )
    # three requests share each step id (one batch) until they finish
    assert out.groupby("step")["request_id"].nunique().max() == 3


def test_kv_cache_path_matches_recomputation(small_pair, torch_one_thread):
    target, drafter = small_pair
    cfg = TraceConfig(num_draft=3, temperature=1.0)

    def run(use_cache):
        gen, ids, caches, fs = torch.Generator().manual_seed(3), torch.tensor([CONTEXT]), None, []
        for _ in range(12):
            res, caches = spec_step(target, drafter, ids, cfg, gen, caches if use_cache else None)
            fs.append(res.f[0].numpy())
            ids = torch.cat([ids, torch.tensor([emitted_tokens(res, 0)])], dim=1)
        return ids[0].tolist(), np.concatenate(fs)

    (a, fa), (b, fb) = run(True), run(False)
    assert a == b and len(a) > len(CONTEXT) + 12
    np.testing.assert_allclose(fa, fb, atol=1e-4)


def test_greedy_speculative_decoding_equals_target_greedy(small_pair, torch_one_thread):
    target, drafter = small_pair
    cfg = TraceConfig(num_draft=3, temperature=0.0)
    gen, ids, caches = torch.Generator().manual_seed(0), torch.tensor([CONTEXT]), None
    accepted = 0
    while ids.shape[1] < len(CONTEXT) + 20:
        res, caches = spec_step(target, drafter, ids, cfg, gen, caches)
        accepted += int(res.n_accepted[0])
        ids = torch.cat([ids, torch.tensor([emitted_tokens(res, 0)])], dim=1)
    ref = torch.tensor([CONTEXT])
    with torch.inference_mode():
        for _ in range(ids.shape[1] - len(CONTEXT)):
            ref = torch.cat([ref, target(input_ids=ref).logits[:, -1:].argmax(-1)], dim=1)
    assert ids.tolist() == ref.tolist()
    assert accepted > 0


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.8, 0.9)])
def test_emitted_tokens_follow_target(small_pair, torch_one_thread, temperature, top_p):
    target, drafter = small_pair
    cfg = TraceConfig(num_draft=3, temperature=temperature, top_p=top_p, seed=11)
    res = distribution_test(target, drafter, CONTEXT, cfg, trials=12000, alpha=ALPHA)
    assert res.mean_accepted > 0.3  # acceptance is exercised, not only the resampling path
    assert res.first.passed and res.second.passed, res


def test_distribution_test_rejects_the_drafter(small_pair, torch_one_thread):
    # Negative control: tokens drawn from q itself must fail the same test at the same level.
    target, drafter = small_pair
    cfg = TraceConfig(num_draft=1, temperature=1.0)
    p1, _ = target_marginals(target, CONTEXT, cfg)
    q1, _ = target_marginals(drafter, CONTEXT, cfg)
    draws = np.random.default_rng(0).choice(len(q1), size=12000, p=q1 / q1.sum())
    res = chi_square(np.bincount(draws, minlength=len(p1)), p1, ALPHA)
    assert not res.passed and res.p_value < 1e-6


def test_trace_cli_then_tables(pair_dirs, tmp_path, torch_one_thread):
    target, drafter = pair_dirs
    run = tmp_path / "run-1"
    r = CliRunner().invoke(
        app,
        ["trace", "--pair", "rand", "--target", str(target), "--drafter", str(drafter), "-w", "gsm8k", "-w",
         "humaneval", "--out", str(run), "--prompts", "3", "--max-new-tokens", "16"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    df = read_drafts(run / "drafts" / "rand__gsm8k.drafts.parquet", structure=True)
    assert set(df["workload_id"]) == {"gsm8k"} and df["estimator_pred"].notna().all()
    assert set(df["run_id"]) == {"run-1"}
    read_estimator_log(run / "drafts" / "rand__humaneval.estimator.parquet")
    out = tmp_path / "tables"
    r = CliRunner().invoke(app, ["tables", str(run), "--out", str(out), "--boot", "10"])
    assert r.exit_code == 0, r.output
    md = (out / "tables.md").read_text()
    assert "not applicable: no confidence-head scores" in md
    for name in (
        "features",
        "estimator_vs_head",
        "auc_per_position",
        "slope_per_workload",
        "slope_per_pair",
    ):
        assert (out / f"{name}.csv").stat().st_size > 0


def test_unknown_pair_and_workload_are_one_line_errors(tmp_path):
    from avbench.errors import AvbenchError
    from avbench.estimator.prompts import load_prompts
    from avbench.estimator.trace import resolve_pair

    with pytest.raises(AvbenchError, match="unknown pair"):
        resolve_pair("nope")
    with pytest.raises(AvbenchError, match="no config.json"):
        resolve_pair(None, tmp_path, tmp_path)
    with pytest.raises(AvbenchError, match="unknown workload"):
        load_prompts("nope", 3)
    assert len(load_prompts("mt-bench", 5)) == 5


def _tiny_pair():
    from avbench.estimator.trace import resolve_pair

    try:
        return resolve_pair("tiny-cpu")
    except Exception:  # weights not generated in this checkout
        return None


@pytest.mark.skipif(_tiny_pair() is None, reason="shipped tiny pair not present")
@pytest.mark.slow
def test_shipped_tiny_pair_follows_target(torch_one_thread):
    from avbench.estimator.trace import check_pair

    cfg = TraceConfig(num_draft=4, temperature=1.0, top_p=1.0, seed=5)
    res = check_pair(_tiny_pair(), "gsm8k", cfg, trials=6000, alpha=ALPHA)
    assert res.mean_accepted > 0.5
    assert res.passed, res
