"""`avbench pairs | plan | sweep | report`: thin wrappers over suite, plan, runner and report."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from avbench.errors import AvbenchError

SuitesOpt = Annotated[
    Path | None,
    typer.Option("--suites", help="Suite directory (default: ./suites or $AVBENCH_SUITES)"),
]


def register(app: typer.Typer) -> None:
    app.command("pairs")(pairs)
    app.command("plan")(plan)
    app.command("sweep")(sweep)
    app.command("report")(report)


def pairs(suites: SuitesOpt = None) -> None:
    """List the model pairs defined in the suite files."""
    from rich.console import Console
    from rich.table import Table

    from avbench.suite import load_suite

    suite = load_suite(suites)
    t = Table(title=f"pairs ({suite.root / 'pairs.toml'})")
    for col in ("pair", "target", "drafter", "method", "max K", "GPUs", "description"):
        t.add_column(col)
    for p in suite.pairs.values():
        t.add_row(
            p.name,
            p.target,
            p.drafter or "(in target)",
            p.method,
            str(p.max_k),
            str(p.gpus_per_server),
            p.description,
        )
    Console().print(t)


def _resolve(suites, pair_name, sweep_name, overrides):
    """Load the suite, pick pair and sweep, apply CLI overrides with the same validation."""
    from pydantic import ValidationError

    from avbench.suite import Sweep, load_suite

    suite = load_suite(suites)
    pair = suite.pair(pair_name)
    sweep = suite.sweep(sweep_name or pair.default_sweep)
    data = sweep.model_dump()
    sampling = {k: v for k, v in overrides.pop("sampling", {}).items() if v is not None}
    data["sampling"] |= sampling
    data |= {k: v for k, v in overrides.items() if v is not None}
    try:
        sweep = Sweep.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise AvbenchError(f"command-line override {loc}: {err['msg']}") from None
    for w in sweep.workloads:
        suite.workload(w)
    return suite, pair, sweep


def _csv_ints(v: str | None) -> list[int] | None:
    if v is None:
        return None
    try:
        return [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        raise AvbenchError(f"expected a comma-separated list of integers, got {v!r}") from None


def plan(
    pair: Annotated[str, typer.Option("--pair", help="Pair id (see `avbench pairs`)")],
    sweep: Annotated[
        str | None, typer.Option("--sweep", help="Sweep id (default: the pair's)")
    ] = None,
    suites: SuitesOpt = None,
    workloads: Annotated[str | None, typer.Option(help="Comma-separated workload ids")] = None,
    concurrencies: Annotated[str | None, typer.Option(help="e.g. 1,4,16")] = None,
    k_values: Annotated[str | None, typer.Option("--k", help="Static K list, e.g. 1,3")] = None,
) -> None:
    """Print the cells a sweep would run, without running them."""
    from rich.console import Console
    from rich.table import Table

    from avbench.plan import arms_for, build_plan

    overrides = {
        "workloads": workloads.split(",") if workloads else None,
        "concurrencies": _csv_ints(concurrencies),
        "k_values": _csv_ints(k_values),
    }
    _, p, s = _resolve(suites, pair, sweep, overrides)
    cells = build_plan(p, s)
    t = Table(
        title=f"plan: pair {p.name}, sweep {s.name}: {len(cells)} cells, arms "
        + ", ".join(a.name for a in arms_for(p, s))
    )
    for col in ("#", "arm", "workload", "load", "requests", "warmup", "repeat"):
        t.add_column(col)
    for i, c in enumerate(cells):
        load = f"c={c.concurrency}" if c.rate is None else f"{c.rate:g} req/s"
        t.add_row(
            str(i), c.arm, c.workload, load, str(c.num_requests), str(c.warmup), str(c.repeat)
        )
    Console().print(t)
    smp = s.sampling
    Console().print(
        f"sampling: temperature {smp.temperature}, top_p {smp.top_p}, max_tokens {smp.max_tokens}"
        f", ignore_eos {smp.ignore_eos}"
    )


def sweep(
    pair: Annotated[
        str | None, typer.Option("--pair", help="Pair id (see `avbench pairs`)")
    ] = None,
    sweep: Annotated[
        str | None, typer.Option("--sweep", help="Sweep id (default: the pair's)")
    ] = None,
    suites: SuitesOpt = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Run directory to complete")
    ] = None,
    results: Annotated[Path, typer.Option("--results", help="Results directory")] = Path("results"),
    run_id: Annotated[str | None, typer.Option("--run-id")] = None,
    port: Annotated[int, typer.Option(help="Port for the launched vLLM server")] = 8000,
    endpoint: Annotated[
        str | None, typer.Option(help="Attach to a running server (http://host:port) instead")
    ] = None,
    arm: Annotated[
        str, typer.Option(help="With --endpoint: what the server runs (baseline, static-k3, av-k8)")
    ] = "",
    gpus: Annotated[
        int | None, typer.Option(help="With --endpoint: GPUs behind the server")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", help="API key (or OPENAI_API_KEY); never stored")
    ] = None,
    workloads: Annotated[str | None, typer.Option(help="Comma-separated workload ids")] = None,
    concurrencies: Annotated[str | None, typer.Option(help="e.g. 1,4,16")] = None,
    k_values: Annotated[str | None, typer.Option("--k", help="Static K list, e.g. 1,3")] = None,
    arms: Annotated[
        str | None, typer.Option(help="Arm kinds to run, e.g. baseline,static,av")
    ] = None,
    warmup: Annotated[int | None, typer.Option(help="Warmup conversations per cell")] = None,
    requests: Annotated[
        int | None, typer.Option(help="Minimum measured conversations per cell")
    ] = None,
    temperature: Annotated[float | None, typer.Option()] = None,
    top_p: Annotated[float | None, typer.Option("--top-p")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens")] = None,
    ready_timeout: Annotated[float | None, typer.Option(help="Seconds to wait for /health")] = None,
    vllm_python: Annotated[
        str | None, typer.Option(help="Python interpreter that has vLLM (default: this one)")
    ] = None,
    report: Annotated[bool, typer.Option(help="Write the HTML report at the end")] = True,
) -> None:
    """Launch vLLM per arm (baseline, static K, AV) and measure every cell of the sweep."""
    from pydantic import SecretStr

    from avbench.plan import Arm
    from avbench.progress import RichReporter, make_console, summary_table
    from avbench.runner import SweepOptions, resume_sweep, start_sweep

    key = api_key or os.environ.get("OPENAI_API_KEY")
    secret = SecretStr(key) if key else None
    python = vllm_python or os.environ.get("AVBENCH_VLLM_PYTHON") or sys.executable
    console = make_console()
    reporter = RichReporter(console)
    try:
        if resume is not None:
            outcome = resume_sweep(
                resume,
                {
                    "api_key": secret,
                    "vllm_python": python,
                    "port": port,
                    "ready_timeout_s": ready_timeout,
                },
                reporter,
            )
        else:
            if pair is None:
                raise AvbenchError("--pair is required (or --resume RUN); see `avbench pairs`")
            overrides = {
                "workloads": workloads.split(",") if workloads else None,
                "concurrencies": _csv_ints(concurrencies),
                "k_values": _csv_ints(k_values),
                "arms": arms.split(",") if arms else None,
                "warmup": warmup,
                "min_requests": requests,
                "requests_per_concurrency": 1 if requests else None,
                "sampling": {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens},
            }
            suite, p, s = _resolve(suites, pair, sweep, overrides)
            if k_values:
                p = p.model_copy(update={"k_values": s.k_values})
            attach_arm = None
            if endpoint:
                try:
                    attach_arm = Arm.parse(arm or f"static-k{p.max_k}")
                except ValueError as exc:
                    raise AvbenchError(f"--arm: {exc}") from None
            opts = SweepOptions(
                pair=p,
                sweep=s,
                workloads=suite.workloads,
                results_dir=results,
                run_id=run_id,
                port=port,
                endpoint=endpoint,
                attach_arm=attach_arm,
                attach_gpus=gpus,
                api_key=secret,
                vllm_python=python,
                ready_timeout_s=ready_timeout,
            )
            outcome = start_sweep(opts, reporter)
    except KeyboardInterrupt:
        reporter.close()
        console.print(
            "[yellow]interrupted[/]: servers stopped; finish the run with --resume RUN_DIR"
        )
        raise typer.Exit(130) from None
    rows = list(outcome.store.finished_cells().values())
    console.print(summary_table(rows))
    if report and rows:
        from avbench.report import write_report

        html = write_report(outcome.store)
        console.print(f"report: {html}")
    console.print(
        f"run {outcome.store.root}: {len(outcome.finished)} cells measured, {outcome.skipped} already "
        f"done, {len(outcome.failed)} failed"
    )
    by_reason: dict[str, list[str]] = {}
    for f in outcome.failed:
        by_reason.setdefault(f["reason"].splitlines()[0], []).append(f["cell_id"])
    for reason, ids in by_reason.items():
        console.print(f"  {len(ids)} cell(s) not measured: {reason}", highlight=False)
    if not rows:
        raise typer.Exit(1)


def report(
    run: Annotated[Path, typer.Argument(help="Run directory (results/<run-id>)")],
    out: Annotated[Path | None, typer.Option(help="HTML file (default: RUN/report.html)")] = None,
) -> None:
    """Write the HTML report of a run: throughput per GPU vs interactivity, one trace per arm."""
    from avbench.report import write_report
    from avbench.store import RunStore

    path = write_report(RunStore.open(run), out)
    typer.echo(str(path))
