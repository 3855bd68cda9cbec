"""Acceptance metrics: counter deltas of the real captures, and the stream-side estimate."""

from __future__ import annotations

import numpy as np
import pytest

from avbench.loadgen.records import RequestRecord
from avbench.metrics import compute_cell_metrics

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


def rec(tokens: list[int], *, cid: str = "c", step: float = 0.05) -> RequestRecord:
    times = [0.1 + step * j for j in range(len(tokens))]
    return RequestRecord(
        conversation_id=cid,
        turn=0,
        sent_at=1.0,
        queued_at=1.0,
        ttft=times[0] if times else None,
        e2e=times[-1] + 0.01 if times else 0.2,
        chunk_times=times,
        chunk_tokens=tokens,
        prompt_tokens=4,
        completion_tokens=sum(tokens),
    )


def counter_metrics(before: str | None, after: str | None, records=()) -> dict:
    return compute_cell_metrics(
        list(records), window_s=1.0, gpus=1, counters_before=before, counters_after=after
    ).values


def _strip_spec(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if "spec_decode" not in ln) + "\n"


@pytest.mark.parametrize("after_name", ["metrics_after.txt", "metrics_after_greedy.txt"])
def test_counter_acceptance_from_real_captures(before_text, after_name, scrape):
    after = scrape.read(after_name)
    v = counter_metrics(before_text, after)

    def d(name):
        return scrape.sum(after, name) - scrape.sum(before_text, name)

    assert v["num_drafts"] == d(DRAFTS)
    assert v["num_draft_tokens"] == d(DRAFT_TOKENS)
    assert v["num_accepted"] == d(ACCEPTED)
    assert v["acceptance_rate"] == pytest.approx(d(ACCEPTED) / d(DRAFT_TOKENS))
    assert v["acceptance_length"] == pytest.approx(1 + d(ACCEPTED) / d(DRAFTS))
    pa, pb = scrape.per_position(after), scrape.per_position(before_text)
    assert sorted(k for k in v if k.startswith("accept_pos_")) == [f"accept_pos_{p}" for p in pa]
    for p in pa:
        assert v[f"accept_pos_{p}"] == pytest.approx((pa[p] - pb[p]) / d(DRAFTS))
    # Unconditional per-position rates add up to accepted / drafts.
    total = sum(v[f"accept_pos_{p}"] for p in pa)
    assert total == pytest.approx(v["acceptance_length"] - 1)


def test_greedy_capture_figures(before_text, greedy_text):
    v = counter_metrics(before_text, greedy_text)
    assert v["acceptance_length"] == pytest.approx(1 + 461 / 782)
    assert v["accept_pos_0"] == pytest.approx(161 / 782)
    assert v["accept_pos_2"] == pytest.approx(150 / 782)


def test_baseline_arm_has_none_acceptance(before_text, greedy_text):
    v = counter_metrics(_strip_spec(before_text), _strip_spec(greedy_text), [rec([1, 1, 1])])
    for key in ("num_drafts", "num_draft_tokens", "num_accepted", "acceptance_rate"):
        assert v[key] is None, key
    assert v["acceptance_length"] is None and v["chunk_vs_counter_accept_length"] is None
    assert not any(k.startswith("accept_pos_") for k in v)
    # Without speculation every step carries one token.
    assert v["chunk_tokens_mean"] == 1.0
    assert v["server_generation_tokens"] == 1248.0


def test_no_scrapes_gives_none_not_crash():
    v = counter_metrics(None, None, [rec([1, 2])])
    assert v["acceptance_rate"] is None and v["server_generation_tokens"] is None


def test_counter_reset_is_a_note(before_text, greedy_text):
    m = compute_cell_metrics(
        [rec([1, 2])],
        window_s=1.0,
        gpus=1,
        counters_before=greedy_text,
        counters_after=before_text,
    )
    assert m.values["acceptance_rate"] is None
    assert any("went backwards" in n for n in m.notes)


def test_stream_side_acceptance_length():
    # Chunk 0 is the prefill token; later chunks carry accepted drafts + 1.
    chunks = {"a": [1, 3, 2, 4, 1], "b": [2, 1, 1], "c": [1], "d": [1, 4, 4]}
    v = counter_metrics(None, None, [rec(t, cid=c) for c, t in chunks.items()])
    later = [n for t in chunks.values() for n in t[1:]]
    assert v["chunk_tokens_mean"] == pytest.approx(np.mean(later))
    per_request = [np.mean(t[1:]) for t in chunks.values() if len(t) > 1]
    assert v["req_accept_length_mean"] == pytest.approx(np.mean(per_request))
    assert v["req_accept_length_median"] == pytest.approx(np.median(per_request))
    assert v["req_accept_length_p90"] == pytest.approx(np.percentile(per_request, 90))


def test_stream_estimate_compared_with_counters(before_text, greedy_text):
    records = [rec([1, 2, 2, 1, 3], cid=str(i)) for i in range(3)]
    v = counter_metrics(before_text, greedy_text, records)
    expected = np.mean([2, 2, 1, 3]) / (1 + 461 / 782)
    assert v["chunk_vs_counter_accept_length"] == pytest.approx(expected)
