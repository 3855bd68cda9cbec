"""Benchmark: what the avbench plugin's drafts capture costs.

1. Model Runner V1 (the vLLM CPU build): tiny-pair serving throughput with capture off vs on.
   Starts the real vLLM CPU server for the tiny pair (static K = 3) once per run, alternating
   capture off and on (drafts + refits, draft_fraction 1.0: every request's drafts), drives the
   same greedy load at each, and prints output tokens/s and the on/off ratio.
2. Model Runner V2 (GPU only, so counted, not timed): the host operations the capture hook adds
   to the engine thread per step, as aten dispatches (``TorchDispatchMode``) and Triton kernel
   launches, on a stand-in V2 runner holding buffers shaped as vLLM 0.33 makes them, with vLLM
   0.33's real estimator module (its kernels run in Triton's interpreter). ``--before REV`` also
   counts the plugin of a git revision (``git archive``), for a before/after figure.

    nice -n 19 .venv/bin/python bench/plugin_capture.py [--rounds 1] [--requests 32]
    .venv/bin/python bench/plugin_capture.py --v2-ops-only [--before 91df8cf]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def serve_and_measure(capture: bool, args, tmp: Path) -> tuple[float, int, int]:
    """(output tokens/s, output tokens, captured rows) for one server."""
    from avbench.inputs.request import EndpointConfig, SamplingParams
    from avbench.loadgen.client import Load, run_drive
    from avbench.serving.capture import read_captured, wait_flushed
    from avbench.testing.tiny_server import tiny_capture_server
    from avbench.workloads.registry import all_workloads, load_workload

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
            Load(concurrency=args.concurrency, warmup=args.warmup),
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


# ----------------------------------------------------------------------------- V2 host ops
V2_SHAPES = ((6, 8), (64, 8), (6, 3))  # (sampled requests, K): c=64 at fraction 0.1, 1.0; K=3
V2_SLOTS, V2_VOCAB = 64, 8192  # op counts do not depend on the vocabulary size


def count_v2_ops(src: Path, n: int, k: int, av: bool) -> dict:
    """Host operations of one V2 ``_after_sample`` (a verdict and a proposal for ``n`` sampled
    requests of ``V2_SLOTS``), steady state (the third step). Runs in a process of its own:
    the estimator module is imported under a stand-in ``vllm`` package."""
    from types import SimpleNamespace

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from avbench.testing.vllm_kernels import load_estimator_module
    from avbench.vllm_plugin import features
    from avbench.vllm_plugin.drafts import DraftCapture
    from avbench.vllm_plugin.runtime import Health
    from avbench.vllm_plugin.v2 import _after_sample

    class Count(TorchDispatchMode):
        aten = launches = paused = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.aten += 0 if self.paused else 1
            return func(*args, **(kwargs or {}))

    counter = Count()
    mod = load_estimator_module(src / "vllm")

    class Launch:  # a kernel launch is one host operation; the interpreter's own torch calls are not
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                counter.launches += 1
                counter.paused += 1
                try:
                    return self.kernel[grid](*args, **kwargs)
                finally:
                    counter.paused -= 1

            return run

    for name in ("_local_max_sumexp_kernel", "_predict_kernel"):
        setattr(mod, name, Launch(getattr(mod, name)))
    tmp = Path(tempfile.mkdtemp())
    cap = DraftCapture(tmp, 1.0, Health(tmp))
    cap._rank = (True, 0)  # the first tensor-parallel rank (no vLLM distributed state here)
    if hasattr(cap, "kernels"):
        cap.kernels = mod  # the GPU path: vLLM's kernels compute our feature
    else:  # a revision before DraftCapture.kernels: the same path through its features module
        import functools

        features.logit_qmax = functools.partial(features.logit_qmax, kernels=mod)
    g = torch.Generator().manual_seed(0)
    est = mod.OnlineAcceptanceEstimator(V2_SLOTS, k, torch.device("cpu")) if av else None
    states = SimpleNamespace(temperature=SimpleNamespace(gpu=torch.ones(V2_SLOTS)))
    runner = SimpleNamespace(
        speculator=SimpleNamespace(
            draft_logits=torch.randn(V2_SLOTS, k, V2_VOCAB, generator=g),
            acceptance_estimator=est,
            use_confidence_head=False,
        ),
        req_states=SimpleNamespace(
            draft_tokens=torch.randint(0, V2_VOCAB, (V2_SLOTS, k), generator=g)
        ),
        sampler=SimpleNamespace(sampling_states=states),
        pcp_manager=None,
    )
    ids = [f"cmpl-r{i}-0-{i:08x}" for i in range(V2_SLOTS)]
    batch = SimpleNamespace(req_ids=ids, idx_mapping=torch.randperm(V2_SLOTS, generator=g))
    cap._ids = {e: (e.rsplit("-", 1)[0] if i < n else None) for i, e in enumerate(ids)}
    for step in (1, 2, 3):
        cap.step, cap.step_spec = step, dict.fromkeys(ids, k)
        ns = torch.full((V2_SLOTS,), 2, dtype=torch.int32)
        cap.v2_verdict = (ns, torch.ones(V2_SLOTS, dtype=torch.int32))
        counter.aten = counter.launches = 0
        with counter:
            _after_sample(cap, runner, batch)
    cap._writer.close()
    return {"aten": counter.aten, "triton": counter.launches}


def v2_ops_table(tree: Path | None) -> dict:
    """Counts of every shape and arm, from a subprocess importing avbench from ``tree``."""
    from avbench.testing.vllm_source import source_tree

    env = os.environ | {"TRITON_INTERPRET": "1"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    out = subprocess.run(
        [sys.executable, __file__, "--count-v2-ops", str(source_tree())],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"counting V2 host ops failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_v2_ops(before: str | None) -> None:
    tables = {"now": v2_ops_table(None)}
    if before:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(
                ["git", "archive", before, "avbench"], capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            tables = {before: v2_ops_table(Path(tmp))} | tables
    print("V2 host operations per step on the engine thread (aten dispatches + Triton launches):")
    for key in tables["now"]:
        cells = ", ".join(
            f"{rev}: {t[key]['aten']} + {t[key]['triton']}" for rev, t in tables.items()
        )
        print(f"  {key}: {cells}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1, help="off/on pairs (order alternates)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--v2-ops-only", action="store_true", help="only count the V2 host ops")
    ap.add_argument("--before", metavar="REV", help="also count the plugin of this git revision")
    ap.add_argument("--count-v2-ops", metavar="VLLM_SRC", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.count_v2_ops:  # the subprocess of v2_ops_table
        src = Path(args.count_v2_ops)
        print(json.dumps({
            f"{'AV' if av else 'static'} arm, {n} requests x K={k}": count_v2_ops(src, n, k, av)
            for n, k in V2_SHAPES for av in (False, True)
        }))  # fmt: skip
        return 0
    print_v2_ops(args.before)
    if args.v2_ops_only:
        return 0
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
