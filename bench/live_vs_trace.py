"""Benchmark: vLLM's live per-position acceptance at T = 1 against the offline trace.

Runs the `live-t1` sweep on the shipped tiny pair (static K = 3, temperature 1, top-p 0.95,
probabilistic drafting, the CPU sampler fix on; one server start), then
`avbench trace --against` the run with an absolute tolerance of 0.05, and checks:

- at least ``--min-drafts`` drafts (vLLM's num_drafts, every position) in the live run;
- per position, live accepted/drafts within 0.05 of the trace's sum min(p, q) on the same
  prompts, sampling and K;
- the trace's sampled acceptance within 3 standard errors of its own sum min(p, q).

    .venv/bin/python bench/live_vs_trace.py [--requests 32] [--passes 2]
    .venv/bin/python bench/live_vs_trace.py --run results/<run>   # check an existing run

The sweep starts one vLLM server (no other server should run meanwhile); the trace is CPU work
in transformers, a few minutes for the default 2 x 32 requests traced twice.

Exit 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def avbench(*args: str) -> int:
    print("$ avbench " + " ".join(args), flush=True)
    return subprocess.run([sys.executable, "-m", "avbench.cli", *args]).returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="Compare this run instead of sweeping a new one.")
    ap.add_argument("--requests", type=int, default=32, help="Measured requests per cell.")
    ap.add_argument("--passes", type=int, default=2, help="Traces of each prompt.")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--min-drafts", type=int, default=500)
    ap.add_argument("--results", type=Path, default=Path("results"))
    args = ap.parse_args()

    run = args.run
    if run is None:
        run = args.results / time.strftime("live-t1-%Y%m%d-%H%M%S")
        rc = avbench(
            "sweep", "--pair", "tiny-cpu", "--sweep", "live-t1", "--requests", str(args.requests),
            "--results", str(args.results), "--run-id", run.name,
        )  # fmt: skip
        if rc != 0:
            print(f"the live sweep failed (exit {rc})")
            return 1
    cells = [json.loads(line) for line in (run / "cells.jsonl").read_text().splitlines()]
    drafts = sum(int(c.get("num_drafts") or 0) for c in cells if c.get("arm_kind") == "static")
    print(f"live drafts per position: {drafts} (need >= {args.min_drafts})")
    rc = avbench(
        "trace", "--against", str(run), "--passes", str(args.passes),
        "--tolerance", str(args.tolerance), "--out", str(run / "trace"),
    )  # fmt: skip
    ok = rc == 0 and drafts >= args.min_drafts
    print("live vs trace: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
