"""Latency, throughput and counting on hand-built records with known chunk schedules.

Expected values are recomputed here from the written definitions with plain Python loops,
independently of the vectorised code under test.
"""

from __future__ import annotations

import numpy as np
import pytest

from avbench.loadgen.records import RequestRecord
from avbench.metrics import compute_cell_metrics


def rec(
    times: list[float],
    tokens: list[int],
    *,
    e2e: float | None = None,
    completion: int | None = -1,
    prompt: int | None = 10,
    sent_at: float = 5.0,
    queued_at: float | None = None,
    error_kind: str | None = None,
    warmup: bool = False,
    cid: str = "c",
) -> RequestRecord:
    return RequestRecord(
        conversation_id=cid,
        turn=0,
        warmup=warmup,
        queued_at=sent_at if queued_at is None else queued_at,
        sent_at=sent_at,
        ttft=times[0] if times else None,
        e2e=(times[-1] + 0.01 if times else 0.5) if e2e is None else e2e,
        chunk_times=list(times),
        chunk_tokens=list(tokens),
        prompt_tokens=prompt,
        completion_tokens=sum(tokens) if completion == -1 else completion,
        error=None if error_kind is None else f"failed: {error_kind}",
        error_kind=error_kind,
    )


def summary(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples, dtype=float)
    return {
        "mean": float(np.mean(a)),
        "median": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
    }


def cell(records, *, window_s=10.0, gpus=1):
    return compute_cell_metrics(
        records, window_s=window_s, gpus=gpus, counters_before=None, counters_after=None
    ).values


def assert_summary(values, prefix, samples_ms):
    expected = summary(samples_ms)
    for stat, value in expected.items():
        assert values[f"{prefix}_{stat}"] == pytest.approx(value, rel=1e-9, abs=1e-9), stat


def expected_from_definitions(records):
    """TTFT, E2E, TPOT, ITL, inter-chunk samples in ms, from the definitions in latency.py."""
    ttft, e2e, tpot, itl, chunk = [], [], [], [], []
    for r in records:
        if r.warmup or r.error is not None:
            continue
        ttft.append(r.ttft * 1e3)
        e2e.append(r.e2e * 1e3)
        n = r.completion_tokens if r.completion_tokens is not None else sum(r.chunk_tokens)
        if n > 1:
            tpot.append((r.e2e - r.ttft) / (n - 1) * 1e3)
        for j in range(1, len(r.chunk_times)):
            gap = r.chunk_times[j] - r.chunk_times[j - 1]
            chunk.append(gap * 1e3)
            itl.extend([gap / r.chunk_tokens[j] * 1e3] * r.chunk_tokens[j])
    return ttft, e2e, tpot, itl, chunk


def test_hand_schedule_exact_values():
    # One request: prefill token at 100 ms, then steps carrying 2, 4 and 1 tokens.
    r = rec([0.100, 0.300, 0.600, 0.700], [1, 2, 4, 1], e2e=0.750)
    v = cell([r], window_s=2.0)
    assert v["ttft_ms_mean"] == pytest.approx(100.0)
    assert v["e2e_ms_median"] == pytest.approx(750.0)
    assert v["tpot_ms_mean"] == pytest.approx((750.0 - 100.0) / 7)  # 8 tokens
    # ITL per token: 200/2 twice, 300/4 four times, 100/1 once -> 7 samples.
    itl = [100.0, 100.0, 75.0, 75.0, 75.0, 75.0, 100.0]
    assert v["itl_ms_mean"] == pytest.approx(600.0 / 7)  # (t_last - t_first) / tokens after chunk 0
    assert_summary(v, "itl_ms", itl)
    assert_summary(v, "chunk_latency_ms", [200.0, 300.0, 100.0])
    assert v["interactivity_tok_s_user"] == pytest.approx(1000.0 / ((750.0 - 100.0) / 7))
    assert v["output_tokens"] == 8
    assert v["output_tok_s"] == pytest.approx(4.0)
    assert v["total_tok_s"] == pytest.approx((8 + 10) / 2.0)
    assert v["request_s"] == pytest.approx(0.5)


def test_random_schedules_match_definitions_and_numpy_percentiles():
    rng = np.random.default_rng(7)
    records = []
    for i in range(60):
        n = int(rng.integers(1, 40))
        tokens = [1] + rng.integers(1, 5, size=n - 1).tolist()
        times = np.cumsum(rng.uniform(0.005, 0.2, size=n)).tolist()
        records.append(
            rec(
                times,
                tokens,
                cid=f"r{i}",
                sent_at=float(i),
                queued_at=float(i) - rng.uniform(0, 0.5),
            )
        )
    v = cell(records)
    ttft, e2e, tpot, itl, chunk = expected_from_definitions(records)
    assert_summary(v, "ttft_ms", ttft)
    assert_summary(v, "e2e_ms", e2e)
    assert_summary(v, "tpot_ms", tpot)
    assert_summary(v, "itl_ms", itl)
    assert_summary(v, "chunk_latency_ms", chunk)
    assert_summary(v, "queue_delay_ms", [(r.sent_at - r.queued_at) * 1e3 for r in records])
    assert v["interactivity_tok_s_user"] == pytest.approx(1000.0 / np.median(tpot))
    assert len(itl) == sum(sum(r.chunk_tokens[1:]) for r in records)


def test_single_token_requests_have_no_tpot_and_interactivity_is_none():
    v = cell([rec([0.05], [1]), rec([0.07], [1])])
    assert v["ttft_ms_median"] == pytest.approx(60.0)
    assert v["tpot_ms_mean"] is None and v["itl_ms_mean"] is None
    assert v["interactivity_tok_s_user"] is None
    assert v["requests_ok"] == 2


def test_throughput_per_gpu_and_usage_fallback():
    a = rec([0.1, 0.2], [1, 3], completion=5, prompt=7)  # usage says 5 (e.g. a final empty chunk)
    b = rec([0.1, 0.3], [1, 1], completion=None, prompt=3)  # no usage: count streamed tokens
    v = cell([a, b], window_s=4.0, gpus=4)
    assert v["output_tokens"] == 5 + 2
    assert v["output_tok_s"] == pytest.approx(7 / 4.0)
    assert v["output_tok_s_per_gpu"] == pytest.approx(7 / 4.0 / 4)
    assert v["total_tok_s"] == pytest.approx((7 + 7 + 3) / 4.0)
    assert v["total_tok_s_per_gpu"] == pytest.approx((7 + 7 + 3) / 4.0 / 4)
    assert v["request_s"] == pytest.approx(2 / 4.0)
    no_prompt = cell([a, rec([0.1, 0.2], [1, 1], prompt=None)], window_s=4.0)
    assert no_prompt["total_tok_s"] is None and no_prompt["output_tok_s"] == pytest.approx(7 / 4)


def test_failed_requests_counted_by_kind_and_kept_out_of_latency():
    ok = [rec([0.1, 0.2, 0.4], [1, 2, 2], cid=f"ok{i}") for i in range(3)]
    failed = [
        rec([0.1, 9.0], [1, 50], error_kind="stream_cut", cid="cut"),  # partial tokens
        rec([], [], error_kind="timeout", cid="t1", e2e=None),
        rec([], [], error_kind="timeout", cid="t2"),
        rec([], [], error_kind="http_5xx", cid="h"),
        rec([], [], error_kind=None, cid="u"),  # error without a kind
    ]
    failed[-1].error = "something odd"
    v = cell(ok + failed, window_s=2.0)
    assert v["requests_ok"] == 3 and v["requests_failed"] == 5
    assert v["errors_stream_cut"] == 1 and v["errors_timeout"] == 2
    assert v["errors_http_5xx"] == 1 and v["errors_unknown"] == 1
    assert v["errors_http_4xx"] == 0 and v["errors_connect"] == 0
    assert v["output_tokens"] == 15 and v["output_tokens_failed"] == 51
    assert v["chunk_latency_ms_p99"] == pytest.approx(np.percentile([100.0, 200.0] * 3, 99))
    assert v["ttft_ms_mean"] == pytest.approx(100.0)


def test_all_failed_cell_does_not_crash():
    v = cell([rec([], [], error_kind="connect", cid=str(i)) for i in range(4)], window_s=1.0)
    assert v["requests_ok"] == 0 and v["errors_connect"] == 4
    assert v["ttft_ms_mean"] is None and v["output_tok_s"] == 0.0
    assert v["queue_delay_ms_mean"] == pytest.approx(0.0)


def test_warmup_excluded():
    measured = [rec([0.1, 0.25, 0.3], [1, 2, 1], cid=f"m{i}") for i in range(4)]
    warm = [rec([5.0, 9.0], [1, 100], cid=f"w{i}", warmup=True) for i in range(3)]
    warm.append(rec([], [], error_kind="timeout", cid="wf", warmup=True))
    with_warm, without = cell(measured + warm), cell(measured)
    assert with_warm["requests_warmup_excluded"] == 4
    del with_warm["requests_warmup_excluded"], without["requests_warmup_excluded"]
    assert with_warm == without
    assert without["ttft_ms_p99"] == pytest.approx(100.0)
