"""Where a static-K prediction's step time comes from, part by part, against the arm measured.

    python bench/predict_step_costs.py RUN [--source static-k3] [--arm static-k1 ...]

Fits the predictor's step cost model (avbench/predict/step_costs.py) on RUN's source arm and
baseline, one per workload, exactly as `avbench predict` does, then for every (workload, concurrency) and each
other static arm compares, on decode steps with the batch full (requests in the step = the
concurrency), the median of each part measured on that arm with the source's median part
repriced for it: the target's forward, the sampling, the drafting and the rest of the step
(scheduler, output processing: what no timer covers). Each part's residual (predicted -
measured) is printed beside it, and the step's total beside its unidentified half-width (the
part of the cost model that one K cannot identify).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from avbench.predict.model import step_times
from avbench.predict.source import read_cell_steps
from avbench.predict.step_costs import fit_by_workload, step_parts
from avbench.store.run_store import RunStore

PARTS = ("forward", "sample", "draft", "rest")


def _steps(store: RunStore, cells: pd.DataFrame, arm: str) -> pd.DataFrame:
    """Every cell's captured steps of one arm, each cell's step times taken on its own."""
    frames = []
    for row in cells[cells["arm"] == arm].itertuples():
        steps = read_cell_steps(store, row.cell_id)
        if steps is not None and len(steps):
            timed = step_times(steps.sort_values("step", ignore_index=True))
            frames.append(timed.assign(workload=row.workload, concurrency=row.concurrency))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--source", default="static-k3")
    ap.add_argument("--arm", action="append", default=None)
    args = ap.parse_args()
    store = RunStore.open(args.run)
    cells = store.cells_frame()
    k = int(args.source.rsplit("-k", 1)[1])
    source, baseline = _steps(store, cells, args.source), _steps(store, cells, "baseline")
    models = fit_by_workload(source, baseline, k)
    notes = sorted({note for costs in models.values() for note in costs.notes})
    print(f"fitted per workload on {args.source} and the baseline; notes: {notes or 'none'}\n")
    arms = args.arm or sorted(
        a for a in cells["arm"].unique() if a.startswith("static-") and a != args.source
    )
    src = step_parts(source)
    print("| workload | arm | c | part | measured | predicted | residual |")
    print("|---|---|---:|---|---:|---:|---:|")
    for arm in arms:
        kp = int(arm.rsplit("-k", 1)[1])
        got = step_parts(_steps(store, cells, arm))
        for (workload, c), mine in got.groupby(["workload", "concurrency"]):
            n = int(c)
            mine = mine[mine["n_reqs"] == n]
            theirs = src[(src["n_reqs"] == n) & (src["drafts"] == k * n)]
            theirs = theirs[theirs["workload"] == workload]
            if mine.empty or theirs.empty:
                continue
            delta = models[workload].delta(
                np.array([n]), np.array([k * n]), np.array([kp * n]), np.array([k]), np.array([kp])
            )
            total_m = total_p = 0.0
            for part in PARTS:
                m = float(mine[part].median())
                p = float(theirs[part].median()) + float(getattr(delta, part)[0])
                total_m, total_p = total_m + m, total_p + p
                print(f"| {workload} | {arm} | {n} | {part} | {m:.2f} | {p:.2f} | {p - m:+.2f} |")
            half = float(delta.unidentified[0])
            print(
                f"| {workload} | {arm} | {n} | **step** | {total_m:.2f} | {total_p:.2f} ± {half:.2f} "
                f"| {total_p - total_m:+.2f} ({(total_p - total_m) / total_m:+.1%}) |"
            )


if __name__ == "__main__":
    main()
