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
--adaptive, then `--resume RUN --complete`, which measures the cells its rounds left out.
Prints each protocol's server-seconds (wall time with one server up at a time: starts and
measured cells; the adaptive run's are its rounds', the completion's apart), its cells, and per
concurrency each verdict (the option with the highest pooled output tok/s/GPU: no speculation, a
static K, or AV) and the rounds it took to decide (more than round 0: a close verdict measured,
not predicted). The adaptive verdicts are compared with the fixed protocol's twice: on the same
measurements (the completed adaptive run, every cell measured) and against the separate fixed
run, whose servers ran at another time; the two fixed verdicts are compared too, which says how
far the machine's drift between two runs moves the answer. An interrupted sweep resumes where it
stopped when the script is run again.
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


def _verdicts(run: Path) -> tuple[int, dict[int, Standing]]:
    """The fixed protocol's verdict per concurrency from every cell the run measured."""
    rows = [json.loads(x) for x in (run / "cells.jsonl").read_text().splitlines() if x]
    points = build_points(pd.DataFrame(rows))
    view = points[points["workload"] == POOLED]
    return len(rows), {s.concurrency: s for s in standings(view, Uncertainty(), 2)}


def _fixed(run: Path) -> tuple[float, int, dict[int, Standing]]:
    m = json.loads((run / "manifest.json").read_text())
    return (_seconds(m["started_at"], m["ended_at"]), *_verdicts(run))


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


def _complete(run: Path) -> dict:
    """The adaptive run's completion (``--complete``), measured first if it has not ended."""
    completion = json.loads((run / "adaptive.json").read_text()).get("completion") or {}
    if not completion.get("standings"):
        cmd = [sys.executable, "-m", "avbench.cli", "sweep", "--resume", str(run), "--complete",
               "--no-report"]  # fmt: skip
        print("$", " ".join(cmd[2:]), flush=True)
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            sys.exit(f"the completion exited with {rc}; rerun this script to resume it")
        completion = json.loads((run / "adaptive.json").read_text())["completion"]
    return completion


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
    completion = _complete(args.adaptive)
    f_s, f_cells, f_verdicts = _fixed(args.fixed)
    a_s, a_cells, a_verdicts = _adaptive(args.adaptive)
    _, same_cells = _verdicts(args.adaptive)
    print("| protocol | server-seconds | cells |\n|---|---:|---:|")
    print(f"| fixed ({args.fixed.name}) | {f_s:.0f} | {f_cells} |")
    print(f"| adaptive ({args.adaptive.name}) | {a_s:.0f} | {a_cells} |")
    print(
        f"| its completion (every cell, not part of the adaptive cost) | "
        f"{completion['seconds']:.0f} | {len(completion['cells'])} |"
    )
    print(
        f"\nadaptive / fixed: {a_s / f_s:.2f}x the server-seconds, {a_cells / f_cells:.2f}x the cells\n"
    )
    print(
        "| c | fixed run | adaptive | adaptive standing | rounds measured to decide | rests on a "
        "prediction | every cell of the adaptive run | agree, same cells | agree, fixed run | "
        "fixed run = every cell |"
    )
    print("|---:|---|---|---|---:|---|---|---|---|---|")
    counts = {"same": [0, 0], "fixed": [0, 0], "self": [0, 0]}
    later = 0
    for c in sorted(f_verdicts):
        verdict, state, predicted, decided = a_verdicts.get(c, ("-", "-", False, None))
        fixed, full = f_verdicts[c], same_cells[c]
        marks = {"same": _agree(full, verdict), "fixed": _agree(fixed, verdict),
                 "self": _agree(fixed, full.verdict)}  # fmt: skip
        for key, mark in marks.items():
            counts[key][0] += mark == "yes"
            counts[key][1] += mark == "tie"
        later += decided is not None and decided > 1
        print(
            f"| {c} | {fixed.verdict}, {fixed.state} ({fixed.margin or 0:+.1%}) | {verdict} "
            f"| {state} | {decided or '-'} | {'yes' if predicted else 'no'} | {full.verdict}, "
            f"{full.state} ({full.margin or 0:+.1%}) | {marks['same']} | {marks['fixed']} "
            f"| {marks['self']} |"
        )
    n = len(f_verdicts)
    for key, what in (("same", "with every cell of the adaptive run measured"),
                      ("fixed", "with the separate fixed run"),
                      ("self", "the separate fixed run with every cell of the adaptive run")):  # fmt: skip
        print(
            f"\n{what}: {counts[key][0]} of {n} verdicts agree, {counts[key][1]} more ties", end=""
        )
    print(f"\n\n{later} adaptive verdict(s) decided after round 0")


if __name__ == "__main__":
    main()
