"""The metric registry: definitions, dependency order, input validation, large cells."""

from __future__ import annotations

import numpy as np
import pytest

from avbench.loadgen.records import RequestRecord
from avbench.metrics import (
    REGISTRY,
    CellData,
    Metric,
    MetricsError,
    NoValue,
    all_definitions,
    compute_cell_metrics,
    ordered_metrics,
)


def _record(times, tokens, cid="c") -> RequestRecord:
    return RequestRecord(
        conversation_id=cid,
        turn=0,
        ttft=times[0],
        e2e=times[-1],
        chunk_times=list(times),
        chunk_tokens=list(tokens),
        completion_tokens=int(sum(tokens)),
        prompt_tokens=3,
    )


def test_every_column_has_unit_and_definition(before_text, greedy_text):
    rec = _record([0.1, 0.2, 0.35], [1, 2, 3])
    # What vLLM's --per-request-spec-decode-metrics detailed puts in the final usage chunk.
    rec.spec_acceptance_histogram, rec.spec_per_step_accepted = [0, 1, 1, 0], [1, 2]
    rec.spec_per_step_drafted = [3, 3]
    m = compute_cell_metrics(
        [rec],
        window_s=1.0,
        gpus=2,
        counters_before=before_text,
        counters_after=greedy_text,
    )
    defs = m.definitions()
    assert set(defs) == set(m.values)
    for column, d in defs.items():
        assert d.unit and len(d.definition) > 10, column
    assert defs["ttft_ms_p90"].unit == "ms"
    assert defs["ttft_ms_p90"].definition.startswith("90th percentile of:")
    assert defs["accept_pos_1"].metric == "accept_pos"
    for required in (
        "ttft_ms_mean tpot_ms_median itl_ms_p90 chunk_latency_ms_p99 e2e_ms_mean "
        "queue_delay_ms_median output_tok_s output_tok_s_per_gpu total_tok_s request_s "
        "interactivity_tok_s_user acceptance_rate acceptance_length accept_pos_0 num_drafts "
        "num_draft_tokens num_accepted requests_ok requests_failed errors_timeout "
        "output_tokens chunk_tokens_mean req_spec_accepted req_spec_accept_length"
    ).split():
        assert required in m.values, required
    assert m.values["output_tok_s_per_gpu"] == pytest.approx(m.values["output_tok_s"] / 2)
    assert (m.values["req_spec_steps"], m.values["req_spec_accepted"]) == (2, 3)
    assert m.values["req_spec_draft_tokens"] == 6 and m.values["req_spec_accept_length"] == 2.5
    assert m.missing == {}
    static = all_definitions()
    assert "accept_pos_<key>" in static and "errors_<key>" in static
    indexed = ("accept_pos_", "errors_", "req_spec_steps", "req_spec_accepted", "req_spec_draft")
    assert {c for c in m.values if not c.startswith(indexed)} <= set(static)


def test_prefix_cache_hit_share_is_the_windows_cached_prompt_tokens(before_text):
    """The share from two scrapes: the window's Δ hits over Δ queries, not the server's lifetime
    share (here 50 prompt tokens were looked up before the window)."""

    def scrape(queries: float, hits: float) -> str:
        def line(text: str) -> str:
            name = text.split("{")[0]
            if name == "vllm:prefix_cache_queries_total":
                return f"{text.rsplit(' ', 1)[0]} {queries}"
            if name == "vllm:prefix_cache_hits_total":
                return f"{text.rsplit(' ', 1)[0]} {hits}"
            return text

        return "\n".join(line(x) for x in before_text.splitlines()) + "\n"

    rec = _record([0.1, 0.2, 0.35], [1, 2, 3])
    m = compute_cell_metrics(
        [rec], window_s=1.0, gpus=1, counters_before=scrape(50, 0), counters_after=scrape(450, 300)
    )
    assert m.values["prefix_cache_hit_share"] == pytest.approx(0.75)
    cold = compute_cell_metrics(
        [rec], window_s=1.0, gpus=1, counters_before=scrape(50, 0), counters_after=scrape(450, 0)
    )
    assert cold.values["prefix_cache_hit_share"] == 0.0


def test_dependencies_come_first():
    order = [m.tag for m in ordered_metrics()]
    assert set(order) == set(REGISTRY)
    for m in ordered_metrics():
        for dep in m.requires:
            assert order.index(dep) < order.index(m.tag), (dep, m.tag)


def test_cycle_and_unknown_dependency_are_rejected():
    def fn(data, deps):
        return 1.0

    a = Metric("a", "x", "a", "scalar", (), ("b",), fn)
    b = Metric("b", "x", "b", "scalar", (), ("a",), fn)
    with pytest.raises(ValueError, match="cycle"):
        ordered_metrics({"a": a, "b": b})
    with pytest.raises(ValueError, match="unknown metric 'b'"):
        ordered_metrics({"a": a})


def test_metric_functions_raise_novalue_on_absent_inputs():
    empty = CellData(window_s=1.0, gpus=1)
    for tag in ("ttft_ms", "itl_ms", "acceptance_rate", "num_drafts", "server_prompt_tokens"):
        m = REGISTRY[tag]
        deps = {d: None for d in m.requires}
        with pytest.raises(NoValue):
            m.fn(empty, deps)


def test_inconsistent_record_names_it():
    bad = _record([0.1, 0.2], [1, 1], cid="conv-7")
    bad.chunk_tokens.append(5)
    with pytest.raises(MetricsError, match="conv-7 turn 0: chunk_times has 2 entries"):
        compute_cell_metrics([bad], window_s=1.0, gpus=1, counters_before=None, counters_after=None)
    with pytest.raises(MetricsError, match="gpus must be >= 1"):
        compute_cell_metrics([], window_s=1.0, gpus=0, counters_before=None, counters_after=None)


def test_large_cell_closed_forms():
    # 2,000 requests x 50 chunks = 100k chunks: the vectorised path, checked by closed forms.
    rng = np.random.default_rng(3)
    records = []
    spans, later_tokens, gap_count = 0.0, 0, 0
    for i in range(2000):
        times = np.cumsum(rng.uniform(0.001, 0.05, size=50))
        tokens = rng.integers(1, 6, size=50)
        records.append(_record(times.tolist(), tokens.tolist(), cid=str(i)))
        spans += times[-1] - times[0]
        later_tokens += int(tokens[1:].sum())
        gap_count += 49
    v = compute_cell_metrics(
        records, window_s=100.0, gpus=1, counters_before=None, counters_after=None
    ).values
    assert v["itl_ms_mean"] == pytest.approx(spans / later_tokens * 1e3)
    assert v["chunk_latency_ms_mean"] == pytest.approx(spans / gap_count * 1e3)
    assert v["chunk_tokens_mean"] == pytest.approx(later_tokens / gap_count)
    assert v["requests_ok"] == 2000
