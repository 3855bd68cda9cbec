"""The predictor on hand-made captures: AV admits what vLLM's own code admits, static and
schedule replays give the numbers worked out by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from avbench.estimator.online import sigmoid
from avbench.predict.curves import CostTables
from avbench.predict.model import (
    AvState,
    CellReplay,
    Policy,
    Pricing,
    continue_rate,
    position_labels,
    predict_cell,
    step_times,
)
from avbench.predict.step_costs import PerBatch, StepCosts
from avbench.predict.vllm_av import AV_MODULE, DecisionCode, assign_budget, build_cost_tables

K = 3


def _tables(draft_ms: float = 0.0, verify_slope: float = 0.0) -> Pricing:
    """Flat draft cost per position; verify cost 10 ms + ``verify_slope`` per token: vLLM's
    tables for AV's budget and step costs that price the replay alike."""
    verify = [(t, 10.0 + verify_slope * t) for t in range(1, 65)]
    drafts = {
        k: build_cost_tables([(1, draft_ms * k), (8, draft_ms * k)], verify, 16, 128)[0]
        for k in range(K + 1)
    }
    tables = CostTables(drafts, build_cost_tables([(1, 0.0)], verify, 16, 128)[1], 64, 2)
    flat = PerBatch(np.full(17, draft_ms))
    zero = PerBatch.zero(16)
    costs = StepCosts(
        K,
        PerBatch(np.full(17, verify_slope)),
        0.0,
        0.0,
        zero,
        0.0,
        (flat,) * K,
        PerBatch(np.full(17, 10.0)),
    )
    return Pricing(costs, tables)


def _cell(accepted: list[list[int]], f: list[list[list[float]]] | None = None) -> CellReplay:
    """Steps 1..S, every request in every step with K drafts; accepted[s][r]."""
    n = len(accepted[0])
    steps = pd.DataFrame(
        {
            "step": range(1, len(accepted) + 1),
            "n_reqs": n,
            "tokens": n * (1 + K),
            "drafts": n * K,
            "forward_ms": 10.0,
            "sample_ms": 0.0,
            "draft_ms": 0.0,
            "interval_ms": [None] + [10.0] * (len(accepted) - 1),
        }
    )
    rows = []
    for s, acc in enumerate(accepted, start=1):
        for r, a in enumerate(acc):
            feats = np.array(f[s - 1][r]) if f is not None else np.zeros(K)
            rows.append(
                {"request_id": f"r{r}", "step": s, "accepted": a, "scheduled": K, "f": feats}
            )
    return CellReplay(
        K, step_times(steps), pd.DataFrame(rows), {f"r{r}": 4.0 for r in range(n)}, 100.0
    )


def test_position_labels_lay_verify_events_on_output_positions():
    # accepted 3 of 3 (then the bonus: never drafted), 1 of 3 (then a rejection), 0 of 3.
    lab = position_labels(np.array([3, 1, 0]), np.array([3, 3, 3]))
    assert lab.tolist() == [1, 1, 1, -1, 1, 0, 0]


def test_a_never_drafted_position_continues_at_the_rate_after_the_longest_run_seen():
    # 20 times: a stretch of four accepted drafts, then a lone one. After one accepted draft
    # the next is accepted 3 times in 5, after two 2 in 3 (60 pairs), after three 1 in 2 but
    # seen 40 times only: too few, the rate after two stands.
    labels = [np.array([0, 1, 1, 1, 1, 0, 1, 0] * 20, dtype=np.int8)]
    assert continue_rate(labels, 1) == pytest.approx(3 / 5)
    assert continue_rate(labels, 2) == pytest.approx(2 / 3)
    assert continue_rate(labels, 3) == pytest.approx(2 / 3)
    assert continue_rate([np.array([1, -1, 0], dtype=np.int8)], 2) == 0.5  # no pair known


def test_static_replay_walks_the_positions_and_reprices_the_steps():
    # 2 requests, 4 steps at K = 3; each step 10 ms of work, back to back (no idle time).
    cell = _cell([[3, 0], [1, 2], [0, 0], [3, 3]])
    tables = _tables(verify_slope=1.0)  # verify: 10 ms + 1 ms per forward token
    pred, rep = predict_cell(cell, tables, Policy("static", 1))
    # Positions (1 accepted, 0 rejected, - the bonus after a full step):
    #   r0: 1 1 1 - 1 0 0 1 1 1 -    r1: 0 1 1 0 0 1 1 1 -
    # At K' = 1 each step accepts the label where it starts, then emits the target's token:
    #   r0 steps at 0, 2, 4, 6, 7, 9 (5 accepted), r1 at 0, 1, 3, 4, 5, 7 (3 accepted).
    assert rep.requests.set_index("request_id")[["draft_steps", "accepted"]].to_dict("index") == {
        "r0": {"draft_steps": 6, "accepted": 5}, "r1": {"draft_steps": 6, "accepted": 3}
    }  # fmt: skip
    assert pred.acceptance_length == pytest.approx(1 + 8 / 12)
    # One draft per request per step: forward tokens 8 -> 4, 4 ms less per step.
    assert pred.verified_drafts_per_step == 2.0
    assert (rep.steps["work_pred_ms"] - rep.steps["work_ms"]).tolist() == pytest.approx([-4.0] * 4)
    # Tokens per step: measured 5, 5, 2, 8; predicted 11/6 + 9/6 = 10/3 in each. The cell's
    # time: sum(6 ms * tok / tok') = 6 * 20 / (10/3) = 36 ms against 40 ms measured.
    assert pred.output_tok_s_per_gpu == pytest.approx(100.0 * 40 / 36)


def test_a_stall_in_a_measured_step_is_not_repeated_with_the_step():
    """A step that yields fewer tokens is repeated as a decode step of its batch (the source's
    median one, repriced), so 20 ms the engine lost in one measured step are lost once."""
    cell = _cell([[3, 0], [1, 2], [0, 0], [3, 3]])
    cell.steps.loc[1, "work_ms"] += 20.0  # step 2 took 30 ms
    pred, rep = predict_cell(cell, _tables(verify_slope=1.0), Policy("static", 1))
    assert rep.steps["repeat_ms"].tolist() == pytest.approx([6.0] * 4)
    # As in the replay above, the steps repeat 1.5, 1.5, 0.6 and 2.4 times: 36 ms of decode
    # steps, and the stall once: 56 ms against 60 measured (a copy of the step would be 66).
    assert pred.output_tok_s_per_gpu == pytest.approx(100.0 * 60 / 56)


def test_schedule_uses_the_k_of_the_batch_that_drafted():
    cell = _cell([[3, 3], [3, 3], [3, 3]])
    sizes = [1, 2, 2]  # the batch grows from 1 to 2 requests after the first step
    cell = CellReplay(K, cell.steps.assign(n_reqs=sizes), cell.events, cell.tpot_ms, 100.0)
    _, rep = predict_cell(cell, _tables(), Policy("schedule", schedule=[(1, 1, 3), (2, 8, 1)]))
    # Positions 0-3 and 4-7 were covered by steps 1 and 2, drafted by a batch of 1 (K 3);
    # positions 8-11 by step 3, drafted by a batch of 2 (K 1). Each request: a step accepting
    # 3 at 0, another at 4, then 1 at 8 and 1 at 10: 4 steps, 8 accepted.
    by = rep.requests.set_index("request_id")
    assert by["draft_steps"].tolist() == [4, 4] and by["accepted"].tolist() == [8, 8]


def _features(rng, steps: int, n: int) -> list:
    return rng.normal(1.0, 2.0, (steps, n, K)).round(3).tolist()


def test_av_replay_admits_exactly_what_vllms_assign_gives():
    """A hand-made capture through the AV path: every step's admitted counts are what vLLM's
    ``_assign_draft_token_budget`` returns for the same confidences, capacities and budget."""
    torch = pytest.importorskip("torch")
    av = pytest.importorskip(AV_MODULE, reason="vLLM is not installed (run make setup)")
    rng = np.random.default_rng(7)
    accepted = rng.integers(0, K + 1, (12, 4)).tolist()
    cell = _cell(accepted, _features(rng, 12, 4))
    calls = []

    def recording(conf, cap, budget):
        out = assign_budget(conf, cap, budget)
        calls.append((conf.copy(), cap.copy(), budget, out.copy()))
        return out

    # A steep verify cost makes the budget bind: AV must trim.
    state = AvState.cold(K)
    code = DecisionCode(build_cost_tables, recording, "avbench transcription")
    pred, rep = predict_cell(cell, _tables(verify_slope=3.0), Policy("av", K), state, code)
    assert len(calls) >= 6  # the budget bound in most steps
    for conf, cap, budget, ours in calls:
        real = torch.as_tensor(cap).clone()
        av._assign_draft_token_budget(
            torch.as_tensor(conf), torch.arange(len(cap)), real, budget, K
        )
        assert ours.tolist() == real.tolist()
        assert int(ours.sum()) == budget
    # By hand: 12 steps is before the first refit (every 100), so every confidence is the cold
    # estimator's (slope 0.5, intercepts -0.2) on the features of the step it ranked.
    by_step = [
        sigmoid(0.5 * np.stack(g["f"].to_numpy()) - 0.2).astype(np.float32)
        for _, g in cell.events.groupby("step")
    ]
    for conf, *_ in calls:
        assert sum(np.allclose(conf, c, rtol=1e-6) for c in by_step) == 1
    # Accepted = min(accepted at K, admitted), per request and step.
    ev = rep.events
    assert (ev["accepted_pred"] == np.minimum(ev["accepted"], ev["verified_pred"])).all()
    assert rep.steps["verified_pred"].tolist() == [int(a.sum()) for a in state.admitted_log]
    # vLLM's own function, imported, admits the same in the same replay.
    real_state = AvState.cold(K)
    real = DecisionCode(build_cost_tables, _vllm(av, torch), "vLLM")
    predict_cell(cell, _tables(verify_slope=3.0), Policy("av", K), real_state, real)
    assert [a.tolist() for a in real_state.admitted_log] == [a.tolist() for a in state.admitted_log]


def _vllm(av, torch):
    def assign(conf, cap, budget):
        c = torch.as_tensor(cap).clone()
        av._assign_draft_token_budget(torch.as_tensor(conf), torch.arange(len(cap)), c, budget, K)
        return c.numpy()

    return assign


def test_av_budget_reads_the_previous_steps_confidences():
    """vLLM budgets a step from the confidences each request had one step earlier (1 before
    its first verify step); the slots are ranked by the current ones."""
    cell = _cell([[1, 1], [1, 1]], [[[-8.0] * K] * 2] * 2)  # confident rejections: p ~ 0.015
    state = AvState.cold(K)
    code = DecisionCode(build_cost_tables, assign_budget, "avbench transcription")
    # Verify cost 10 ms + 1 ms per token, no draft cost. Step 1: stale confidences are 1, so
    # (2 + B) / (12 + B) grows with B: every draft is verified. Step 2: survivals of ~0.015 add
    # almost nothing while each slot costs 1 ms: (2 + 0.015) / 13 < 2 / 12, so B = 0.
    predict_cell(cell, _tables(verify_slope=1.0), Policy("av", K), state, code)
    assert [a.tolist() for a in state.admitted_log] == [[K, K], [0, 0]]


def test_a_k0_range_drafts_nothing_and_prices_the_step_without_drafts():
    """vLLM's K = 0 range: no draft is verified or proposed there (the drafter's first pass
    still runs); the predicted step loses every draft's forward and every position."""
    cell = _cell([[3, 3], [3, 3], [3, 3]])
    pricing = _tables(draft_ms=0.5, verify_slope=1.0)  # 0.5 ms a position, 1 ms a draft token
    pred, rep = predict_cell(cell, pricing, Policy("schedule", schedule=[(1, 1, 3), (2, 8, 0)]))
    # Every step's batch is 2: K = 0 everywhere, so one token per request per step.
    assert rep.events["verified_pred"].tolist() == [0.0] * 6
    assert rep.requests["draft_steps"].tolist() == [0.0, 0.0]
    assert pred.acceptance_length is None  # no step drafted: vLLM's counters stay at 0
    # 6 drafts and 3 positions fewer per step: 6 * 1 + 3 * 0.5 ms off the 10 ms measured.
    assert (rep.steps["work_pred_ms"] - rep.steps["work_ms"]).tolist() == pytest.approx([-7.5] * 3)
    assert rep.steps["tok_pred"].tolist() == [2.0] * 3


def test_drafts_accepted_past_a_requests_last_token_count_but_take_no_steps():
    """r0 stopped (max_tokens) one token into its second step's four: vLLM counted the three
    accepted drafts after that token, but sent r0 5 tokens after its first, not 8."""
    cell = dataclasses.replace(_cell([[3, 3], [3, 3]]), emitted={"r0": 5, "r1": 8})
    # As itself (K = 3) acceptance is the server's count, overshoot included.
    pred, _ = predict_cell(cell, _tables(), Policy("static", K))
    assert pred.acceptance_length == pytest.approx(4.0)
    # At K = 0 r0 takes 5 steps and r1 8: 13 tokens at one a request a step. The measured steps
    # sent 3 + 3 and 0 + 3 drafts (8 and 5 tokens with each request's own), so they repeat 3 and
    # 1.5 more times (10 ms each) as steps of two: 65 ms against 20 measured. Counting r0's
    # dropped drafts as sent would repeat the second step 3 more times too: 80 ms.
    pred, rep = predict_cell(cell, _tables(), Policy("schedule", schedule=[(1, 8, 0)]))
    assert rep.steps["tok"].tolist() == [8, 5]
    assert pred.output_tok_s_per_gpu == pytest.approx(100.0 * 20 / 65)


def test_av_trimming_drafts_past_a_requests_last_token_loses_no_token():
    """r0 stopped one token into its second step; AV, sure r0's drafts fail, verifies none of
    them there. r0 still gets the one token it lacked, so the step sends what it sent."""
    cell = _cell([[3, 3], [3, 3]], [[[-8.0] * K, [8.0] * K]] * 2)
    cell = dataclasses.replace(cell, emitted={"r0": 5, "r1": 8})
    state = AvState.cold(K)
    code = DecisionCode(build_cost_tables, assign_budget, "avbench transcription")
    pred, rep = predict_cell(cell, _tables(verify_slope=1.0), Policy("av", K), state, code)
    assert [a.tolist() for a in state.admitted_log] == [[K, K], [0, K]]
    # Both steps send what they sent (8 and 5 tokens); the second verifies 3 drafts fewer at
    # 1 ms each: 17 ms against 20. Counting r0's three dropped drafts as lost would repeat it.
    assert rep.steps["tok_pred"].tolist() == rep.steps["tok"].tolist() == [8, 5]
    assert pred.output_tok_s_per_gpu == pytest.approx(100.0 * 20 / 17)
    # Acceptance as vLLM counts it: r0 3 + 0, r1 3 + 3 drafts over four drafting steps.
    assert pred.acceptance_length == pytest.approx(1 + 9 / 4)


def test_a_dip_in_the_batch_repeats_in_the_batch_that_follows_it():
    """A request ends and the client's next one is not yet in: a step of one request between
    steps of two. That dip lasts a step whatever the arm; the tokens its request lacks come in
    the steps of two that follow, half a step each. In the drain (no batch grows again after
    the last step) a step repeats in its own batch."""
    members = [["r0", "r1"], ["r0"], ["r0", "r2"], ["r2"]]
    n = [len(m) for m in members]
    steps = pd.DataFrame({
        "step": range(1, 5), "n_reqs": n, "tokens": [x * (1 + K) for x in n],
        "drafts": [x * K for x in n], "forward_ms": 10.0, "sample_ms": 0.0, "draft_ms": 0.0,
        "interval_ms": [None, 10.0, 10.0, 10.0],
    })  # fmt: skip
    events = pd.DataFrame(
        [{"request_id": r, "step": s, "accepted": 2, "scheduled": K}
         for s, m in enumerate(members, start=1) for r in m]
    )  # fmt: skip
    cell = CellReplay(K, step_times(steps), events, {r: 4.0 for r in ("r0", "r1", "r2")}, 100.0)
    base = _tables()
    costs = StepCosts(
        K, base.costs.forward_per_draft, 0.0, 0.0, PerBatch.zero(16), 0.0,
        base.costs.positions, PerBatch(10.0 + 5.0 * np.arange(17)),
    )  # fmt: skip  # a decode step: 10 ms + 5 ms a request
    _, rep = predict_cell(cell, Pricing(costs, base.tables), Policy("static", 1))
    assert rep.steps["repeat_ms"].tolist() == pytest.approx([20.0, 20.0, 20.0, 15.0])
    assert rep.steps["repeat_share"].tolist() == pytest.approx([1.0, 0.5, 1.0, 1.0])
