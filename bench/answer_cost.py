"""The answer's cost: the fixed protocol against `avbench sweep --adaptive` on the tiny CPU pair.

    python bench/answer_cost.py [--fixed results/predict-val-t1] [--adaptive results/answer-adaptive]

Fixed: every arm the CPU build runs (baseline, static K 1, 2, 3, the K schedule) x c = 1, 2, 4
x two workloads x 2 interleaved repeats (sweep predict-cpu-t1; its run from
bench/predict_validation.py is reused when finished). Adaptive: the same sweep with
--adaptive. Prints each protocol's server-seconds (wall time with one server up at a time:
starts and measured cells), its cells, and per concurrency each verdict (the option with the
highest pooled output tok/s/GPU: no speculation, a static K, or AV) and whether they agree.
An interrupted sweep resumes where it stopped when the script is run again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from avbench.analysis.adaptive import Uncertainty, standings
from avbench.analysis.points import POOLED, build_points

SWEEP = ["--pair", "tiny-cpu", "--sweep", "predict-cpu-t1", "--k", "1,2,3", "--no-report"]


def _status(run: Path, file: str) -> str | None:
    path = run / file
    return json.loads(path.read_text())["status"] if path.exists() else None


def _measure(run: Path, extra: list[str], state_file: str, done: tuple[str, ...]) -> None:
    avbench = [sys.executable, "-m", "avbench.cli", "sweep"]
    if not (run / "manifest.json").exists():
        cmd = avbench + SWEEP + extra + ["--results", str(run.parent), "--run-id", run.name]
    elif _status(run, state_file) not in done:
        cmd = avbench + ["--resume", str(run), "--no-report"]
    else:
        return
    print("$", " ".join(cmd[2:]), flush=True)
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        sys.exit(f"the sweep exited with {rc}; rerun this script to resume it")


def _seconds(start: str, end: str) -> float:
    return (pd.Timestamp(end) - pd.Timestamp(start)).total_seconds()


def _fixed(run: Path) -> tuple[float, int, dict[int, str]]:
    m = json.loads((run / "manifest.json").read_text())
    rows = [json.loads(x) for x in (run / "cells.jsonl").read_text().splitlines() if x]
    points = build_points(pd.DataFrame(rows))
    view = points[points["workload"] == POOLED]
    verdicts = {s.concurrency: s.verdict for s in standings(view, Uncertainty(), 2)}
    return _seconds(m["started_at"], m["ended_at"]), len(rows), verdicts


def _adaptive(run: Path) -> tuple[float, int, dict[int, tuple[str, str, bool]]]:
    state = json.loads((run / "adaptive.json").read_text())
    cells = sum(len(r.get("cells", [])) for r in state["rounds"])
    last = state["rounds"][-1]["standings"]
    verdicts = {
        s["concurrency"]: (s["verdict"], s["state"], s["rests_on_prediction"]) for s in last
    }
    return state["server_seconds"], cells, verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixed", type=Path, default=Path("results/predict-val-t1"))
    ap.add_argument("--adaptive", type=Path, default=Path("results/answer-adaptive"))
    args = ap.parse_args()
    _measure(args.fixed, [], "manifest.json", ("finished",))
    _measure(args.adaptive, ["--adaptive"], "adaptive.json", ("decided", "inside noise", "budget"))
    f_s, f_cells, f_verdicts = _fixed(args.fixed)
    a_s, a_cells, a_verdicts = _adaptive(args.adaptive)
    print("| protocol | server-seconds | cells |\n|---|---:|---:|")
    print(f"| fixed ({args.fixed.name}) | {f_s:.0f} | {f_cells} |")
    print(f"| adaptive ({args.adaptive.name}) | {a_s:.0f} | {a_cells} |")
    print(
        f"\nadaptive / fixed: {a_s / f_s:.2f}x the server-seconds, {a_cells / f_cells:.2f}x the cells\n"
    )
    print(
        "| c | fixed verdict | adaptive verdict | adaptive standing | rests on a prediction | agree |"
    )
    print("|---:|---|---|---|---|---|")
    agree = 0
    for c in sorted(f_verdicts):
        verdict, state, predicted = a_verdicts.get(c, ("-", "-", False))
        same = verdict == f_verdicts[c]
        agree += same
        print(
            f"| {c} | {f_verdicts[c]} | {verdict} | {state} | {'yes' if predicted else 'no'} | {'yes' if same else 'NO'} |"
        )
    print(f"\n{agree} of {len(f_verdicts)} verdicts agree")


if __name__ == "__main__":
    main()
