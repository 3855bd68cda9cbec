"""`avbench trace`, `avbench lossless`, `avbench tables`: the estimator laboratory (issue 4).

Thin: parse options and call avbench.estimator; heavy imports stay inside the commands.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from avbench.errors import AvbenchError
from avbench.inputs import check_non_negative


def trace(
    pair: str = typer.Option(
        "tiny-cpu",
        help="Pair id ('tiny-cpu' = the shipped tiny pair) or a label for --target/--drafter.",
    ),
    workload: list[str] = typer.Option(
        ["gsm8k"], "--workload", "-w", help="Workload id; repeat for several."
    ),
    target: Path | None = typer.Option(None, help="Target model dir (Hugging Face format)."),
    drafter: Path | None = typer.Option(None, help="Drafter model dir (Hugging Face format)."),
    out: Path | None = typer.Option(None, help="Run directory; default results/trace-<time>."),
    num_draft: int = typer.Option(4, "-k", "--num-draft", help="Draft tokens per step (K)."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (0 = greedy)."),
    top_p: float = typer.Option(0.95, help="Top-p for drafter and target."),
    prompts: int = typer.Option(16, help="Prompts per workload (file order)."),
    max_new_tokens: int = typer.Option(64, help="Tokens generated per prompt."),
    concurrency: int = typer.Option(4, help="Requests interleaved into one emulated engine step."),
    seed: int = typer.Option(0),
    device: str = typer.Option("cpu", help="torch device, e.g. cpu or cuda."),
    dtype: str = typer.Option("float32", help="Model weight dtype (float32, bfloat16, auto)."),
    threads: int = typer.Option(1, help="torch CPU threads (small models are fastest on one)."),
    check: int = typer.Option(
        0,
        help="Also test (chi-square, alpha 0.01) with this many runs that emitted tokens follow the target.",
    ),
    draft_top_p: bool = typer.Option(
        False,
        help="Cut the drafter's distribution by top-p too (vLLM does not: its drafts and q "
        "are the temperature softmax).",
    ),
    against: Path | None = typer.Option(
        None,
        help="A live sweep run: trace its pair on its cells' prompts with its sampling and K, "
        "and compare per-position acceptance (exit 1 on a mismatch).",
    ),
    passes: int = typer.Option(1, help="With --against: trace each prompt this many times."),
    tolerance: float | None = typer.Option(
        None,
        help="With --against: allowed |live - offline| per position (default: 4 standard "
        "errors of the difference).",
    ),
) -> None:
    """Generate labeled drafts offline with a real target + drafter (transformers)."""
    import torch

    from avbench.estimator.trace import (
        TraceConfig,
        check_pair,
        render_distribution_test,
        resolve_pair,
        run_trace,
    )

    check_non_negative(seed, "--seed")
    for name, value in (("-k/--num-draft", num_draft), ("--prompts", prompts),
                        ("--max-new-tokens", max_new_tokens), ("--concurrency", concurrency),
                        ("--threads", threads)):  # fmt: skip
        if value < 1:
            raise AvbenchError(f"{name}: expected an integer >= 1, got {value}")
    check_non_negative(check, "--check")
    _check_device(device, torch)
    if out is not None and out.exists() and not out.is_dir():
        raise AvbenchError(f"--out {out}: is a file, expected a run directory")
    torch.set_num_threads(max(1, threads))
    run_dir = out or Path("results") / time.strftime("trace-%Y%m%d-%H%M%S")
    if against is not None:
        _trace_against(against, run_dir, passes, tolerance, seed, device)
        return
    paths = resolve_pair(pair, target, drafter)
    cfg = TraceConfig(
        num_draft=num_draft,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        num_prompts=prompts,
        concurrency=concurrency,
        seed=seed,
        device=device,
        dtype=dtype,
        draft_top_p=draft_top_p,
    )
    for w in workload:
        res = run_trace(paths, w, run_dir / "drafts", cfg, run_dir.name, progress=typer.echo)
        typer.echo(
            f"{paths.pair_id}/{w}: {res.rows} labeled drafts, acceptance {res.acceptance:.3f}, "
            f"slope {res.omega:.3f}, beta1 {res.beta1:.3f}, {res.seconds:.1f}s -> {res.drafts_path}"
        )
    if check:
        result = check_pair(paths, workload[0], cfg, trials=check)
        typer.echo(render_distribution_test(result))
        if not result.passed:
            raise AvbenchError("emitted tokens do not follow the target distribution (see above)")


def _trace_against(
    run: Path, out: Path, passes: int, tolerance: float | None, seed: int, device: str
) -> None:
    from avbench.estimator.live_vs_trace import TraceRunOptions, check_live_run, render_live_check

    if not (run / "manifest.json").is_file():
        raise AvbenchError(f"--against {run}: not a run directory (no manifest.json)")
    opts = TraceRunOptions(passes, tolerance, seed, device)
    res = check_live_run(run, out / "drafts", opts, typer.echo)
    typer.echo(render_live_check(res))
    if not res.passed:
        raise typer.Exit(1)


def _check_device(device: str, torch) -> None:
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise AvbenchError(f"--device {device!r}: not a torch device ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise AvbenchError(
            f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; use "
            "--device cpu"
        )


def lossless(
    pairs: int = typer.Option(500, help="Random (p, q) pairs per vocabulary size."),
    seed: int = typer.Option(0),
) -> None:
    """Show the worked example of docs/losslessness.md and the exact lossless check of every feature."""
    if pairs < 1:
        raise AvbenchError(f"--pairs: expected an integer >= 1, got {pairs}")
    check_non_negative(seed, "--seed")
    from avbench.estimator.lossless import check_features, render_check, render_worked_example

    typer.echo(render_worked_example())
    typer.echo("")
    typer.echo(render_check(check_features(n=pairs, seed=seed)))


def tables(
    runs: list[Path] = typer.Argument(..., help="Run directories or *.drafts.parquet files."),
    out: Path = typer.Option(Path("results/tables"), help="Where tables.md and the CSVs go."),
    bins: int = typer.Option(10, help="ECE bins (equal width)."),
    boot: int = typer.Option(200, help="Bootstrap replicates for predictor comparisons."),
    feature_mode: str = typer.Option(
        "exact",
        "--feature-mode",
        help="logit(q_max) as stored ('exact') or rounded as vLLM's float32 kernel does ('vllm').",
    ),
) -> None:
    """Regenerate every table of the study as markdown and CSV."""
    from avbench.estimator.tables import all_tables, load_inputs, write_tables

    if feature_mode not in ("exact", "vllm"):
        raise AvbenchError(f"--feature-mode: expected 'exact' or 'vllm', got {feature_mode!r}")
    if bins < 1 or boot < 0:
        raise AvbenchError(f"--bins must be >= 1 and --boot >= 0 (got {bins}, {boot})")
    inputs = load_inputs(runs)
    md = write_tables(
        all_tables(inputs, n_bins=bins, n_boot=boot, feature_mode=feature_mode), out, runs
    )
    typer.echo(md.read_text())
    typer.echo(f"wrote {md} and CSVs in {out}")


def register(app: typer.Typer) -> None:
    app.command("trace")(trace)
    app.command("lossless")(lossless)
    app.command("tables")(tables)
