"""`avbench trace`: labeled drafts generated offline with a real target + drafter (issue 4).

Thin: the request is checked once, then avbench.estimator does the work; torch and
transformers are imported inside the command.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import field_validator, model_validator

from avbench.commands.request import Request, Suites, command
from avbench.errors import AvbenchError

if TYPE_CHECKING:
    from avbench.estimator.trace import TraceConfig

Opt = typer.Option


class TraceRequest(Request):
    pair: Annotated[
        str,
        Opt(help="Pair id of the suite (see `avbench pairs`) or a label for --target/--drafter."),
    ] = "tiny-cpu"
    workload: Annotated[
        list[str], Opt("--workload", "-w", help="Workload id; repeat for several.")
    ] = ["gsm8k"]
    target: Annotated[Path | None, Opt(help="Target model dir (Hugging Face format).")] = None
    drafter: Annotated[Path | None, Opt(help="Drafter model dir (Hugging Face format).")] = None
    out: Annotated[Path | None, Opt(help="Run directory; default results/trace-<time>.")] = None
    num_draft: Annotated[int, Opt("-k", "--num-draft", help="Draft tokens per step (K).")] = 4
    temperature: Annotated[float, Opt(help="Sampling temperature (0 = greedy).")] = 1.0
    top_p: Annotated[float, Opt(help="Top-p for drafter and target.")] = 0.95
    prompts: Annotated[int, Opt(help="Prompts per workload (file order).")] = 16
    max_new_tokens: Annotated[int, Opt(help="Tokens generated per prompt.")] = 64
    concurrency: Annotated[int, Opt(help="Requests decoded as one batch (one engine step).")] = 4
    seed: Annotated[int, Opt()] = 0
    device: Annotated[str, Opt(help="torch device, e.g. cpu or cuda.")] = "cpu"
    dtype: Annotated[str, Opt(help="Model weight dtype (float32, bfloat16, auto).")] = "float32"
    threads: Annotated[int, Opt(help="torch CPU threads (small models are fastest on one).")] = 1
    check: Annotated[
        int,
        Opt(
            help="Also test (chi-square, alpha 0.01) with this many runs that emitted tokens follow the target."
        ),
    ] = 0
    draft_top_p: Annotated[
        bool,
        Opt(
            help="Cut the drafter's distribution by top-p too (vLLM does not: its drafts and q "
            "are the temperature softmax)."
        ),
    ] = False
    against: Annotated[
        Path | None,
        Opt(
            help="A live sweep run: trace its pair on its cells' prompts with its sampling and K, "
            "and compare per-position acceptance (exit 1 on a mismatch)."
        ),
    ] = None
    passes: Annotated[int, Opt(help="With --against: trace each prompt this many times.")] = 1
    tolerance: Annotated[
        float | None,
        Opt(
            help="With --against: allowed |live - offline| per position (default: 4 standard "
            "errors of the difference)."
        ),
    ] = None
    suites: Suites = None

    @field_validator("seed", "check")
    @classmethod
    def _non_negative(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"expected an integer >= 0, got {v}")
        return v

    @field_validator("num_draft", "prompts", "max_new_tokens", "concurrency", "threads")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"expected an integer >= 1, got {v}")
        return v

    @model_validator(mode="after")
    def _out_is_a_directory(self) -> TraceRequest:
        if self.out is not None and self.out.exists() and not self.out.is_dir():
            raise ValueError(f"--out {self.out}: is a file, expected a run directory")
        return self

    def config(self) -> TraceConfig:
        from avbench.estimator.trace import TraceConfig

        return TraceConfig(
            num_draft=self.num_draft,
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            num_prompts=self.prompts,
            concurrency=self.concurrency,
            seed=self.seed,
            device=self.device,
            dtype=self.dtype,
            draft_top_p=self.draft_top_p,
        )


def register(app: typer.Typer) -> None:
    app.command("trace")(trace)


@command(TraceRequest)
def trace(req: TraceRequest) -> None:
    """Generate labeled drafts offline with a real target + drafter (transformers)."""
    import torch

    from avbench.estimator.trace import (
        check_pair,
        render_distribution_test,
        resolve_pair,
        run_trace,
    )

    _check_device(req.device, torch)
    torch.set_num_threads(max(1, req.threads))
    run_dir = req.out or Path("results") / time.strftime("trace-%Y%m%d-%H%M%S")
    if req.against is not None:
        _trace_against(req, run_dir)
        return
    paths = resolve_pair(req.pair, req.target, req.drafter, req.suites)
    cfg = req.config()
    for w in req.workload:
        res = run_trace(paths, w, run_dir / "drafts", cfg, run_dir.name, progress=typer.echo)
        typer.echo(
            f"{paths.pair_id}/{w}: {res.rows} labeled drafts, acceptance {res.acceptance:.3f}, "
            f"slope {res.omega:.3f}, beta1 {res.beta1:.3f}, {res.seconds:.1f}s -> {res.drafts_path}"
        )
    if req.check:
        result = check_pair(paths, req.workload[0], cfg, trials=req.check)
        typer.echo(render_distribution_test(result))
        if not result.passed:
            raise AvbenchError("emitted tokens do not follow the target distribution (see above)")


def _trace_against(req: TraceRequest, out: Path) -> None:
    from avbench.run.live_check import TraceRunOptions, check_live_run, render_live_check

    run = req.against
    assert run is not None
    if not (run / "manifest.json").is_file():
        raise AvbenchError(f"--against {run}: not a run directory (no manifest.json)")
    opts = TraceRunOptions(req.passes, req.tolerance, req.seed, req.device)
    res = check_live_run(run, out / "drafts", opts, typer.echo)
    typer.echo(render_live_check(res))
    if not res.passed:
        raise typer.Exit(1)


def _check_device(device: str, torch: Any) -> None:
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise AvbenchError(f"--device {device!r}: not a torch device ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise AvbenchError(
            f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; use "
            "--device cpu"
        )
