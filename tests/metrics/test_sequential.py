"""The sequential rule (avbench/metrics/sequential.py): its intervals, its stopping, and both on
a synthetic stream whose true throughput and median TPOT are known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.signal import lfilter
from scipy.stats import t as student_t

from avbench.inputs.suite import StoppingRule
from avbench.loadgen.records import RequestRecord
from avbench.metrics.sequential import (
    BATCHINGS,
    T_QUANTILES,
    SequentialMonitor,
    Stream,
    intervals,
    median_interval,
    rate_interval,
)


def test_t_quantiles_are_students():
    for b in BATCHINGS:
        assert T_QUANTILES[b] == pytest.approx(student_t.ppf(0.975, b - 1), rel=1e-12)


def test_interval_centres_are_the_whole_window_estimates():
    rng = np.random.default_rng(3)
    finish = np.sort(rng.uniform(0, 100, 500))
    tokens = rng.integers(10, 300, 500).astype(float)
    rate = rate_interval(finish, tokens, (0.0, 100.0))
    assert rate.estimate == pytest.approx(tokens.sum() / 100.0)
    assert rate.low < rate.estimate < rate.high
    values = rng.lognormal(3, 0.3, 500)
    med = median_interval(finish, values, (0.0, 100.0))
    assert med.estimate == np.median(values)
    assert (med.high - med.estimate) == pytest.approx(med.estimate - med.low)


def test_the_widest_batching_wins_and_empty_stretches_are_left_out():
    finish = np.linspace(0.5, 99.5, 200)
    # Slow drift: the 10-stretch batching sees it most; its interval is the one kept.
    tokens = 100 + 20 * np.sin(finish / 100 * 2 * np.pi)
    widest = rate_interval(finish, tokens, (0.0, 100.0))
    for b in BATCHINGS:
        assert rate_interval(finish, tokens, (0.0, 100.0), [b]).high <= widest.high + 1e-9
    # Values only in the first half: no batching has every stretch filled, so no interval.
    assert median_interval(finish[:100], tokens[:100], (0.0, 100.0)) is None
    # 15 values: 10 stretches hold one or two each, 40 cannot all be filled, so 10 is used.
    few = median_interval(finish[::14], tokens[::14], (0.0, 100.0))
    assert few == median_interval(finish[::14], tokens[::14], (0.0, 100.0), [10])


def _steady(n: int, e2e: float) -> Stream:
    """n identical requests finishing every 1/8 s (exact in binary): a stretch holding a whole
    number of them has the same estimates as every other, and the interval has width 0."""
    finish = 0.125 * np.arange(1, n + 1)
    return Stream(finish, np.full(n, 50.0), np.full(n, 20.0), np.full(n, e2e))


def test_no_interval_until_ten_stretches_outlast_the_loop_memory():
    # Median latency 1 s: stretches must span 2 s, so the window 20 s (160 requests).
    assert intervals(_steady(150, 1.0), (0.0, 18.75)) == dict.fromkeys(
        ("output_tok_s", "tpot_ms_median"), None
    )
    found = intervals(_steady(200, 1.0), (0.0, 25.0))
    assert found["output_tok_s"].rel_half_width == 0.0
    assert found["output_tok_s"].estimate == 50.0 * 8
    assert found["tpot_ms_median"].estimate == 20.0


def _feed(rule: StoppingRule, stream: Stream) -> SequentialMonitor:
    monitor = SequentialMonitor(rule)
    for f, k, tp, e in zip(
        stream.finish_s, stream.tokens, stream.tpot_ms, stream.e2e_s, strict=True
    ):
        if monitor.add(f - e, f, k, tp) is not None:
            break
    return monitor


def test_floors_come_before_the_first_look_and_ceilings_stop_it():
    # Each request lasts one gap: the memory allows an interval after 10 requests; a target
    # that any look would meet shows where the floors put the first look.
    steady = _steady(5000, e2e=0.125)
    m = _feed(StoppingRule(target=0.01, min_requests=80), steady)
    assert (m.reason, m.requests_at_stop) == ("target_reached", 80)
    m = _feed(StoppingRule(target=0.01, min_requests=10, min_time_s=30.0), steady)
    assert (m.reason, m.requests_at_stop) == ("target_reached", 240)  # 30 s / 0.125 s
    # Random lengths: too noisy for the target, so a ceiling stops it.
    lengths = steady.tokens * np.random.default_rng(0).uniform(0.5, 1.5, 5000)
    noisy = Stream(steady.finish_s, lengths, steady.tpot_ms, steady.e2e_s)
    m = _feed(StoppingRule(target=1e-4, max_requests=700), noisy)
    assert (m.reason, m.requests_at_stop) == ("request_ceiling", 700)
    m = _feed(StoppingRule(target=1e-4, max_time_s=12.0), noisy)
    assert (m.reason, m.requests_at_stop) == ("time_ceiling", 96)


def test_observe_reads_records_as_the_cell_metrics_do():
    m = SequentialMonitor(StoppingRule(target=0.03))
    warm = RequestRecord("w", 0, warmup=True, sent_at=1.0, e2e=1.0, completion_tokens=9)
    assert m.observe(warm) is False and m.requests == 0
    ok = RequestRecord("a", 0, sent_at=10.0, ttft=0.5, e2e=2.5, completion_tokens=5)
    failed = RequestRecord("b", 0, sent_at=10.0, e2e=1.0, chunk_tokens=[3], chunk_times=[0.2])
    failed.error, failed.error_kind = "cut", "stream_cut"
    m.observe(ok)
    m.observe(failed)
    s = m.stream()
    assert s.finish_s.tolist() == [12.5, 11.0] and s.tokens.tolist() == [5.0, 0.0]
    assert s.tpot_ms[0] == pytest.approx((2.5 - 0.5) / 4 * 1000) and math.isnan(s.tpot_ms[1])
    assert (m.start, m.end) == (10.0, 12.5)


# ------------------------------------------------------------- coverage and bias, known truth
def _ar1(rng: np.random.Generator, n: int, rho: float) -> np.ndarray:
    """Stationary Gaussian AR(1) with unit variance."""
    e = rng.standard_normal(n) * math.sqrt(1 - rho * rho)
    e[0] = rng.standard_normal()
    return lfilter([1.0], [1.0, -rho], e)


def _closed_loop_like(rng: np.random.Generator, n: int) -> tuple[Stream, np.ndarray, float, float]:
    """A stream shaped like a closed loop of C requests in flight, with known truth.

    Output lengths and TPOT are log-normal, driven by AR(1) processes with correlation RHO from
    one request to the next (about 19 requests, or 2.4 turnovers of the loop, of memory); a
    request lasts tokens x TPOT, and the loop finishes one every duration / C on average (with
    independent jitter). Long-run throughput = E[tokens] / E[gap] = C / E[TPOT | token-weighted],
    which for these log-normals is C / (M exp(SN ST A + ST^2 / 2)); the median TPOT is M."""
    z, u = _ar1(rng, n, RHO), _ar1(rng, n, RHO)
    tokens = MU * np.exp(SN * z - SN**2 / 2)
    tpot_s = M * np.exp(ST * (A * z + math.sqrt(1 - A * A) * u))
    duration = tokens * tpot_s
    finish = np.cumsum(duration / C * rng.gamma(16, 1 / 16, n))
    # The loop starts at 0: nothing was sent before it.
    sent = np.maximum(finish - duration, 0.0)
    truth_rate = C / (M * math.exp(SN * ST * A + ST**2 / 2))
    return Stream(finish, tokens, tpot_s * 1e3, finish - sent), sent, truth_rate, M * 1e3


RHO, C, MU, SN, M, ST, A = 0.9, 8, 200.0, 0.3, 0.02, 0.1, 0.6
TRIALS, TARGET = 400, 0.03


@pytest.mark.slow
def test_intervals_at_stopping_cover_the_truth_at_95_percent_without_bias():
    """400 sequential runs to a ±3% target: each interval at stopping covers the true value at
    95 ± 3%, and the estimate at stopping is off by less than a tenth of the target (0.3%) on
    average. A bias that size moves a 95% interval's coverage by under half a point; 0.3% is
    also 5 standard errors of the mean error over 400 runs, so a real bias would show."""
    rng = np.random.default_rng(2026)
    rule = StoppingRule(target=TARGET, max_requests=12_000, max_time_s=1e9)
    covered = np.zeros(2)
    errors: list[list[float]] = [[], []]
    reasons = []
    for _ in range(TRIALS):
        stream, sent, truth_rate, truth_median = _closed_loop_like(rng, 12_000)
        monitor = SequentialMonitor(rule)
        for i in range(stream.finish_s.size):
            args = (sent[i], stream.finish_s[i], stream.tokens[i], stream.tpot_ms[i])
            if monitor.add(*args) is not None:
                break
        reasons.append(monitor.reason)
        found = intervals(monitor.stream(), (monitor.start, monitor.end))
        for j, (name, truth) in enumerate(
            (("output_tok_s", truth_rate), ("tpot_ms_median", truth_median))
        ):
            iv = found[name]
            covered[j] += iv.low <= truth <= iv.high
            errors[j].append(iv.estimate / truth - 1)
    assert reasons.count("target_reached") == TRIALS  # the ceiling was never what stopped it
    coverage = covered / TRIALS
    assert np.all((coverage >= 0.92) & (coverage <= 0.98)), coverage
    bias = np.mean(errors, axis=1)
    assert np.all(np.abs(bias) < TARGET / 10), bias
