"""Do sequential cells keep their promise on a closed loop? Coverage, bias and cost, simulated.

A discrete-event closed loop stands in for a server: C workers each keep one request in flight;
a request asks for a log-normal number of tokens (mean 200, CV 0.6), waits a fixed TTFT, then
decodes at a per-token time that drifts with the server's speed (an Ornstein-Uhlenbeck process
in log speed, 15% spread, correlation time 4 s, about two request lifetimes). Every run is one
sequential cell: the real rule (avbench/metrics/sequential.py) is asked as each request
finishes; once it says stop no request starts, those in flight finish (the drain), and the
cell's intervals are taken over the whole window, drain included, exactly as the runner does.

The truth is the loop's steady state, from one long run with its start and drain cut off. Per
concurrency it prints how often the stored 95% intervals covered it, the mean relative error
of the estimates (bias), the requests each cell took, and what stopped it; and, for comparison,
the bias of today's fixed-count cell (max(8 x c, 32) requests) at the same load.

Usage:  python bench/sequential_coverage.py [--concurrencies 1,4,16] [--trials 200] [--target 0.03]
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from scipy.signal import lfilter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from avbench.inputs.suite import StoppingRule  # noqa: E402
from avbench.metrics.sequential import SequentialMonitor, Stream, intervals  # noqa: E402

TTFT_S, TPOT_S, DT_S, DRIFT_S, DRIFT_SIGMA = 0.05, 0.01, 0.02, 4.0, 0.15


class Server:
    """Token progress over time under a drifting speed: finish time of n tokens from t."""

    def __init__(self, rng: np.random.Generator, horizon_s: float):
        n = int(horizon_s / DT_S) + 2
        a = math.exp(-DT_S / DRIFT_S)
        shocks = rng.standard_normal(n) * math.sqrt(1 - a * a)
        shocks[0] = rng.standard_normal()  # stationary from the start
        x = lfilter([1.0], [1.0, -a], shocks)
        per_token = TPOT_S * np.exp(DRIFT_SIGMA * x)
        self.grid = np.arange(n) * DT_S
        self.progress = np.concatenate([[0.0], np.cumsum(DT_S / per_token[:-1])])

    def finish(self, sent: float, tokens: int) -> float:
        first = sent + TTFT_S
        done = np.interp(first, self.grid, self.progress) + tokens - 1
        return float(np.interp(done, self.progress, self.grid))


def run_cell(rng, concurrency: int, rule: StoppingRule | None, limit: int | None = None):
    """One closed-loop cell; returns (requests as rows sent/finish/tokens/tpot_ms, monitor)."""
    horizon = 200_000.0 if limit is not None and limit > 10_000 else 20_000.0
    server = Server(rng, horizon_s=horizon)
    monitor = SequentialMonitor(rule) if rule is not None else None
    in_flight: list[tuple[float, float, int]] = []
    done: list[tuple[float, float, int, float]] = []

    def launch(at: float) -> None:
        tokens = max(2, int(rng.lognormal(math.log(200) - 0.18, 0.6)))
        heapq.heappush(in_flight, (server.finish(at, tokens), at, tokens))

    for _ in range(concurrency):
        launch(0.0)
    stopping = False
    while in_flight:
        finish, sent, tokens = heapq.heappop(in_flight)
        tpot_ms = (finish - sent - TTFT_S) / (tokens - 1) * 1e3
        done.append((sent, finish, tokens, tpot_ms))
        if monitor is not None and not stopping:
            stopping = monitor.add(sent, finish, tokens, tpot_ms) is not None
        if limit is not None and len(done) + len(in_flight) >= limit:
            stopping = True
        if not stopping:
            launch(finish)
    return np.array(done), monitor


def steady_truth(concurrency: int, seed: int = 123) -> tuple[float, float]:
    rows, _ = run_cell(np.random.default_rng(seed), concurrency, None, limit=40_000 * concurrency)
    finish = rows[:, 1]
    lo, hi = np.quantile(finish, [0.05, 0.9])  # no start-up, no drain
    kept = (finish > lo) & (finish <= hi)
    return rows[kept, 2].sum() / (hi - lo), float(np.median(rows[kept, 3]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrencies", default="1,4,16")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--target", type=float, default=0.03)
    a = ap.parse_args()
    rule = StoppingRule(target=a.target, max_requests=200_000, max_time_s=1e9)
    print(f"target ±{a.target:.1%}, {a.trials} cells per concurrency")
    print(
        "  c | covered tok/s  TPOT | bias tok/s   TPOT  | drain tok/s | requests p10/p50/p90 "
        "| stopped by | fixed cell bias | s"
    )
    for c in (int(x) for x in a.concurrencies.split(",")):
        t0 = time.perf_counter()
        truth = steady_truth(c)
        rng = np.random.default_rng(1)
        covered, errors, drain, taken, reasons = np.zeros(2), [[], []], [], [], Counter()
        for _ in range(a.trials):
            rows, monitor = run_cell(rng, c, rule)
            sent, finish, tokens, tpot = rows.T
            found = intervals(Stream(finish, tokens, tpot, finish - sent), (0.0, finish.max()))
            for j, name in enumerate(("output_tok_s", "tpot_ms_median")):
                iv = found[name]
                covered[j] += iv.low <= truth[j] <= iv.high
                errors[j].append(iv.estimate / truth[j] - 1)
            at_stop = monitor.stream()
            before = at_stop.tokens.sum() / (at_stop.finish_s.max() - monitor.start)
            drain.append(found["output_tok_s"].estimate / before - 1)
            taken.append(len(rows))
            reasons[monitor.reason] += 1
        fixed = []  # today's fixed-count cell at this load, for comparison
        for _ in range(a.trials):
            rows, _ = run_cell(rng, c, None, limit=max(8 * c, 32))
            fixed.append(rows[:, 2].sum() / rows[:, 1].max() / truth[0] - 1)
        bias = np.mean(errors, axis=1)
        p = np.percentile(taken, [10, 50, 90]).astype(int)
        print(
            f"{c:3d} | {covered[0] / a.trials:12.1%} {covered[1] / a.trials:5.1%} | "
            f"{bias[0]:+9.2%} {bias[1]:+7.2%} | {np.mean(drain):+10.2%} | "
            f"{p[0]:6d} {p[1]:6d} {p[2]:6d} | {dict(reasons)} | {np.mean(fixed):+10.2%} | "
            f"{time.perf_counter() - t0:.0f}"
        )
    print(
        "covered: share of cells whose stored 95% interval holds the steady-state value; "
        "bias: mean relative error of the stored estimate; drain: mean change of the throughput "
        "estimate from the requests in flight at the stop (whole window vs up to the stop); "
        "fixed cell bias: mean relative error of output_tok_s of a max(8 x c, 32)-request cell."
    )


if __name__ == "__main__":
    main()
