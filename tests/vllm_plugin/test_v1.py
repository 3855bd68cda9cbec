"""The Model Runner V1 hooks on stand-ins for vLLM's runner and proposer (CPU tensors).

The real server path is covered by tests/integration/test_vllm_capture.py (every request
captured); here a draft_fraction below 1 selects a subset of the batch rows.
"""

import time
from types import SimpleNamespace

import torch

from avbench.serving.capture import read_captured, wait_flushed
from avbench.vllm_plugin.drafts import DraftCapture
from avbench.vllm_plugin.features import draft_features
from avbench.vllm_plugin.ids import is_sampled
from avbench.vllm_plugin.runtime import Health
from avbench.vllm_plugin.v1 import _after_sample, _before_step, _propose, _sample_draft


class Proposer:
    """Stands in for SpecDecodeBaseProposer: greedy drafting through model.compute_logits."""

    def __init__(self, head):
        self.model = torch.nn.Module()
        self.model.compute_logits = head

    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        return self.model.compute_logits(hidden_states).argmax(-1), None


def test_v1_subset_of_requests(tmp_path):
    ids = [f"cmpl-{i:016x}" for i in range(8)]
    engine = [f"{i}-0-0badc0de" for i in ids]
    keep = [is_sampled(i, 0.5) for i in ids]
    assert 0 < sum(keep) < len(ids)
    cap = DraftCapture(tmp_path, 0.5, Health(tmp_path))
    cap._rank = (True, 0)
    head = torch.nn.Linear(4, 30)
    own = lambda h: head(h).detach()  # noqa: E731
    proposer = Proposer(own)
    sample = _sample_draft(cap, Proposer._sample_draft_tokens)
    hidden = torch.randn(8, 4)

    def orig_propose(runner, so, sampled, sm):
        toks = [sample(proposer, hidden + k, sm)[0] for k in range(3)]
        return torch.stack(toks, dim=1)

    runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=engine), device="cpu")
    sm = SimpleNamespace(temperature=None, all_greedy=True)
    so = SimpleNamespace(finished_req_ids=set(), total_num_scheduled_tokens=8,
                         scheduled_spec_decode_tokens={})  # fmt: skip
    _before_step(cap, so)
    drafts = _propose(cap, orig_propose)(runner, so, None, sm)
    assert vars(proposer.model)["compute_logits"] is own  # the model's own, put back
    so.scheduled_spec_decode_tokens = {e: drafts[i].tolist() for i, e in enumerate(engine)}
    _before_step(cap, so)
    out = SimpleNamespace(
        req_ids=engine,
        req_id_to_index={e: i for i, e in enumerate(engine)},
        sampled_token_ids=[[1, 2]] * 8,  # one draft accepted + the bonus token
    )
    _after_sample(cap, out)
    assert wait_flushed(tmp_path, time.time(), 0.0, timeout_s=10)
    df = read_captured(tmp_path)
    assert set(df["request_id"]) == {i for i, k in zip(ids, keep, strict=True) if k}
    assert sorted(df.groupby("position")["label"].first().tolist()) == [-1, 0, 1]
    # Features of a selected row are those of its own logits (no row mix-up).
    r = keep.index(True)
    want = draft_features(head(hidden[r : r + 1]).detach(), None)["f"]
    got = df[(df["request_id"] == ids[r]) & (df["position"] == 1)]["logit_q_max"].iloc[0]
    assert abs(got - float(want[0])) < 1e-6
    cap._writer.close()
