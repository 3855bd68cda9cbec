"""Check vLLM's online acceptance estimator and avbench's refit capture on real kernels.

Runs vLLM's own ``OnlineAcceptanceEstimator`` (its Triton feature, accumulate and refit
kernels) on a short synthetic load: draft logits whose confidence spans the whole feature
range, acceptance drawn from a known logistic model, some verdicts trimmed as adaptive
verification would, and empty ``step()`` calls. The load runs twice from the same seed: once on
the bare class, once with avbench's refit capture installed. Asserts:

- a refit line appears every 100 ``step()`` calls (empty calls included), with the
  step count and the per-position label counts of its round;
- the captured coefficients equal the bare run's bit for bit (the capture changes nothing);
- they equal avbench's numpy estimator fed the same features and labels (float32 tolerance);
- the slope has left its cold start 0.5.

On a GPU (the nightly job, or any CUDA machine) the estimator comes from the installed vLLM or
from ``--vllm-src`` (a directory holding vLLM's package tree; the files needed are listed in
``avbench/testing/vllm_kernels.py``). Without a GPU it stops with a message unless ``--cpu``,
which runs the kernels in Triton's interpreter (slow: keep ``--steps`` small).

    python scripts/gpu_check_estimator.py [--vllm-src DIR] [--cpu] [--steps 350] [--out DIR]

Exit status: 0 = every check passed, 1 = a check failed, 2 = cannot run here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TRUE_SLOPE = 0.8  # the synthetic acceptance model's slope


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-src", type=Path, help="vLLM package directory (default: installed)")
    ap.add_argument("--cpu", action="store_true", help="run on CPU in Triton's interpreter")
    ap.add_argument("--steps", type=int, default=350, help="step() calls (>= 100)")
    ap.add_argument("--requests", type=int, default=8, help="request slots")
    ap.add_argument("--positions", type=int, default=4, help="draft positions K")
    ap.add_argument("--vocab", type=int, default=5000, help="vocabulary (> 4096: two blocks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="keep the capture and a summary here")
    args = ap.parse_args(argv)
    if args.steps < 100 or min(args.requests, args.positions) < 1 or args.vocab < 2:
        ap.error("--steps must be >= 100, --requests and --positions >= 1, --vocab >= 2")
    return args


def draft_logits(rng: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    """Rows whose top token stands out by a random margin: logit(q_max) from about -8 to 40."""
    z = rng.normal(0.0, 1.0, size=(rows, vocab))
    top = rng.integers(0, vocab, size=rows)
    z[np.arange(rows), top] += rng.uniform(-2.0, 30.0, size=rows)
    return z.astype(np.float32)


def run_load(mod, args: argparse.Namespace, device) -> dict:
    """Drive one estimator; returns its coefficients after every refit and every labeled draft
    (the ``step()`` call that observed it, position, label, the kernel's own feature)."""
    import torch

    from avbench.estimator.online import logit_qmax_from_logits, sigmoid

    rng = np.random.default_rng(args.seed)
    k = args.positions
    intercepts = np.linspace(0.4, -0.8, k)  # the truth the labels are drawn from
    slots = args.requests
    est = mod.OnlineAcceptanceEstimator(slots, k, device)
    temps = rng.choice([1.0, 0.7, 0.0], size=slots)
    temperature = torch.tensor(temps, dtype=torch.float32, device=device)
    scale = np.where(temps > 0, temps, 1.0)  # temperature 0 drafts from unscaled logits
    conf = torch.zeros(slots, k, dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    verdict = None  # (idx_mapping, num_sampled, num_rejected) for the next step() call
    pending: list[tuple[int, int, int]] = []  # (slot, position, label) graded by that call
    refits, observed = [], []
    for call in range(args.steps):
        if verdict is None:  # a call that observes nothing (prefill-only step, all trimmed)
            n = int(rng.integers(0, 3))
            verdict = (
                torch.arange(n, **i32),
                torch.tensor(rng.integers(0, 2, n), **i32),
                torch.zeros(n, **i32),
            )
        before = est._refits
        est.step(*verdict)
        feats = est.features.cpu().numpy()
        observed += [(call, p, y, float(feats[s, p])) for s, p, y in pending]
        if est._refits != before:
            refits.append(
                (float(est.slope.item()), est.intercepts.cpu().numpy().astype(float).tolist())
            )
        verdict, pending = None, []
        if rng.random() < 0.15:
            continue
        # Draft K tokens for a random subset of request slots: on even calls one predict per
        # position (a draft model's loop), on odd calls one for the whole block (per-row step).
        active = np.sort(rng.choice(slots, size=int(rng.integers(1, slots + 1)), replace=False))
        idx = torch.tensor(active, **i32)
        z = draft_logits(rng, len(active) * k, args.vocab).reshape(len(active), k, -1)
        if call % 2 == 0:
            for p in range(k):
                logits = torch.tensor(z[:, p], device=device)
                est.predict(logits, idx, torch.tensor(p, **i32), conf, temperature)
        else:
            est.predict(
                torch.tensor(z.reshape(len(active) * k, -1), device=device),
                torch.tensor(np.repeat(active, k), **i32),
                torch.tensor(np.tile(np.arange(k), len(active)), **i32),
                conf,
                temperature,
            )
        f_true = logit_qmax_from_logits(z / scale[active][:, None, None])
        accept = rng.random((len(active), k)) < sigmoid(TRUE_SLOPE * f_true + intercepts)
        # Adaptive verification may admit fewer than K drafts; the rest are never graded.
        admitted = np.where(rng.random(len(active)) < 0.3, rng.integers(0, k + 1, len(active)), k)
        ns, nr = [], []
        for r, s in enumerate(active):
            a = int(np.argmin(np.append(accept[r, : admitted[r]], False)))
            ns.append(a + 1)
            nr.append(int(admitted[r]) - a)
            pending += [(int(s), p, 1) for p in range(a)]
            if a < admitted[r]:
                pending.append((int(s), a, 0))
        verdict = (idx, torch.tensor(ns, **i32), torch.tensor(nr, **i32))
    return {"refits": refits, "observed": np.array(observed, dtype=np.float64).reshape(-1, 4)}


def check(args: argparse.Namespace) -> list[str]:
    import torch

    from avbench.capture_protocol import refit_lines
    from avbench.estimator.online import EstimatorConfig, replay
    from avbench.testing.vllm_kernels import load_estimator_module
    from avbench.vllm_plugin.refits import flush_refits, install_refit_capture

    device = torch.device("cpu" if args.cpu else "cuda")
    mod = load_estimator_module(args.vllm_src)
    bare = run_load(mod, args, device)
    capture_dir = args.out or Path(tempfile.mkdtemp(prefix="avbench-refits-"))
    if not install_refit_capture(capture_dir):
        return ["install_refit_capture refused vLLM's estimator class (see the warning above)"]
    wrapped = run_load(mod, args, device)
    flush_refits()
    lines = refit_lines(capture_dir)

    problems = []
    n_refits = args.steps // 100
    if len(lines) != n_refits:
        problems.append(
            f"{len(lines)} refit lines for {args.steps} step() calls, expected {n_refits}"
        )
    steps = [r["step_count"] for r in lines]
    if steps != [100 * (i + 1) for i in range(len(lines))]:
        problems.append(f"step counts {steps}, expected 100, 200, ...")
    if bare["refits"] != wrapped["refits"]:
        problems.append("the capture changed the estimator: coefficients differ from the bare run")
    logged = [(r["slope"], list(r["intercepts"])) for r in lines]
    if logged != wrapped["refits"]:
        problems.append("logged coefficients differ from the estimator's own tensors")
    obs = wrapped["observed"]
    call, pos, lab, feat = (
        obs[:, 0].astype(np.int64),
        obs[:, 1].astype(np.int64),
        obs[:, 2],
        obs[:, 3],
    )
    k = args.positions
    for i, r in enumerate(lines):
        in_round = call // 100 == i
        want = np.bincount(pos[in_round], minlength=k).tolist()
        if list(r["label_counts"]) != want:
            problems.append(f"refit {i}: label counts {r['label_counts']}, observed {want}")
    ref = replay(call, pos, lab, feat, EstimatorConfig(num_positions=k), num_steps=args.steps)
    if len(ref.refits) != len(lines):
        problems.append(f"numpy replay made {len(ref.refits)} refits, vLLM {len(lines)}")
    worst = 0.0
    for r_np, r_v in zip(ref.refits, lines, strict=False):
        got = np.array([r_v["slope"], *r_v["intercepts"]])
        want = np.array([r_np.omega, *r_np.beta])
        worst = max(worst, float(np.max(np.abs(got - want) / (1e-3 + np.abs(want)))))
    if worst > 1e-4:
        problems.append(f"numpy estimator differs from vLLM's by {worst:.2e} (relative), > 1e-4")
    if lines and lines[-1]["slope"] == 0.5:
        problems.append("the slope never left its cold start 0.5")
    summary = {
        "device": str(device),
        "steps": args.steps,
        "refits": len(lines),
        "labeled_drafts": len(obs),
        "empty_calls": int(args.steps - len(np.unique(call))),
        "final_slope": lines[-1]["slope"] if lines else None,
        "final_intercepts": lines[-1]["intercepts"] if lines else None,
        "max_relative_diff_vs_numpy": worst,
        "problems": problems,
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
        np.save(args.out / "observed.npy", obs)
    return problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are defined, below
        # The interpreter evaluates log(0) in numpy for certain drafts (f = +inf, clamped).
        warnings.filterwarnings("ignore", "divide by zero", RuntimeWarning)
    else:
        import torch

        if not torch.cuda.is_available():
            print(
                "gpu_check_estimator: no CUDA GPU here; run on a GPU machine, or pass --cpu to "
                "run the kernels in Triton's interpreter",
                file=sys.stderr,
            )
            return 2
    from avbench.testing.vllm_kernels import KernelSourceError

    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    try:
        problems = check(args)
    except KernelSourceError as exc:
        print(f"gpu_check_estimator: {exc}", file=sys.stderr)
        return 2
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    print("estimator check: " + ("FAILED" if problems else "passed"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
