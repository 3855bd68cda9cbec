"""The per-part step cost model on hand-made steps: a known forward / sampling / drafting / rest
split is recovered from a baseline and one static K, and a step is repriced part by part."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from avbench.predict.model import step_times
from avbench.predict.step_costs import fit_by_workload, fit_step_costs

K = 3
PER_DRAFT, REST_EXCESS = 0.4, 0.6  # target forward per draft; the rest's speculative excess
PER_ROW, PER_ROW_SPEC = 0.1, 0.12  # a sampled row: plain, and in the speculative sampler
FIRST_A, FIRST_B, FIRST_C = 2.0, 0.1, 0.08  # drafter forward: a + b per request + c per token


def _drafter(n: int, tokens: int, context: float = 1.0) -> float:
    return (FIRST_A + FIRST_B * n + FIRST_C * tokens) * context


def _position_sample(n: int) -> float:
    return 0.5 + 0.05 * n


def _steps(k: int, sizes: list[int], context: float = 1.0) -> pd.DataFrame:
    """Back-to-back decode steps at each batch size (20 each), the parts as defined above; the
    rest is whatever the next step's interval leaves after them. ``context`` scales the
    drafter's forwards, as a workload's longer prompts do."""
    rows, t = [], 0
    for n in sizes:
        for _ in range(20):
            forward = 10.0 + 0.5 * n + PER_DRAFT * k * n
            sample = 0.3 + (0.8 + PER_ROW_SPEC * (k + 1) * n if k else PER_ROW * n)
            rest = 1.0 + 0.05 * n + (REST_EXCESS if k else 0.0)
            row = {"step": t, "n_reqs": n, "tokens": n * (k + 1), "drafts": k * n,
                   "forward_ms": forward, "sample_ms": sample, "request_ids": ["r0"]}  # fmt: skip
            draft = 0.0
            if k:
                first = _drafter(n, n * (k + 1), context)
                ends = [first + _position_sample(n)]
                for _ in range(k - 1):
                    ends.append(ends[-1] + _drafter(n, n, context) + _position_sample(n))
                draft = ends[-1] + 0.2
                row |= {"draft_ms": draft, "draft_first_ms": first, "draft_pos_ms": ends}
            rows.append(row | {"busy": forward + sample + draft + rest})
            t += 1
    df = pd.DataFrame(rows)
    return step_times(df.assign(interval_ms=df["busy"].shift(1)).drop(columns="busy"))


SIZES = [1, 2, 4, 8]


def test_the_split_is_recovered_from_the_baseline_and_one_k():
    costs = fit_step_costs(_steps(K, SIZES), _steps(0, SIZES), K)
    assert costs.forward_per_draft.at(np.array(SIZES)) == pytest.approx([PER_DRAFT] * 4)
    # The speculative sampler's slope over n, per row, bounds a row's cost from above (here it
    # is all per row: the bound is the cost), the baseline's row from below; the model takes
    # the middle, the cost inside half the range of it.
    assert costs.sample_per_row == pytest.approx((PER_ROW_SPEC + PER_ROW) / 2)
    assert costs.sample_row_range == pytest.approx((PER_ROW_SPEC - PER_ROW) / 2)
    # The last step of each size has no successor: the median holds the exact rest.
    assert costs.rest_excess.at(np.array(SIZES)) == pytest.approx([REST_EXCESS] * 4)
    # Position 1 is its sampling alone; a later one is a one-token forward and its sampling.
    positions = [p.at(np.array([4]))[0] for p in costs.positions]
    assert positions == pytest.approx(
        [_position_sample(4)] + [_drafter(4, 4) + _position_sample(4)] * 2
    )
    # The first pass's slope (b + 4c) less a later forward's (b + c), over K, is c; the model
    # takes the middle of [c/2, c].
    assert costs.first_pass_per_draft == pytest.approx(0.75 * FIRST_C)
    assert costs.notes == ()


def test_a_step_is_repriced_part_by_part_with_what_one_k_cannot_identify():
    costs = fit_step_costs(_steps(K, SIZES), _steps(0, SIZES), K)
    n, measured, predicted = 4, K * 4, 1 * 4  # K' = 1: 8 drafts fewer, 2 positions fewer
    part = costs.delta(np.array([n]), np.array([measured]), np.array([predicted]),
                       np.array([K]), np.array([1]))  # fmt: skip
    fewer = measured - predicted
    assert part.forward == pytest.approx([-PER_DRAFT * fewer])
    assert part.sample == pytest.approx([-(PER_ROW_SPEC + PER_ROW) / 2 * fewer])
    c = 0.75 * FIRST_C
    assert part.draft == pytest.approx([-c * fewer - 2 * (_drafter(n, n) + _position_sample(n))])
    # The rest's excess is somewhere between per draft (-0.6 * 8/12) and per server (0).
    assert part.rest == pytest.approx([-REST_EXCESS * fewer / measured / 2])
    assert part.unidentified == pytest.approx(
        [REST_EXCESS * fewer / measured / 2 + c / 3 * fewer + (PER_ROW_SPEC - PER_ROW) / 2 * fewer]
    )
    # The drafts measured price to nothing.
    same = costs.delta(np.array([n]), np.array([measured]), np.array([measured]),
                       np.array([K]), np.array([K]))  # fmt: skip
    assert same.total == pytest.approx([0.0]) and same.unidentified == pytest.approx([0.0])
    # Repeated, the step is the source's median decode step at n with the same change.
    source_step = costs.decode_work.at(np.array([n]))[0]
    assert costs.repeat_ms(np.array([n]), np.array([predicted]), np.array([1])) == pytest.approx(
        [source_step + part.total[0]]
    )


def test_without_a_baseline_sampling_and_the_rest_stay_and_it_says_so():
    costs = fit_step_costs(_steps(K, SIZES), pd.DataFrame(), K)
    assert costs.sample_per_row == 0.0
    assert costs.notes == ("no baseline steps: sampling and the rest carried from the source",)


def test_each_workload_is_priced_at_its_own_drafting_cost():
    # Two workloads whose drafter forwards differ 2x (longer prompts, longer attention): one
    # median per batch size over both would price K = 1's two dropped positions between them.
    long_, short = _steps(K, SIZES, context=2.0), _steps(K, SIZES)
    source = pd.concat([long_.assign(workload="long"), short.assign(workload="short")])
    baseline = _steps(0, SIZES).assign(workload="short")  # "long" has no baseline: takes all
    costs = fit_by_workload(source, baseline, K)
    assert sorted(costs) == ["long", "short"]
    n = np.array([4])
    for workload, context in (("long", 2.0), ("short", 1.0)):
        dropped = costs[workload].positions_ms(n, np.array([K])) - costs[workload].positions_ms(
            n, np.array([1])
        )
        assert dropped == pytest.approx([2 * (_drafter(4, 4, context) + _position_sample(4))])
        assert costs[workload].first_pass_per_draft == pytest.approx(0.75 * FIRST_C * context)
        assert costs[workload].rest_excess.at(n) == pytest.approx([REST_EXCESS])


PREFILL_PER_DRAFT = 1.5  # a draft's forward when a prompt is prefilled in the same step


def _with_prefills(k: int, stalled: bool = False) -> pd.DataFrame:
    """Decode steps at each size, then steps that also prefill a prompt: the forward grows with
    the prompt's tokens (and their square) and with the decoding requests' K + 1 tokens each,
    a draft there costing PREFILL_PER_DRAFT / (K + 1) * (K + 1) = its own price. ``stalled``:
    one of them took ten times as long (a core taken away)."""
    decode = _steps(k, SIZES)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(60):
        prompt, decoding = int(rng.integers(20, 400)), int(rng.integers(1, 9))
        tokens = prompt + decoding * (k + 1)
        forward = 30.0 + 2.0 * prompt + 0.001 * prompt**2 + PREFILL_PER_DRAFT * decoding * (k + 1)
        rows.append({"step": 1000 + i, "n_reqs": decoding + 1, "tokens": tokens,
                     "drafts": k * decoding, "forward_ms": forward * (10 if stalled and i == 7 else 1),
                     "sample_ms": 1.0, "work_ms": forward + 2.0})  # fmt: skip
    return pd.concat([decode, pd.DataFrame(rows)], ignore_index=True)


@pytest.mark.parametrize("stalled", [False, True])
def test_a_draft_in_a_step_that_prefills_gets_the_price_regressed_there(stalled):
    costs = fit_step_costs(_with_prefills(K, stalled), _steps(0, SIZES), K)
    assert costs.prefill_per_draft is not None
    price, half = costs.prefill_per_draft
    assert price == pytest.approx(PREFILL_PER_DRAFT, abs=1e-6)
    assert half == pytest.approx(0.0, abs=1e-6)
    n, measured, predicted = np.array([4, 4]), np.array([K * 4] * 2), np.array([4, 4])
    part = costs.delta(n, measured, predicted, np.array([K] * 2), np.array([1] * 2),
                       np.array([False, True]))  # fmt: skip
    # The decode step keeps the decode steps' price, the prefilling one takes its own.
    assert part.forward == pytest.approx([-PER_DRAFT * 8, -PREFILL_PER_DRAFT * 8])


def test_without_enough_steps_that_prefill_their_drafts_are_priced_as_decode_and_it_says_so():
    few = _with_prefills(K).iloc[: len(SIZES) * 20 + 5]
    costs = fit_step_costs(few, _steps(0, SIZES), K)
    assert costs.prefill_per_draft is None
    assert costs.notes == ("too few steps that prefill: their drafts priced as in a decode step",)
    part = costs.delta(np.array([4]), np.array([12]), np.array([4]), np.array([K]),
                       np.array([1]), np.array([True]))  # fmt: skip
    assert part.forward == pytest.approx([-PER_DRAFT * 8])
