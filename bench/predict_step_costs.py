"""Where a static-K prediction's step time comes from, part by part, against the arm measured.

    python bench/predict_step_costs.py RUN [--source static-k3] [--arm static-k1 ...]

For every (workload, concurrency) of RUN and each arm, from the captured engine steps with the
batch full (requests in the step = the concurrency), medians in ms of: the target's forward +
sampling, the drafting, the rest of the step interval (scheduler, output processing: what no
timer covers) and the whole interval. Beside each measured part, what the predictor carries over
from the source arm: its drafting up to K' positions (time to the end of position K' plus the
proposal's tail), the forward + sampling of the source's and the baseline's steps at the same
token count (median per count, linear between counts, any batch size), and its untimed rest as
it is. The difference of the sums, over the measured interval, is the share of
TPOT error the step parts explain.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from avbench.serving.capture import steps_path


def _steps(run: Path, arm: str, workload: str, c: int) -> pd.DataFrame:
    files = sorted(steps_path(run, f"{arm}__{workload}__c{c}__rep0").parent.glob(
        f"{arm}__{workload}__c{c}__rep*.steps.parquet"))  # fmt: skip
    if not files:
        return pd.DataFrame()
    df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    return df.assign(
        verify=df["forward_ms"] + df["sample_ms"],
        rest=df["interval_ms"] - df["forward_ms"] - df["sample_ms"] - df["draft_ms"].fillna(0.0),
    )


def _draft_upto(src: pd.DataFrame, k: int) -> float:
    drafts = [
        p[k - 1] + (t - p[-1])
        for p, t in zip(src["draft_pos_ms"], src["draft_ms"], strict=True)
        if p is not None and len(p) >= k and np.isfinite(t)
    ]
    return float(np.median(drafts)) if drafts else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--source", default="static-k3")
    ap.add_argument("--arm", action="append", default=None)
    args = ap.parse_args()
    cells = pd.read_json(args.run / "cells.jsonl", lines=True)
    arms = args.arm or sorted(
        a for a in cells["arm"].unique() if a.startswith("static-") and a != args.source
    )
    print("| workload | arm | c | part | measured | carried from the source | diff |")
    print("|---|---|---:|---|---:|---:|---:|")
    for (workload, c), _ in cells.groupby(["workload", "concurrency"]):
        src_all = _steps(args.run, args.source, workload, int(c))
        src = src_all[src_all["n_reqs"] == c] if len(src_all) else src_all
        timed = pd.concat([src_all, _steps(args.run, "baseline", workload, int(c))])
        curve = timed.groupby("tokens")["verify"].median() if len(timed) else pd.Series()
        for arm in arms:
            k = int(arm.rsplit("-k", 1)[1])
            got = _steps(args.run, arm, workload, int(c))
            if got.empty or src.empty:
                continue
            got = got[got["n_reqs"] == c]
            tokens = float(got["tokens"].median())
            at_tokens = float(np.interp(tokens, curve.index.to_numpy(float), curve.to_numpy()))
            parts = {
                "forward + sampling": (got["verify"].median(), at_tokens),
                "drafting": (got["draft_ms"].median(), _draft_upto(src, k)),
                "untimed rest": (got["rest"].median(), src["rest"].median()),
            }
            for part, (m, p) in parts.items():
                print(f"| {workload} | {arm} | {c} | {part} | {m:.2f} | {p:.2f} | {p - m:+.2f} |")
            interval = got["interval_ms"].median()
            diff = sum(p - m for m, p in parts.values())
            print(f"| {workload} | {arm} | {c} | step interval | {interval:.2f} | | "
                  f"{diff:+.2f} ({diff / interval:+.1%}) |")  # fmt: skip


if __name__ == "__main__":
    main()
