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

from avbench.predict.curves import draft_samples
from avbench.predict.source import read_cell_steps
from avbench.store.run_store import RunStore


def _steps(store: RunStore, cells: pd.DataFrame, arm: str, workload: str, c: int) -> pd.DataFrame:
    """Every repeat's captured steps of one arm, workload and concurrency."""
    mine = cells[
        (cells["arm"] == arm) & (cells["workload"] == workload) & (cells["concurrency"] == c)
    ]
    frames = [read_cell_steps(store, cid) for cid in mine["cell_id"]]
    frames = [f for f in frames if f is not None and not f.empty]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    return df.assign(
        verify=df["forward_ms"] + df["sample_ms"],
        rest=df["interval_ms"] - df["forward_ms"] - df["sample_ms"] - df["draft_ms"].fillna(0.0),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--source", default="static-k3")
    ap.add_argument("--arm", action="append", default=None)
    args = ap.parse_args()
    store = RunStore.open(args.run)
    cells = store.cells_frame()
    arms = args.arm or sorted(
        a for a in cells["arm"].unique() if a.startswith("static-") and a != args.source
    )
    print("| workload | arm | c | part | measured | carried from the source | diff |")
    print("|---|---|---:|---|---:|---:|---:|")
    for (workload, c), _ in cells.groupby(["workload", "concurrency"]):
        src_all = _steps(store, cells, args.source, workload, int(c))
        src = src_all[src_all["n_reqs"] == c] if len(src_all) else src_all
        timed = pd.concat([src_all, _steps(store, cells, "baseline", workload, int(c))])
        curve = timed.groupby("tokens")["verify"].median() if len(timed) else pd.Series()
        for arm in arms:
            k = int(arm.rsplit("-k", 1)[1])
            got = _steps(store, cells, arm, workload, int(c))
            if got.empty or src.empty:
                continue
            got = got[got["n_reqs"] == c]
            tokens = float(got["tokens"].median())
            at_tokens = float(np.interp(tokens, curve.index.to_numpy(float), curve.to_numpy()))
            parts = {
                "forward + sampling": (got["verify"].median(), at_tokens),
                "drafting": (got["draft_ms"].median(), float(np.nanmedian(draft_samples(src, k)))),
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
