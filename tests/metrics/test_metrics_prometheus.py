"""Parsing vLLM /metrics captures and taking window deltas."""

from __future__ import annotations

import re

import pytest

from avbench.metrics import CounterReset, MetricsError, delta, parse_counters, window_counters

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


def _clone_engine(text: str, *, engine: str, scale: float, model: str | None = None) -> str:
    """Add, right after every engine="0" vllm sample, a copy for another engine."""
    out = []
    for line in text.splitlines():
        out.append(line)
        if line.startswith("vllm:") and 'engine="0"' in line:
            head, value = line.rsplit(" ", 1)
            head = head.replace('engine="0"', f'engine="{engine}"')
            if model is not None:
                head = re.sub(r'model_name="[^"]*"', f'model_name="{model}"', head)
            out.append(f"{head} {float(value) * scale!r}")
    return "\n".join(out) + "\n"


def _without_spec(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if "spec_decode" not in ln) + "\n"


def test_greedy_fixture_matches_independent_reading(greedy_text, scrape):
    c = parse_counters(greedy_text)
    assert c.drafts == scrape.sum(greedy_text, DRAFTS)
    assert c.draft_tokens == scrape.sum(greedy_text, DRAFT_TOKENS)
    assert c.accepted == scrape.sum(greedy_text, ACCEPTED)
    assert c.accepted_per_pos == scrape.per_position(greedy_text)
    assert c.generation_tokens == scrape.sum(greedy_text, "vllm:generation_tokens_total")
    assert c.prompt_tokens == scrape.sum(greedy_text, "vllm:prompt_tokens_total")
    assert c.request_success == scrape.sum(greedy_text, "vllm:request_success_total")
    # The figures noted when the capture was made (vLLM CPU, tiny pair, K = 3, temp 0).
    assert (c.drafts, c.draft_tokens, c.accepted) == (782, 2346, 461)
    assert c.accepted_per_pos == {0: 161, 1: 150, 2: 150}
    assert c.request_success_by_reason["length"] == scrape.sum(
        greedy_text, "vllm:request_success_total", finished_reason="length"
    )


def test_delta_before_after_temp1(before_text, after_text, scrape):
    d = delta(parse_counters(before_text), parse_counters(after_text))
    for field, name in [("drafts", DRAFTS), ("draft_tokens", DRAFT_TOKENS), ("accepted", ACCEPTED)]:
        expected = scrape.sum(after_text, name) - scrape.sum(before_text, name)
        assert getattr(d, field) == expected
    pb, pa = scrape.per_position(before_text), scrape.per_position(after_text)
    assert d.accepted_per_pos == {p: pa[p] - pb.get(p, 0.0) for p in pa}
    assert d.drafts > 0 and d.accepted_per_pos[0] > 0
    assert d.generation_tokens == scrape.sum(
        after_text, "vllm:generation_tokens_total"
    ) - scrape.sum(before_text, "vllm:generation_tokens_total")
    for field in ("prefix_cache_queries", "prefix_cache_hits"):
        name = f"vllm:{field}_total"
        assert getattr(d, field) == scrape.sum(after_text, name) - scrape.sum(before_text, name)
    assert window_counters(before_text, after_text) == d
    assert window_counters(None, after_text) is None


def test_sums_over_engines(greedy_text, scrape):
    two = _clone_engine(greedy_text, engine="1", scale=3.0)
    one, both = parse_counters(greedy_text), parse_counters(two)
    assert both.drafts == pytest.approx(4 * one.drafts)
    assert both.drafts == pytest.approx(scrape.sum(two, DRAFTS))
    assert both.accepted == pytest.approx(4 * one.accepted)
    assert both.accepted_per_pos == pytest.approx(
        {p: 4 * v for p, v in one.accepted_per_pos.items()}
    )
    assert both.request_success == pytest.approx(4 * one.request_success)


def test_model_name_filter(greedy_text):
    mixed = _clone_engine(greedy_text, engine="1", scale=3.0, model="other-model")
    only = parse_counters(mixed, model_name="tiny-target")
    assert only == parse_counters(greedy_text)
    assert parse_counters(mixed, model_name="other-model").drafts == pytest.approx(3 * 782)
    with pytest.raises(MetricsError, match="no vLLM counters for model_name 'nope'"):
        parse_counters(mixed, model_name="nope")


def test_baseline_without_spec_counters(greedy_text, before_text):
    base = parse_counters(_without_spec(greedy_text))
    assert not base.has_spec_decode
    assert base.drafts is None and base.draft_tokens is None and base.accepted is None
    assert base.accepted_per_pos == {}
    assert base.generation_tokens == parse_counters(greedy_text).generation_tokens
    d = delta(parse_counters(_without_spec(before_text)), base)
    assert d.drafts is None and d.accepted_per_pos == {}
    assert d.generation_tokens == base.generation_tokens  # before is all zeros


def test_counter_going_backwards_is_reported(before_text, greedy_text):
    with pytest.raises(CounterReset, match="went backwards"):
        delta(parse_counters(greedy_text), parse_counters(before_text))


def test_malformed_text_names_the_source():
    with pytest.raises(MetricsError, match="scrape.txt: not valid Prometheus text"):
        parse_counters("<html>502 Bad Gateway</html>", source="scrape.txt")


def test_untyped_counters_without_type_lines(greedy_text):
    # Some exporters and proxies drop # HELP/# TYPE lines; the samples alone must do.
    bare = "\n".join(ln for ln in greedy_text.splitlines() if not ln.startswith("#")) + "\n"
    assert parse_counters(bare) == parse_counters(greedy_text)
