"""The trace's batched speculative decoding: rows of different lengths in one KV cache."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import torch

from avbench.estimator.live_vs_trace import trace_acceptance
from avbench.estimator.trace import (
    BatchCache,
    Models,
    SpecBatch,
    TraceConfig,
    _left_pad,
    trace_pair,
)

IDS = {"run_id": "r", "pair_id": "rand", "workload_id": "w"}
PROMPTS = [[3, 17, 42, 8, 5], [1], [2, 3], [9, 4, 4, 7, 1, 30, 12, 6], [5, 6, 7]]


def _plain_last_logits(model, tokens: list[int]):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1]


def _assert_rows_match_plain_forwards(batch: SpecBatch, models: Models) -> None:
    """Each row's logits after its pending tokens, from (a copy of) the batch cache, equal a
    forward of the row's committed tokens without cache."""
    sides = (
        (batch.target, models.target, [[r.tokens[-1]] for r in batch.rows]),
        (batch.drafter, models.drafter, [r.draft_pending for r in batch.rows]),
    )
    for side, model, pending in sides:
        probe = BatchCache(model, copy.deepcopy(side.cache), side.valid.clone())
        got = probe.forward(*_left_pad(pending, "cpu"))[:, -1]
        assert not torch.isnan(got).any()
        for i, r in enumerate(batch.rows):
            ref = _plain_last_logits(model, r.tokens)
            torch.testing.assert_close(got[i], ref, atol=1e-4, rtol=0, msg=f"row {r.rid}")


def test_batched_rows_match_plain_forwards(small_pair, torch_one_thread):
    models = Models(*small_pair)
    cfg = TraceConfig(num_draft=3, temperature=1.0)
    gen = torch.Generator().manual_seed(4)
    batch = SpecBatch.empty(models)
    batch.admit("a", PROMPTS[0])
    batch.admit("b", PROMPTS[1])
    for _ in range(3):
        batch.step(cfg, gen)
    _assert_rows_match_plain_forwards(batch, models)
    # Joins into a batch with holes, of a longer prompt and of one with no prefix at all.
    batch.admit("c", PROMPTS[3])
    batch.admit("d", PROMPTS[1])
    for _ in range(3):
        batch.step(cfg, gen)
    _assert_rows_match_plain_forwards(batch, models)
    batch.retire([1, 2, 3])
    batch.admit("e", PROMPTS[2])
    batch.step(cfg, gen)
    _assert_rows_match_plain_forwards(batch, models)
    # The scenario exercised what it is meant to: rejected drafts inside the rows, rows of
    # different lengths, and drafter inputs of one and two tokens in the same forward.
    lengths = {len(r.tokens) for r in batch.rows}
    inner_holes = batch.target.valid.cumsum(1).clamp(max=1).sum(1) > batch.target.valid.sum(1)
    assert len(lengths) == len(batch.rows) and inner_holes.any()
    assert {len(r.draft_pending) for r in batch.rows} == {1, 2}


def test_a_row_with_nothing_cached_beside_longer_inputs(small_pair, torch_one_thread):
    # Its left padding attends to no slot at all: must not turn into NaN in the cache.
    target, _ = small_pair
    cache = BatchCache.empty(target, 1)
    cache.forward(torch.tensor([[3, 4, 5]]), torch.ones(1, 3, dtype=torch.bool))
    cache.extend(BatchCache.empty(target, 1))
    cache.forward(*_left_pad([[6, 7], [9]], "cpu"))
    got = cache.forward(*_left_pad([[8], [10]], "cpu"))[:, -1]
    for layer in cache.cache.layers:
        assert not (layer.keys.isnan().any() or layer.values.isnan().any())
    torch.testing.assert_close(
        got[0], _plain_last_logits(target, [3, 4, 5, 6, 7, 8]), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(got[1], _plain_last_logits(target, [9, 10]), atol=1e-4, rtol=0)


def _greedy(model, tokens: list[int], n: int) -> list[int]:
    out = list(tokens)
    for _ in range(n):
        out.append(int(_plain_last_logits(model, out).argmax()))
    return out[len(tokens) :]


def _greedy_labels(models: Models, prompt: list[int], k: int, max_new: int, eos: set[int]):
    """Labels per step of greedy speculative decoding that emits the target's greedy
    continuation, drafts from the drafter's greedy continuation; both without cache."""
    cont = _greedy(models.target, prompt, max_new + k)
    steps, n = [], 0
    while True:
        drafts = _greedy(models.drafter, prompt + cont[:n], k)
        a = next((i for i in range(k) if drafts[i] != cont[n + i]), k)
        steps.append([1] * a + [0] * (min(a + 1, k) - a))
        emitted = cont[n : n + a + 1]
        n += a + 1
        if eos & set(emitted) or n >= max_new:
            return steps


def test_greedy_batched_trace_follows_the_target(small_pair, torch_one_thread):
    models = Models(*small_pair)
    k, max_new = 3, 14
    eos = {_greedy(models.target, PROMPTS[3], 6)[5]}  # one request ends on it mid-way
    cfg = TraceConfig(num_draft=k, temperature=0.0, max_new_tokens=max_new, concurrency=2)
    df = trace_pair(models, PROMPTS, cfg, IDS, sorted(eos))
    assert df["step"].nunique() < len(df.groupby(["request_id", "step"]))  # rows shared steps
    for i, prompt in enumerate(PROMPTS):
        mine = df[df["request_id"] == f"w/{i}"].sort_values(["step", "position"])
        got = [g["label"].tolist() for _, g in mine.groupby("step")]
        assert got == _greedy_labels(models, prompt, k, max_new, eos), i
    assert (df["expected_accept"] == df["label"]).all()


def test_batched_trace_labels_agree_with_expected_acceptance(small_pair, torch_one_thread):
    models = Models(*small_pair)
    cfg = TraceConfig(num_draft=3, temperature=1.0, max_new_tokens=48, concurrency=5, seed=2)
    df = trace_pair(models, PROMPTS * 2, cfg, IDS)
    res = trace_acceptance(df["position"], df["label"], df["expected_accept"], 3)
    assert res.steps > 100
    assert (np.abs(res.sampled - res.expected) <= 3 * res.se_sampled_vs_expected).all(), res
    assert 0.2 < res.expected[0] < 0.95
    pd.testing.assert_frame_equal(df, trace_pair(models, PROMPTS * 2, cfg, IDS))  # seeded
