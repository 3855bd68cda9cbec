"""Benchmark: tiny-pair serving throughput with the avbench plugin's capture off vs on.

Starts the real vLLM CPU server for the tiny pair (static K = 3) once per run, alternating
capture off and on (drafts + refits, draft_fraction 1.0: every request's drafts), drives the
same greedy load at each, and prints output tokens/s and the on/off ratio.

    nice -n 19 .venv/bin/python bench/plugin_capture.py [--rounds 1] [--requests 32]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def serve_and_measure(capture: bool, args, tmp: Path) -> tuple[float, int, int]:
    """(output tokens/s, output tokens, captured rows) for one server."""
    from avbench.capture import read_captured, wait_flushed
    from avbench.loadgen.client import run_drive
    from avbench.loadgen.config import EndpointConfig, SamplingParams
    from avbench.suite import all_workloads
    from avbench.testing.tiny_server import tiny_capture_server
    from avbench.workloads.registry import load_workload

    cap = tmp / f"capture-{time.monotonic_ns()}"
    if capture:
        cap.mkdir()
    server, pair = tiny_capture_server(
        3, cap if capture else None, tmp / f"server-{cap.name}.log", ready_timeout_s=900
    )
    spec = all_workloads()["gsm8k-tiny"]
    convs = load_workload(spec, tokenizer=pair.resolve(pair.target)).conversations
    n = args.warmup + args.requests
    convs = (convs * (n // len(convs) + 1))[:n]
    server.start()
    try:
        server.wait_ready()
        res = run_drive(
            EndpointConfig(base_url=server.base_url, model=pair.model_name, api=spec.api),
            SamplingParams(temperature=0.0, top_p=1.0, max_tokens=args.max_tokens),
            convs,
            concurrency=args.concurrency,
            warmup=args.warmup,
        )
        measured = [r for r in res.records if not r.warmup and r.ok]
        tokens = sum(r.completion_tokens or 0 for r in measured)
        rows = 0
        if capture:
            wait_flushed(cap, time.time(), 0.0)
            rows = len(read_captured(cap, [r.response_id for r in measured]))
        return tokens / res.window_s, tokens, rows
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1, help="off/on pairs (order alternates)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    speeds: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for capture in (False, True) if r % 2 == 0 else (True, False):
                tok_s, tokens, rows = serve_and_measure(capture, args, Path(tmp))
                speeds[capture].append(tok_s)
                what = f"capture on  ({rows} draft rows)" if capture else "capture off"
                print(f"round {r + 1}: {what}: {tok_s:8.1f} output tok/s ({tokens} tokens)")
    off, on = statistics.median(speeds[False]), statistics.median(speeds[True])
    print(f"median output tok/s: off {off:.1f}, on {on:.1f}; on/off = {on / off:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
