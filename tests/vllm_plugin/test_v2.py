"""The Model Runner V2 capture logic on CPU tensors.

The V2 runner only runs on a GPU; the objects below stand in for its persistent buffers with
the attribute layout of vLLM 0.33.0 (``req_states.draft_tokens``, ``speculator.draft_logits``,
``acceptance_estimator.features`` ...), so the labeling and feature code runs for real.
"""

import time
from types import SimpleNamespace

import torch

from avbench.serving.capture import read_captured, wait_flushed
from avbench.vllm_plugin.drafts import DraftCapture
from avbench.vllm_plugin.runtime import Health
from avbench.vllm_plugin.v2 import _after_sample


def test_v2_labels_trimmed_drafts_and_keeps_the_kernels_feature(tmp_path):
    g = torch.Generator().manual_seed(0)
    slots, k, vocab = 4, 2, 50
    est = SimpleNamespace(features=torch.randn(slots, k, generator=g),
                          predictions=torch.rand(slots, k, generator=g))  # fmt: skip
    runner = SimpleNamespace(
        speculator=SimpleNamespace(
            draft_logits=torch.randn(slots, k, vocab, generator=g),
            acceptance_estimator=est,
            draft_token_confidence_probs=torch.rand(slots, k, generator=g),
            use_confidence_head=False,
        ),
        req_states=SimpleNamespace(draft_tokens=torch.randint(0, vocab, (slots, k), generator=g)),
        sampler=SimpleNamespace(
            sampling_states=SimpleNamespace(
                temperature=SimpleNamespace(gpu=torch.tensor([1.0, 0.0, 0.7, 1.0]))
            )
        ),
    )
    batch = SimpleNamespace(
        req_ids=["cmpl-a-0-00000000", "cmpl-b-0-00000000"], idx_mapping=torch.tensor([3, 1])
    )
    cap = DraftCapture(tmp_path, 1.0, Health(tmp_path))
    cap._rank = (True, 0)  # the first tensor-parallel rank (no vLLM distributed state here)
    cap.step, cap.step_spec = 1, {}
    _after_sample(cap, runner, batch)  # proposes for both requests
    proposed_f = est.features[[3, 1]].clone()
    cap.step, cap.step_spec = 2, {"cmpl-a-0-00000000": 2, "cmpl-b-0-00000000": 2}
    # a: 1 accepted of 1 admitted (AV trimmed the 2nd); b: 0 accepted, 1 rejected, 1 trimmed
    cap.v2_verdict = (torch.tensor([2, 1]), torch.tensor([0, 1]))
    _after_sample(cap, runner, batch)
    assert wait_flushed(tmp_path, time.time(), 0.0, timeout_s=10)
    df = read_captured(tmp_path).sort_values(["request_id", "position"])
    assert df["label"].tolist() == [1, -2, 0, -2]
    assert df["request_id"].tolist()[:1] == ["cmpl-a"] and set(df["step"]) == {2}
    f = df["logit_q_max"].to_numpy().reshape(2, k)
    assert torch.allclose(torch.tensor(f, dtype=torch.float32), proposed_f)
    assert (df["temperature"].to_numpy() == [1.0, 1.0, 0.0, 0.0]).all()
    assert df["q_sampled"].iloc[2] == 1.0  # b is greedy
    assert df["head_score"].isna().all() and df["estimator_pred"].notna().all()
    cap._writer.close()


def test_a_step_in_chunks_gives_the_features_of_one_pass(monkeypatch):
    """Large steps are cut into chunks of requests (bounded memory); the values do not move."""
    from avbench.vllm_plugin import v2

    g = torch.Generator().manual_seed(2)
    slots, k, vocab = 9, 3, 40
    logits = torch.randn(slots, k, vocab, generator=g) * 2
    idx = torch.tensor([7, 0, 3, 5, 1])
    tokens = torch.randint(0, vocab, (5, k), generator=g)
    tokens[1, 2] = -1  # a position not drafted this step
    temp = torch.tensor([1.0, 0.0, 0.7, 1.0, 1.3])
    whole = v2.step_features(logits, idx, tokens, temp, True)
    monkeypatch.setattr(v2, "MAX_CHUNK_ELEMENTS", 2 * k * vocab)  # two requests per chunk
    chunked = v2.step_features(logits, idx, tokens, temp, True)
    assert set(whole) == set(chunked) == {"f", "q_max", "entropy", "q_sampled"}
    for key in whole:
        assert whole[key].shape == (5, k) and torch.equal(whole[key], chunked[key]), key
    # one position of one request, against the per-position definition
    z = logits[3, 1] / 0.7
    q = torch.softmax(z, -1)
    assert torch.isclose(whole["q_max"][2, 1], q.max())
    assert torch.isclose(whole["q_sampled"][2, 1], q[tokens[2, 1]])
    assert (whole["q_sampled"][1] == 1.0).all()  # a greedy request


def test_prefill_context_parallelism_turns_v2_capture_off(tmp_path):
    cap = DraftCapture(tmp_path, 1.0, Health(tmp_path))
    runner = SimpleNamespace(pcp_manager=object(), speculator=None)
    batch = SimpleNamespace(req_ids=["cmpl-a-0-00000000"], idx_mapping=torch.tensor([0]))
    _after_sample(cap, runner, batch)
    assert not cap.enabled
    assert any("prefill context parallelism" in w for w in cap.health.inert)
