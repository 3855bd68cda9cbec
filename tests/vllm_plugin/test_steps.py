"""Step timing capture on stand-ins for vLLM's runners (what each hook reads and writes).

The real Model Runner V1 path is checked against a real vLLM CPU server in
tests/integration/test_vllm_predict.py (steps sum to the server's counters); Model Runner V2
runs only on a GPU, so its hooks are exercised here on objects with vLLM 0.33.0's attribute
layout (``execute_model_state.input_batch.req_ids``, ``observe_verification``'s tensors).
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import torch

from avbench.serving.capture import read_steps, wait_steps_flushed
from avbench.vllm_plugin.runtime import Health
from avbench.vllm_plugin.steps import (
    StepCapture,
    _bracket,
    _execute_model,
    _observe,
    _position,
    _sample_tokens_v1,
    _sample_tokens_v2,
)


def _so(spec: dict, sched: dict, finished=()):
    return SimpleNamespace(
        finished_req_ids=set(finished),
        total_num_scheduled_tokens=sum(sched.values()),
        num_scheduled_tokens=sched,
        scheduled_spec_decode_tokens=spec,
    )


class Runner:
    """Stands in for V1's GPUModelRunner: a drafter proposing 2 positions per step."""

    device = torch.device("cpu")

    def __init__(self):
        self.kept: dict[str, list[int]] = {}

    def execute_model(self, scheduler_output):
        time.sleep(0.002)

    def sample_tokens(self, grammar_output):
        self.propose_draft_token_ids()
        ids = list(self.kept)
        return SimpleNamespace(
            req_id_to_index={e: i for i, e in enumerate(ids)},
            sampled_token_ids=[self.kept[e] for e in ids],
        )

    def propose_draft_token_ids(self):
        for _ in range(2):
            self.proposer._sample_draft_tokens(None)


class Proposer:
    def _sample_draft_tokens(self, hidden):
        time.sleep(0.001)


def _hook_v1(cap: StepCapture) -> Runner:
    Runner.execute_model = _execute_model(cap, Runner.execute_model)
    Runner.sample_tokens = _sample_tokens_v1(cap, Runner.sample_tokens)
    Runner.propose_draft_token_ids = _bracket(cap, Runner.propose_draft_token_ids)
    Proposer._sample_draft_tokens = _position(cap, Proposer._sample_draft_tokens)
    runner = Runner()
    runner.proposer = Proposer()
    return runner


def test_v1_steps_carry_counts_timings_and_requests(tmp_path):
    cap = StepCapture(tmp_path, Health(tmp_path))
    runner = _hook_v1(cap)
    a, b = "chatcmpl-a-1234abcd", "chatcmpl-b-1234abcd"
    runner.kept = {a: [5]}
    runner.execute_model(_so({}, {a: 7}))  # a's prefill
    runner.sample_tokens(None)
    runner.kept = {a: [1, 2, 3], b: [9]}  # a: 2 of its 2 drafts accepted; b's prefill
    runner.execute_model(_so({a: [1, 2]}, {a: 3, b: 5}))
    runner.sample_tokens(None)
    runner.kept = {b: [4]}
    runner.execute_model(_so({b: [1, 2]}, {b: 3}, finished={a}))  # b: none accepted
    runner.sample_tokens(None)
    runner.execute_model(_so({}, {}))  # nothing scheduled: not a step
    t_end = time.time()
    assert wait_steps_flushed(tmp_path, t_end, 0.0, timeout_s=5)
    steps = read_steps(tmp_path)
    assert steps["step"].tolist() == [1, 2, 3]
    assert steps["n_reqs"].tolist() == [1, 2, 1] and steps["tokens"].tolist() == [7, 8, 3]
    assert steps["drafts"].tolist() == [0, 2, 2] and steps["n_verify"].tolist() == [0, 1, 1]
    assert [list(h) for h in steps["acc_hist"]] == [[], [0, 0, 1], [1]]
    assert [list(r) for r in steps["request_ids"]] == [
        ["chatcmpl-a"],
        ["chatcmpl-a", "chatcmpl-b"],
        ["chatcmpl-b"],
    ]
    assert (steps["timing"] == "host-wall").all()
    assert (steps["forward_ms"] >= 2.0).all()  # the stand-in's forward sleeps 2 ms
    for pos, first, total in zip(steps["draft_pos_ms"], steps["draft_first_ms"], steps["draft_ms"], strict=True):  # fmt: skip
        assert len(pos) == 2 and first <= pos[0] <= pos[1] <= total and pos[0] >= 1.0
    assert steps["interval_ms"].isna().tolist() == [True, False, False]
    cap.close()


def test_v2_verdict_follows_the_input_batch_order_and_av_budget(tmp_path):
    """V2: accepted counts come from observe_verification's device tensor, whose rows follow
    the input batch (not the scheduler's dict order); AV's budget from reallocate_drafts."""
    cap = StepCapture(tmp_path, Health(tmp_path))
    a, b, c = "cmpl-a-0-1234abcd", "cmpl-b-0-1234abcd", "cmpl-c-0-1234abcd"

    class AV:
        def reallocate_drafts(self, req_ids, idx_mapping):
            return None, None, 3, None  # AV kept 3 of the 4 scheduled drafts

    class Spec:
        def observe_verification(self, idx_mapping, num_sampled, num_rejected):
            pass

        def propose(self, *args):
            return None

    class V2Runner:
        device = torch.device("cpu")

        def execute_model(self, scheduler_output):
            self.execute_model_state = SimpleNamespace(
                input_batch=SimpleNamespace(req_ids=[b, c, a])
            )
            self.adaptive_verification.reallocate_drafts([b, c, a], None)

        def sample_tokens(self, grammar_output):
            # rows b, c, a: b sampled 3 (2 accepted), c 1 (prefill), a 1 (0 accepted)
            self.speculator.observe_verification(None, torch.tensor([3, 1, 1]), None)
            self.speculator.propose()

    V2Runner.execute_model = _execute_model(cap, V2Runner.execute_model)
    V2Runner.sample_tokens = _sample_tokens_v2(cap, V2Runner.sample_tokens)
    Spec.observe_verification = _observe(cap, Spec.observe_verification)
    runner = V2Runner()
    runner.speculator, runner.adaptive_verification = Spec(), AV()
    runner.execute_model(_so({a: [1, 2], b: [3, 4]}, {a: 3, b: 3, c: 9}))
    runner.sample_tokens(None)
    assert wait_steps_flushed(tmp_path, time.time(), 0.0, timeout_s=5)
    line = [json.loads(x) for x in next(tmp_path.glob("steps.*.jsonl")).read_text().splitlines()]
    step = [x for x in line if x["kind"] == "step"][0]
    assert step["acc_hist"] == [1, 0, 1]  # a: 0 accepted, b: 2 accepted
    assert (step["drafts"], step["verified"]) == (4, 3)
    assert step["draft_ms"] is not None and step["draft_pos_ms"] is None
    cap.close()


def test_the_v2_accepted_count_index_goes_to_a_gpu_from_pinned_memory(monkeypatch):
    """On CUDA a host-to-device copy from pageable memory is staged synchronously whatever
    non_blocking says: the step capture's index upload would block the host inside every
    step. It is pinned first, as the drafts capture's rows are. CUDA stood in for: the index
    is a CPU tensor whose pin_memory and to() record what they were asked (no GPU here), and
    num_sampled a stand-in on device "cuda"; _Accepted (the device-to-host copy) is not run."""
    from avbench.vllm_plugin import steps as steps_mod

    asked: list = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: asked.append("pin") or self)

    def to(self, device, non_blocking=False):
        asked.append(("to", str(device), non_blocking))
        return self

    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(steps_mod, "_Accepted", lambda num_sampled, rows: rows)
    step = SimpleNamespace(batch_ids=["a", "b", "c"], spec={"a": 3, "c": 3}, acc=None)
    steps_mod._verdict_v2(step, SimpleNamespace(device=torch.device("cuda")))
    assert asked == ["pin", ("to", "cuda", True)]
    assert step.acc.tolist() == [0, 2]  # the rows with drafts, in the batch's order
