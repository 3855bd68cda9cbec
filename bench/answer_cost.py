"""The answer's cost: the fixed protocol against `avbench sweep --adaptive` on a CPU pair.

    python bench/answer_cost.py [--fixed results/predict-val-t1] [--adaptive results/answer-adaptive]
    python bench/answer_cost.py --pair tiny-cpu-wide --sweep predict-wide-t1 \
        --fixed results/predict-wide-t1 --adaptive results/answer-adaptive-wide
    python bench/answer_cost.py --pair tiny-cpu-wide --sweep answer-wide --k 1,3 \
        --fixed results/answer-wide-fixed --adaptive results/answer-wide-adaptive

Fixed: every arm the CPU build runs (baseline, static K 1, 2, 3, the K schedule) x the sweep's
concurrencies (tiny-cpu's predict-cpu-t1: c = 1, 2, 4; tiny-cpu-wide's predict-wide-t1: c = 1,
2, 4, 8, 16) x two workloads x 2 interleaved repeats (the run from
bench/predict_validation.py is reused when finished). Adaptive: the same sweep with
--adaptive. Prints each protocol's server-seconds (wall time with one server up at a time:
starts and measured cells), its cells, and per concurrency each verdict (the option with the
highest pooled output tok/s/GPU: no speculation, a static K, or AV), whether they agree, and the
rounds it took to decide each (more than round 0: a close verdict measured, not predicted).
An interrupted sweep resumes where it stopped when the script is run again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from avbench.analysis.adaptive import Standing, Uncertainty, standings
from avbench.analysis.points import POOLED, build_points


def _status(run: Path, file: str) -> str | None:
    path = run / file
    return json.loads(path.read_text())["status"] if path.exists() else None


def _measure(run: Path, sweep: list[str], state_file: str, done: tuple[str, ...]) -> None:
    avbench = [sys.executable, "-m", "avbench.cli", "sweep"]
    if not (run / "manifest.json").exists():
        cmd = avbench + sweep + ["--results", str(run.parent), "--run-id", run.name]
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


def _fixed(run: Path) -> tuple[float, int, dict[int, Standing]]:
    m = json.loads((run / "manifest.json").read_text())
    rows = [json.loads(x) for x in (run / "cells.jsonl").read_text().splitlines() if x]
    points = build_points(pd.DataFrame(rows))
    view = points[points["workload"] == POOLED]
    verdicts = {s.concurrency: s for s in standings(view, Uncertainty(), 2)}
    return _seconds(m["started_at"], m["ended_at"]), len(rows), verdicts


def _rounds_to_decide(rounds: list[dict], concurrency: int) -> int | None:
    """The rounds measured when the concurrency's verdict stood decided for good (1: round 0
    decided it; None: it did not end decided). A record's standings are those after the
    rounds before it; a verdict the run's learned noise reopened counts from its new decision."""
    decided = None
    for r in rounds:
        for s in r.get("standings", []):
            if s["concurrency"] == concurrency:
                decided = (decided or int(r["round"])) if s["state"] == "decided" else None
    return decided


def _agree(fixed: Standing, verdict: str) -> str:
    """yes; a tie (the fixed protocol itself leaves the verdict inside noise, and the adaptive
    one picked one of the options it could not order); or NO."""
    if verdict == fixed.verdict:
        return "yes"
    tied = {o.verdict for o in fixed.contenders}
    return "tie" if fixed.state != "decided" and verdict in tied else "NO"


def _adaptive(run: Path) -> tuple[float, int, dict[int, tuple[str, str, bool, int | None]]]:
    state = json.loads((run / "adaptive.json").read_text())
    rounds = state["rounds"]
    cells = sum(len(r.get("cells", [])) for r in rounds)
    verdicts = {
        s["concurrency"]: (
            s["verdict"], s["state"], s["rests_on_prediction"], _rounds_to_decide(rounds, s["concurrency"])
        )
        for s in rounds[-1]["standings"]
    }  # fmt: skip
    return state["server_seconds"], cells, verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixed", type=Path, default=Path("results/predict-val-t1"))
    ap.add_argument("--adaptive", type=Path, default=Path("results/answer-adaptive"))
    ap.add_argument("--pair", default="tiny-cpu")
    ap.add_argument("--sweep", default="predict-cpu-t1")
    ap.add_argument("--k", default="1,2,3", help="the static K values of both protocols")
    args = ap.parse_args()
    sweep = ["--pair", args.pair, "--sweep", args.sweep, "--k", args.k, "--no-report"]
    _measure(args.fixed, sweep, "manifest.json", ("finished",))
    _measure(
        args.adaptive,
        [*sweep, "--adaptive"],
        "adaptive.json",
        ("decided", "inside noise", "budget"),
    )
    f_s, f_cells, f_verdicts = _fixed(args.fixed)
    a_s, a_cells, a_verdicts = _adaptive(args.adaptive)
    print("| protocol | server-seconds | cells |\n|---|---:|---:|")
    print(f"| fixed ({args.fixed.name}) | {f_s:.0f} | {f_cells} |")
    print(f"| adaptive ({args.adaptive.name}) | {a_s:.0f} | {a_cells} |")
    print(
        f"\nadaptive / fixed: {a_s / f_s:.2f}x the server-seconds, {a_cells / f_cells:.2f}x the cells\n"
    )
    print(
        "| c | fixed verdict | fixed standing | adaptive verdict | adaptive standing | rounds "
        "measured to decide | rests on a prediction | agree |"
    )
    print("|---:|---|---|---|---|---:|---|---|")
    agree = ties = later = 0
    for c in sorted(f_verdicts):
        verdict, state, predicted, decided = a_verdicts.get(c, ("-", "-", False, None))
        fixed = f_verdicts[c]
        same = _agree(fixed, verdict)
        agree, ties = agree + (same == "yes"), ties + (same == "tie")
        later += decided is not None and decided > 1
        print(
            f"| {c} | {fixed.verdict} | {fixed.state} ({fixed.margin or 0:+.1%}) | {verdict} "
            f"| {state} | {decided or '-'} | {'yes' if predicted else 'no'} | {same} |"
        )
    print(
        f"\n{agree} of {len(f_verdicts)} verdicts agree, {ties} more where the fixed protocol "
        f"leaves a tie the adaptive one resolved to one of its options; {later} decided after "
        "round 0"
    )


if __name__ == "__main__":
    main()
