"""Benchmark: the feature table over 4.5 million synthetic labeled drafts.

Prints wall time and peak memory (targets from issue 4: under 30 s and 2 GiB on 2 cores).
Drafts come from a known logistic acceptance model (64 concurrent requests, K = 5) with a
simulated confidence head, so every column of the table is computed.

    .venv/bin/python bench/estimator_tables.py [--drafts 4500000] [--parquet]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def rss_peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--drafts", type=int, default=4_500_000, help="labeled drafts to simulate (about)"
    )
    ap.add_argument(
        "--parquet", action="store_true", help="also time writing and reading the parquet file"
    )
    args = ap.parse_args()

    from avbench.estimator.drafts import read_drafts, write_drafts
    from avbench.estimator.synthetic import AcceptanceModel, simulate
    from avbench.estimator.tables import Context, feature_table, to_markdown

    beta = np.array([0.6, 0.3, 0.1, -0.1, -0.3])
    requests = 64
    per_request_step = 2.75  # labeled drafts per request and step at these parameters
    steps = int(args.drafts / (requests * per_request_step))
    t0 = time.perf_counter()
    df = simulate(
        AcceptanceModel(0.55, beta, head_noise=0.8), steps=steps, requests=requests, seed=0
    )
    t_gen = time.perf_counter() - t0
    print(
        f"simulated {len(df):,} labeled drafts ({steps:,} steps x {requests} requests) in {t_gen:.1f}s"
    )
    print(f"peak RSS after simulation: {rss_peak_gib():.2f} GiB")

    if args.parquet:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.drafts.parquet"
            t0 = time.perf_counter()
            write_drafts(df, path)
            t_w = time.perf_counter() - t0
            del df
            t0 = time.perf_counter()
            df = read_drafts(path)
            print(
                f"parquet: write+validate {t_w:.1f}s, read+validate {time.perf_counter() - t0:.1f}s"
            )

    t0 = time.perf_counter()
    ctx = Context.build(df)
    t_pred = time.perf_counter() - t0
    table = feature_table(ctx)
    wall = time.perf_counter() - t0
    print(to_markdown(table))
    print(
        f"feature table over {len(df):,} drafts: {wall:.2f}s wall "
        f"(predictions incl. 4 estimator replays {t_pred:.2f}s, metrics + lossless check {wall - t_pred:.2f}s)"
    )
    print(f"peak RSS of the process: {rss_peak_gib():.2f} GiB")
    ok = wall < 30 and rss_peak_gib() < 2
    print("targets (< 30 s, < 2 GiB):", "met" if ok else "NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
