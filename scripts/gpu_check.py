"""GPU check: vLLM 0.33's estimator and AV kernels on CUDA against avbench, capture syncs and cost.

Made for a GPU machine with PyTorch and Triton but no vLLM and no network, reached with at most
64 MiB of files: ``prepare`` (here, after ``make vllm-src``) copies the few vLLM 0.33 source
files the checks import into a folder that travels with the repository; ``run`` (there) runs
every section in a process of its own, each with a time limit, and rewrites one JSON of all
figures after each section, so a section that fails or hangs still leaves the others' figures:

- env: the machine (GPU, driver, torch, Triton) and whether vLLM's GPU build is installed;
- estimator: vLLM's OnlineAcceptanceEstimator (Triton feature, accumulate and refit kernels) on
  a synthetic load against avbench's numpy estimator, with and without the refit capture
  (``scripts/gpu_check_estimator.py``);
- av_budget: adaptive verification's draft-budget function (vLLM runs it ``torch.compile``d:
  Triton kernels on a GPU), eager and compiled, against a numpy transcription of its rule
  (admit the ``budget`` draft slots of highest survival, the running product of confidences);
- capture: avbench's capture path of Model Runner V2 (``vllm_plugin.v2``, driven with buffers
  shaped as vLLM 0.33 makes them, and the step capture's accepted counts, ``steps._verdict_v2``)
  and the refit capture, under vLLM's own GPU-sync checker in
  error mode, as ``VLLM_GPU_SYNC_CHECK=error`` arms it in a worker; then its cost per step;
- live: where vLLM's GPU build is installed, one AV cell of the tiny pair served with captures
  off and on, ``VLLM_GPU_SYNC_CHECK=error`` in the server; elsewhere the JSON says it did not run.

    python scripts/gpu_check.py prepare [--dest build/gpu-check/vllm]
    python scripts/gpu_check.py run [--vllm-src build/gpu-check/vllm] [--out DIR] [--cpu]

``run`` leaves two files in DIR (default ``$OUT``): ``gpu_check.json``, every figure, and
``gpu_check-files.tar.gz``, every file the sections wrote (their JSONs, the estimator check's
output, the capture shards, the live runs), which they write in a folder of their own
(``--work``, default a temporary one): a lent GPU machine brings back at most 8 files, no more
than two folders below ``$OUT``.

``--cpu`` runs the same sections in Triton's interpreter with small sizes (the test of this
script). Exit status of ``run``: 0 every section that ran passed, 1 a check failed or a section
broke, 2 cannot run here (no GPU without ``--cpu``, or no vLLM source).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_SRC = REPO / "build" / "gpu-check" / "vllm"
RESULT = "gpu_check.json"
# What comes back from a lent GPU machine is at most 8 files of 16 MiB, no more than two folders
# below $OUT: the JSON and one bundle of every section's files (the sections work elsewhere).
BUNDLE = "gpu_check-files.tar.gz"
BUNDLE_FILE_LIMIT = 4 << 20  # a file larger than this stays out of the bundle (listed in the JSON)
SECTIONS = ("env", "estimator", "av_budget", "capture", "live")
# Seconds each section may take at most (the whole run stays under 5 minutes on a GPU).
LIMITS_S = {"env": 30, "estimator": 120, "av_budget": 120, "capture": 90, "live": 240}
BUDGET_S = 290.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="copy the vLLM files the checks need (here)")
    prep.add_argument("--dest", type=Path, default=DEFAULT_SRC)
    run = sub.add_parser("run", help="run the checks (on the GPU machine)")
    run.add_argument("--vllm-src", type=Path, default=DEFAULT_SRC)
    run.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "results/gpu-check"))
    run.add_argument(
        "--work", type=Path, help="the sections' own files (default: a temporary folder)"
    )
    run.add_argument("--cpu", action="store_true", help="Triton's interpreter, small sizes")
    run.add_argument("--budget-s", type=float, default=BUDGET_S, help="wall-clock budget")
    run.add_argument(
        "--only", type=lambda v: v.split(","), default=list(SECTIONS), help="sections, a,b,..."
    )
    run.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)  # one, in-process
    return ap.parse_args(argv)


def prepare(dest: Path) -> int:
    from avbench.testing.vllm_kernels import GPU_CHECK_FILES
    from avbench.testing.vllm_source import MissingSource, source_tree

    try:
        tree = source_tree() / "vllm"
    except MissingSource as exc:
        print(f"gpu_check prepare: {exc}", file=sys.stderr)
        return 2
    if dest.exists():
        shutil.rmtree(dest)
    size = 0
    for rel in GPU_CHECK_FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tree / rel, dest / rel)
        size += (dest / rel).stat().st_size
    print(f"gpu_check prepare: {len(GPU_CHECK_FILES)} vLLM files ({size / 1024:.0f} KiB) in {dest}")
    return 0


# ----------------------------------------------------------------------------- orchestration
def run_all(args: argparse.Namespace) -> int:
    """Each section in a subprocess of its own, working in ``args.work``; the JSON and the
    bundle of the sections' files are rewritten in ``args.out`` after every section."""
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = args.work is None  # then removed at the end: the bundle holds what it held
    args.work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    args.work.mkdir(parents=True, exist_ok=True)
    report: dict = {"started": time.time(), "cpu": args.cpu, "sections": {}, "problems": []}
    deadline = time.monotonic() + args.budget_s
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown:
        print(
            f"gpu_check: --only: unknown section(s) {unknown} (known: {SECTIONS})", file=sys.stderr
        )
        return 2
    for name in [s for s in SECTIONS if s in args.only]:
        left = deadline - time.monotonic()
        limit = min(LIMITS_S[name] * (4 if args.cpu else 1), left)
        if limit < 5:
            why = f"not run: the run's {args.budget_s:g} s budget ran out"
            result = {"status": "skipped", "why": why, "problems": [why]}
        else:
            result = _run_section(args, name, limit)
        report["sections"][name] = result
        report["problems"] += [f"{name}: {p}" for p in result.get("problems", [])]
        if result["status"] == "broken":
            report["problems"].append(f"{name}: {result['why']}")
        report["bundle_left_out"] = _bundle(args.work, args.out / BUNDLE)
        _write(args.out / RESULT, report)
    report["passed"] = not report["problems"]
    report["wall_s"] = round(time.time() - report["started"], 1)
    _write(args.out / RESULT, report)
    if scratch:
        shutil.rmtree(args.work, ignore_errors=True)
    for p in report["problems"]:
        print(f"FAIL: {p}", file=sys.stderr)
    print(f"gpu check: {'passed' if report['passed'] else 'FAILED'} ({args.out / RESULT})")
    return 0 if report["passed"] else 1


def _bundle(work: Path, dest: Path) -> list[str]:
    """Every file of ``work`` in one tar.gz (written whole, then renamed); returns the files
    left out for their size."""
    left_out = []
    tmp = dest.with_name(f".{dest.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for path in sorted(p for p in work.rglob("*") if p.is_file()):
            rel = path.relative_to(work)
            if path.stat().st_size > BUNDLE_FILE_LIMIT:
                left_out.append(f"{rel} ({path.stat().st_size >> 20} MiB)")
                continue
            tar.add(path, arcname=str(rel))
    os.replace(tmp, dest)
    return left_out


def _run_section(args: argparse.Namespace, name: str, limit: float) -> dict:
    cmd = [sys.executable, __file__, "run", "--section", name, "--out", str(args.work)]
    cmd += ["--vllm-src", str(args.vllm_src)] + (["--cpu"] if args.cpu else [])
    started = time.monotonic()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {"status": "broken", "why": f"no answer within {limit:.0f} s", "stderr": tail}
    path = args.work / f"{name}.json"
    result = json.loads(path.read_text()) if path.exists() else None
    if result is None:
        why = (res.stderr.strip().splitlines() or ["no output"])[-1]
        result = {"status": "broken", "why": f"exit {res.returncode}: {why}"}
        result["stderr"] = res.stderr[-4000:]
    result["seconds"] = round(time.monotonic() - started, 1)
    print(f"{name}: {result['status']} in {result['seconds']} s", flush=True)
    return result


def _write(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def run_section(args: argparse.Namespace) -> int:
    """One section, in this process: its result (status, figures, problems) to <out>/<name>.json."""
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is first imported
    from avbench.testing.vllm_kernels import KernelSourceError

    path = args.out / f"{args.section}.json"
    try:
        result = globals()[f"section_{args.section}"](args)
    except KernelSourceError as exc:
        result = {"status": "broken", "why": str(exc)}
    except Exception as exc:  # noqa: BLE001 - recorded in the JSON, the run goes on
        result = {"status": "broken", "why": f"{type(exc).__name__}: {exc}"}
        result["traceback"] = traceback.format_exc()[-4000:]
    if result.get("status") is None:
        result["status"] = "failed" if result.get("problems") else "passed"
    _write(path, result)
    return 0


# ----------------------------------------------------------------------------- sections
def _device(args):
    import torch

    return torch.device("cpu" if args.cpu else "cuda")


def _gpu_build() -> str | None:
    """The installed vLLM GPU build's version, None when absent (or only the CPU build)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


def section_env(args) -> dict:
    import platform

    import numpy as np
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError as exc:
        out["triton"] = f"not importable: {exc}"
    out["cuda"] = torch.cuda.is_available()
    if out["cuda"]:
        out["device"] = torch.cuda.get_device_name(0)
        out["torch_cuda"] = torch.version.cuda
    smi = shutil.which("nvidia-smi")
    if smi:
        q = [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        res = subprocess.run(q, capture_output=True, text=True, timeout=20, check=False)
        out["nvidia_smi"] = res.stdout.strip().splitlines()
    out["vllm_gpu_build"] = _gpu_build()
    out["vllm_src"] = str(args.vllm_src)
    problems = [] if out["cuda"] or args.cpu else ["torch sees no CUDA device"]
    return out | {"problems": problems}


def section_estimator(args) -> dict:
    out = args.out / "estimator"
    if out.exists():  # refit lines of an earlier run would count as this run's
        shutil.rmtree(out)
    cmd = [sys.executable, str(REPO / "scripts" / "gpu_check_estimator.py")]
    cmd += ["--vllm-src", str(args.vllm_src), "--out", str(out)]
    cmd += (
        ["--cpu", "--steps", "100", "--requests", "2", "--positions", "1", "--vocab", "16"]
        if (args.cpu)
        else ["--steps", "350", "--requests", "32", "--positions", "8", "--vocab", "32000"]
    )
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if res.returncode == 2 or not summary:
        why = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        return {"status": "broken", "why": why, "stderr": res.stderr[-3000:]}
    if res.returncode != 0 and not summary.get("problems"):
        summary["problems"] = [f"exit {res.returncode}: {res.stderr.strip()[-300:]}"]
    return summary | {"exit": res.returncode}


def admitted_reference(conf, idx, capacity, budget: int):
    """numpy transcription of the draft-budget rule: per request the count of its slots among
    the ``budget`` of highest survival (running product of confidences over positions)."""
    import numpy as np

    survival = np.cumprod(conf[idx].astype(np.float64), axis=1)
    steps = np.arange(conf.shape[1])
    survival[steps[None, :] >= capacity[:, None]] = -np.inf
    flat = survival.ravel()
    order = np.argsort(-flat, kind="stable")
    admitted = np.zeros(flat.shape, bool)
    admitted[order[:budget]] = True
    # A near tie at the cut could fall either way in float32: such a case is not compared.
    cut = flat[order[budget - 1]], flat[order[budget]] if budget < len(flat) else -np.inf
    tie = np.isfinite(cut[1]) and abs(cut[0] - cut[1]) <= 1e-5 * abs(cut[0])
    return admitted.reshape(survival.shape).sum(axis=1), bool(tie)


def section_av_budget(args) -> dict:
    import numpy as np
    import torch

    from avbench.testing.vllm_kernels import load_av_budget

    fn = load_av_budget(args.vllm_src)
    dev = _device(args)
    variants = {"eager": fn}
    if not args.cpu:  # as vLLM runs it; inductor's CPU code is not what a GPU runs
        variants["compiled"] = torch.compile(fn, dynamic=True)
    rng = np.random.default_rng(0)
    shapes = [(n, k) for n in (1, 7, 64, 256) for k in (1, 3, 8)]
    cases, problems, ties = 0, [], 0
    for n, k in shapes[:5] if args.cpu else shapes:
        slots = n + 5
        conf = rng.uniform(0.05, 0.999, (slots, k)).astype(np.float32)
        idx = rng.permutation(slots)[:n].astype(np.int32)
        capacity = rng.integers(0, k + 1, n).astype(np.int32)
        if capacity.sum() < 2:
            continue
        budget = int(rng.integers(1, capacity.sum()))
        want, tie = admitted_reference(conf, idx, capacity, budget)
        ties += tie
        for name, f in variants.items():
            if name == "compiled" and min(n, k) == 1:
                continue  # sizes of 1 are specialised: a recompile each, for no new code path
            caps = torch.tensor(capacity, device=dev)
            f(torch.tensor(conf, device=dev), torch.tensor(idx, device=dev), caps, budget, k)
            got = caps.cpu().numpy()
            cases += 1
            if int(got.sum()) != budget or (not tie and not np.array_equal(got, want)):
                problems.append(f"{name} n={n} K={k} budget={budget}: {got} != {want.tolist()}")
    out = {"variants": list(variants), "cases": cases, "near_ties": ties, "problems": problems}
    if "compiled" in variants:
        out["compiled_us_per_call_n256_k8"] = _time_budget(variants["compiled"], dev)
    return out


def _time_budget(fn, dev) -> float:
    import torch

    conf = torch.rand(261, 8, device=dev) * 0.9 + 0.05
    idx = torch.randperm(261, device=dev)[:256].to(torch.int32)
    caps = torch.full((256,), 8, dtype=torch.int32, device=dev)
    for _ in range(3):
        fn(conf, idx, caps.clone(), 1000, 8)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        fn(conf, idx, caps.clone(), 1000, 8)
    end.record()
    end.synchronize()
    return round(start.elapsed_time(end) / 50 * 1000, 1)


def section_capture(args) -> dict:
    """The V2 drafts capture and the refit capture under vLLM's sync checker, then their cost."""
    from avbench.capture_protocol import refit_lines
    from avbench.testing.vllm_kernels import load_estimator_module, load_sync_checker
    from avbench.vllm_plugin.refits import flush_refits, install_refit_capture

    est_mod = load_estimator_module(args.vllm_src)
    checker = load_sync_checker(args.vllm_src, "error")
    capture_dir = args.out / "capture"
    if capture_dir.exists():
        shutil.rmtree(capture_dir)
    capture_dir.mkdir(parents=True)
    if not install_refit_capture(capture_dir):
        return {"problems": ["install_refit_capture refused vLLM 0.33's estimator class"]}
    sizes = Sizes(8, 4, 2, 64) if args.cpu else Sizes(96, 8, 8, 151936)
    bench = FakeV2(est_mod, capture_dir, _device(args), sizes)
    bench.step()  # the first call compiles kernels, as vLLM's warmup would
    checker.enable_gpu_sync_check()
    est = bench.runner.speculator.acceptance_estimator
    problems, steps = [], 0
    # On a GPU, past the estimator's 100-step refit boundary; in the interpreter a few steps,
    # the last one made a refit boundary by the estimator's own step counter.
    todo = 3 if args.cpu else est.REFIT_INTERVAL + 5
    for i in range(todo):
        if args.cpu and i == todo - 1:
            est._steps_since_refit = est.REFIT_INTERVAL - 1
        try:
            bench.step(checker.with_gpu_sync_check)
        except RuntimeError as exc:
            problems.append(f"step {steps + 1}: {' '.join(str(exc).split())[:300]}")
            break
        steps += 1
    out = {
        "sizes": sizes.__dict__,
        "checked_steps": steps,
        "sync_check": "on" if checker._SYNC_CHECK_MODE else "off (no CUDA)",
    }
    out["cost"] = {} if args.cpu else {f"n{n}": bench.cost(n) for n in (8, 64)}
    flush_refits()
    out |= bench.close()
    out["refit_lines"] = len(refit_lines(capture_dir))
    if out["refit_lines"] < 1:
        problems.append("no refit line was written past the 100-step boundary")
    if out["health_errors"]:
        problems.append(f"capture hooks caught errors: {out['health_errors']}")
    if not out["draft_rows"]:
        problems.append("no labeled draft row was written")
    return out | {"problems": problems}


@dataclass(frozen=True)
class Sizes:
    """Request slots, requests per step, draft positions K and vocabulary of the fake runner."""

    slots: int
    n: int
    k: int
    vocab: int


class FakeV2:
    """Stands in for Model Runner V2 around avbench's hooks: the buffers they read, shaped,
    typed and keyed as vLLM 0.33 makes them (``req_states.draft_tokens`` (slots, K) int64,
    ``speculator.draft_logits`` (slots, K, V) float32, a real ``OnlineAcceptanceEstimator``
    as on an AV arm, per-slot temperatures), and one engine step of drafting and verification.
    What the engine itself does (drafting, predict) is done here outside the checked call."""

    def __init__(self, est_mod, capture_dir: Path, device, sizes: Sizes):
        import types

        import torch

        from avbench.vllm_plugin.drafts import DraftCapture
        from avbench.vllm_plugin.runtime import Health

        slots, k, vocab = sizes.slots, sizes.k, sizes.vocab
        self.torch, self.dev, self.k, self.n = torch, device, k, sizes.n
        g = torch.Generator(device="cpu").manual_seed(0)
        self.gen = g
        est = est_mod.OnlineAcceptanceEstimator(slots, k, device)
        spec = types.SimpleNamespace(
            draft_logits=torch.zeros(slots, k, vocab, device=device),
            acceptance_estimator=est,
            use_confidence_head=False,
        )
        temp = types.SimpleNamespace(gpu=torch.ones(slots, device=device))
        self.runner = types.SimpleNamespace(
            speculator=spec,
            req_states=types.SimpleNamespace(
                draft_tokens=torch.full((slots, k), -1, dtype=torch.int64, device=device)
            ),
            sampler=types.SimpleNamespace(sampling_states=types.SimpleNamespace(temperature=temp)),
        )
        self.cap = DraftCapture(capture_dir, 1.0, Health(capture_dir))
        self.slots = slots
        self.engine_ids = [f"cmpl-{i:016x}-0-{i:08x}" for i in range(slots)]

    def _batch(self, n: int):
        import types

        torch = self.torch
        idx = torch.randperm(self.slots, generator=self.gen)[:n].to(torch.int32)
        ids = [self.engine_ids[i] for i in idx.tolist()]
        return types.SimpleNamespace(req_ids=ids, idx_mapping=idx.to(self.dev)), idx

    def _draft(self, idx) -> None:
        """The engine's part: K drafts per request, their logits and the estimator's predict."""
        torch, k, spec = self.torch, self.k, self.runner.speculator
        idx_d = idx.to(self.dev).long()
        vocab = spec.draft_logits.shape[2]
        logits = torch.randn(len(idx), k, vocab, generator=self.gen).to(self.dev) * 3
        spec.draft_logits[idx_d] = logits
        self.runner.req_states.draft_tokens[idx_d] = logits.argmax(-1)
        conf = torch.zeros(self.slots, k, device=self.dev)
        temp = self.runner.sampler.sampling_states.temperature.gpu
        for p in range(k):
            spec.acceptance_estimator.predict(
                logits[:, p].contiguous(), idx_d, torch.tensor(p, device=self.dev), conf, temp
            )

    def step(self, check: Callable | None = None) -> None:
        """One engine step. ``check`` wraps what runs inside vLLM's checked worker calls (the
        estimator's step with the refit capture, and the capture hook after sample_tokens);
        the engine's own host work here (batch, verdict, drafts) stays outside it, as in vLLM."""
        from avbench.vllm_plugin import v2

        run = check or (lambda fn: fn)
        batch, idx, verdict = self._verdict()
        run(self._observe)(batch, verdict)
        self._draft(idx)
        run(v2._after_sample)(self.cap, self.runner, batch)

    def _verdict(self):
        """This step's requests and the target's verdict on their drafts: AV admits a random
        prefix of the K drafts, of which a random prefix is accepted."""
        torch, k = self.torch, self.k
        batch, idx = self._batch(self.n)
        rows = len(idx)
        admitted = torch.randint(0, k + 1, (rows,), generator=self.gen)
        accepted = (torch.rand(rows, generator=self.gen) * (admitted + 1)).long().clamp(max=k)
        accepted = torch.minimum(accepted, admitted)
        num_sampled = (accepted + 1).to(torch.int32).to(self.dev)
        num_rejected = (admitted - accepted).to(torch.int32).to(self.dev)
        return batch, idx, (num_sampled, num_rejected)

    def _observe(self, batch, verdict) -> None:
        """What the V2 hooks see before sampling, then vLLM's observe_verification: the step
        capture's accepted counts (its index upload) and the estimator's step (wrapped by the
        refit capture)."""
        import types

        from avbench.vllm_plugin.steps import _verdict_v2

        self.cap.step += 1
        self.cap.step_spec = {e: self.k for e in batch.req_ids}
        self.cap.v2_verdict = verdict
        step = types.SimpleNamespace(batch_ids=batch.req_ids, spec=self.cap.step_spec, acc=None)
        _verdict_v2(step, verdict[0])
        self.runner.speculator.acceptance_estimator.step(batch.idx_mapping, *verdict)

    def cost(self, n: int) -> dict:
        """Host and device milliseconds of the capture hook alone, per step of n requests."""
        from avbench.vllm_plugin import v2

        torch = self.torch
        batch, idx = self._batch(min(n, self.slots))
        self._draft(idx)
        host, start = [], torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(20):
            t = time.perf_counter()
            v2._after_sample(self.cap, self.runner, batch)
            host.append(time.perf_counter() - t)
        end.record()
        end.synchronize()
        return {
            "rows": len(idx),
            "host_ms_median": round(sorted(host)[len(host) // 2] * 1000, 3),
            "device_ms_per_step": round(start.elapsed_time(end) / 20, 3),
        }

    def close(self) -> dict:
        """Stop the writer; what it wrote (rows per label) and what the hooks caught."""
        from avbench.serving.capture import read_captured

        writer = self.cap._writer
        if writer is not None:
            writer.close()
        rows = read_captured(self.cap.dir)
        labels = rows["label"].value_counts().to_dict() if len(rows) else {}
        return {
            "draft_rows": len(rows),
            "rows_per_label": {int(k): int(v) for k, v in labels.items()},
            "health_errors": dict(self.cap.health.errors),
            "health_first_error": dict(self.cap.health.first_error),
        }


def section_live(args) -> dict:
    """One AV cell of the tiny pair on the real server, captures off then on."""
    version = _gpu_build()
    if version is None or args.cpu:
        why = "vLLM's GPU build is not installed here" if version is None else "--cpu"
        return {"status": "skipped", "why": f"{why}: no live server, no capture on/off cell timing"}
    cells = {}
    env = os.environ | {"VLLM_GPU_SYNC_CHECK": "error", "HF_HUB_OFFLINE": "1"}
    for name, extra in (("capture-off", []), ("capture-on", ["--capture", "drafts,refits"])):
        cmd = [sys.executable, "-m", "avbench.cli", "sweep", "--pair", "tiny-gpu"]
        cmd += ["--sweep", "gpu-check", "--results", str(args.out / "live"), "--run-id", name]
        res = subprocess.run(cmd + extra, capture_output=True, text=True, env=env, check=False)
        rows = _cell_rows(args.out / "live" / name)
        cells[name] = {"exit": res.returncode, "rows": rows, "stderr": res.stderr[-2000:]}
    problems = [f"{n}: sweep exit {c['exit']}" for n, c in cells.items() if c["exit"] != 0]
    on = cells["capture-on"]["rows"]
    problems += [
        f"capture-on: {r['cell_id']}: capture_errors {r.get('capture_errors')}, "
        f"inert {r.get('capture_inert')}"
        for r in on
        if r.get("capture_errors") or r.get("capture_inert")
    ]
    speed = {n: [r.get("output_tok_s") for r in c["rows"]] for n, c in cells.items()}
    out = {"vllm": version, "cells": cells, "output_tok_s": speed, "problems": problems}
    if speed["capture-off"] and speed["capture-on"] and speed["capture-off"][0]:
        out["on_off_ratio"] = round(speed["capture-on"][0] / speed["capture-off"][0], 3)
    return out


def _cell_rows(run: Path) -> list[dict]:
    path = run / "cells.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "prepare":
        return prepare(args.dest)
    if args.section:
        return run_section(args)
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print(
                "gpu_check: no CUDA GPU here; pass --cpu for the interpreter run", file=sys.stderr
            )
            return 2
    if not (args.vllm_src / "v1").is_dir():
        print(
            f"gpu_check: no vLLM source at {args.vllm_src}: run `python scripts/gpu_check.py "
            "prepare` where `make vllm-src` was run, and carry that folder",
            file=sys.stderr,
        )
        return 2
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
