"""Validate `avbench predict` on a CPU pair: predictions from two arms vs every arm measured.

    python bench/predict_validation.py [--run results/predict-val] [--sweep predict-cpu-t1]
    python bench/predict_validation.py --pair tiny-cpu-wide --sweep predict-wide-t1 \
        --run results/predict-wide-t1

Measures (or resumes) a predict sweep: baseline, static K 1, 2, 3 and one K schedule,
concurrencies 1, 2, 4 (the wide pair's: 1, 2, 4, 8, 16, across its crossover), two workloads, two interleaved repeats, step timings and drafts
captured; `predict-cpu-t1` (the default) at the study's sampling (temperature 1, top-p 0.95,
probabilistic drafting, with the CPU sampler fix), `predict-cpu` greedy. Then
predicts static-k1, static-k2 and the sweep's schedule from the baseline and static-k3 alone
and prints, per cell group, the predicted and measured tok/s/GPU, median TPOT and acceptance
length with the error, the measured repeat spreads (the arm's and its source cells'), whether
the error is within max(5%, the spreads in quadrature) (acceptance length: max(0.05 token, the
same)) and whether the prediction's interval covers the
measured value; then, per workload and concurrency, the best static arm (or the baseline) with
the predicted arms as predicted against the best with every arm measured. About 20 minutes of server time on an idle
2-core machine; an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from avbench.analysis.points import POOLED, build_points
from avbench.predict.predicted import PredictRequest, predict_run
from avbench.report.tables import prediction_table


def _measure(run: Path, pair: str, sweep: str) -> None:
    avbench = [sys.executable, "-m", "avbench.cli", "sweep"]
    manifest = run / "manifest.json"
    if not manifest.exists():
        cmd = avbench + ["--pair", pair, "--sweep", sweep, "--k", "1,2,3",
                         "--results", str(run.parent), "--run-id", run.name, "--no-report"]  # fmt: skip
    elif json.loads(manifest.read_text()).get("status") != "finished":
        cmd = avbench + ["--resume", str(run), "--no-report"]
    else:
        return
    print("$", " ".join(cmd[2:]), flush=True)
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        sys.exit(f"the sweep exited with {rc}; rerun this script to resume it")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=Path("results/predict-val"))
    ap.add_argument("--pair", default="tiny-cpu", help="tiny-cpu or tiny-cpu-wide")
    ap.add_argument(
        "--sweep", default="predict-cpu-t1", help="predict-cpu-t1, predict-cpu or predict-wide-t1"
    )
    ap.add_argument("--no-measure", action="store_true", help="predict from the run as it is")
    args = ap.parse_args()
    if not args.no_measure:
        _measure(args.run, args.pair, args.sweep)
    schedule = json.loads((args.run / "manifest.json").read_text())["sweep"]["schedule"]
    res = predict_run(
        PredictRequest(args.run, ("static-k1", "static-k2", "dyn"), "static-k3", schedule)
    )
    misses = [c for c in res.compared if not c.within]
    print(f"predicted from {res.source} and the baseline's step timings ({res.decision_code})")
    print(
        prediction_table(
            res.compared,
            f"{args.run.name}: {len(res.compared) - len(misses)} of {len(res.compared)} within "
            "tolerance",
        ).markdown()
    )
    for c in misses:
        print(f"MISS {c.workload} {c.arm} {c.load} {c.metric}: predicted {c.predicted:.3f}, "
              f"measured {c.measured:.3f}, error {c.error:+.3f}, tolerance {c.tolerance:.3f}")  # fmt: skip
    timing = [c for c in res.compared if c.metric != "acceptance_length"]
    accept = [c for c in res.compared if c.metric == "acceptance_length"]
    with_interval = [c for c in res.compared if c.covered is not None]
    print(
        f"\ntiming within max(5%, spread): {sum(c.within for c in timing)} of {len(timing)}; "
        f"acceptance length within max(0.05, spread): {sum(c.within for c in accept)} of "
        f"{len(accept)}; intervals covering the measured value: "
        f"{sum(bool(c.covered) for c in with_interval)} of {len(with_interval)}"
    )
    _best_arms(args.run, res.rows)


def _best_arms(run: Path, predicted: list[dict]) -> None:
    """Per workload and concurrency: the best of the baseline and the static arms, with the
    predicted arms taken as predicted (the source and the baseline measured) and all measured;
    where they differ, what the predicted pick measured against the measured best, within
    max(5%, the two arms' repeat spreads in quadrature) or not (a near-tie the repeats cannot
    order, or a pick that loses throughput)."""
    from avbench.store.run_store import RunStore

    cells = pd.DataFrame(list(RunStore.open(run).finished_cells().values()))
    cells = cells[cells["arm_kind"].isin(["baseline", "static"])]
    pred = pd.DataFrame(predicted)
    pred = pred[pred["arm_kind"] == "static"]
    keys = ["workload", "concurrency", "arm"]
    points = build_points(cells)
    points = points[points["workload"] != POOLED].set_index(keys)
    measured, spread = points["y"], points["y_spread"].fillna(0.0)  # one repeat: no spread
    predicted_arms = set(pred["arm"])
    as_predicted = pd.concat([
        measured[~measured.index.get_level_values("arm").isin(predicted_arms)],
        pred.groupby(keys)["output_tok_s_per_gpu"].mean(),
    ])  # fmt: skip
    print(
        "\n| workload | c | best, measured | best, predicted | same | the pick measured | "
        "tolerance |\n|---|---:|---|---|---|---:|---:|"
    )
    same = near = total = 0
    for (workload, c), m in measured.groupby(level=["workload", "concurrency"]):
        m = m.droplevel([0, 1])
        sp = spread.xs((workload, c), level=["workload", "concurrency"])
        best_m = m.idxmax()
        best_p = as_predicted.xs((workload, c), level=["workload", "concurrency"]).idxmax()
        gap = (m[best_p] - m[best_m]) / m[best_m]
        tol = max(0.05, float(np.hypot(sp[best_m], sp[best_p])))
        same, near, total = same + (best_m == best_p), near + (-gap <= tol), total + 1
        verdict = "yes" if best_m == best_p else ("within noise" if -gap <= tol else "NO")
        print(
            f"| {workload} | {int(c)} | {best_m} | {best_p} | {verdict} | {gap:+.1%} | {tol:.1%} |"
        )
    print(
        f"\nthe predicted best arm is the measured one in {same} of {total} cells; its measured "
        f"throughput within max(5%, spread) of the measured best's in {near} of {total}"
    )


if __name__ == "__main__":
    main()
