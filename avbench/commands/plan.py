"""`avbench plan`: the cells a sweep would run, each arm's server command and the work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from avbench.commands.listing import JsonOpt, print_json, print_table
from avbench.commands.request import (
    RATES_HELP,
    IntList,
    NameList,
    RateList,
    Request,
    Suites,
    VllmPython,
    command,
)
from avbench.errors import AvbenchError

if TYPE_CHECKING:
    from rich.console import Console

    from avbench.commands.resolve import Resolved
    from avbench.plan.cells import Cell
    from avbench.plan.cost import PlanWork, PreviousRun


class PlanRequest(Request):
    pair: Annotated[str, typer.Option("--pair", help="Pair id (see `avbench pairs`)")]
    sweep: Annotated[str | None, typer.Option("--sweep", help="Sweep id (default: the pair's)")] = (
        None
    )
    suites: Suites = None
    workloads: Annotated[NameList, typer.Option(help="Comma-separated workload ids")] = None
    concurrencies: Annotated[IntList, typer.Option(help="e.g. 1,4,16")] = None
    rates: Annotated[RateList, typer.Option(help=RATES_HELP)] = None
    k_values: Annotated[IntList, typer.Option("--k", help="Static K list, e.g. 1,3")] = None
    from_run: Annotated[
        Path | None,
        typer.Option("--from", help="Previous run whose measured speed prices the wall time"),
    ] = None
    adaptive: Annotated[
        bool,
        typer.Option(
            "--adaptive",
            help="Also print what `avbench sweep --adaptive` would measure: its first round, its "
            "ceiling and, with --from, the rounds replayed on that run",
        ),
    ] = False
    vllm_python: VllmPython = None  # type: ignore[assignment]
    as_json: Annotated[bool, JsonOpt] = False


@dataclass(frozen=True)
class PlanView:
    """What the second half of `avbench plan` prints from."""

    resolved: Resolved
    cells: list[Cell]
    python: str
    from_run: Path | None
    adaptive: bool = False


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


@command(PlanRequest)
def plan(req: PlanRequest) -> None:
    """Print the cells a sweep would run, each arm's server command and the work, without
    running them."""
    from rich.console import Console

    from avbench.commands.resolve import load_update, resolve
    from avbench.plan.cells import arms_for, build_plan

    update = load_update(req.workloads, req.concurrencies, req.rates, req.k_values)
    got = resolve(req.suites, req.pair, req.sweep, update)
    cells = build_plan(got.pair, got.sweep)
    arm_names = [a.name for a in arms_for(got.pair, got.sweep)]
    if req.as_json:
        print_json(
            {
                "pair": got.pair.name,
                "sweep": got.sweep.name,
                "arms": arm_names,
                "sampling": got.sweep.sampling.model_dump(mode="json"),
                "cells": [c.to_dict() for c in cells],
            }
        )
        return
    _print_cells(got, cells, arm_names)
    view = PlanView(got, cells, req.vllm_python, req.from_run, req.adaptive)
    print_plan_work(Console(highlight=False, soft_wrap=True), view)


def _print_cells(got: Resolved, cells: list[Cell], arm_names: list[str]) -> None:
    from rich.console import Console

    p, s = got.pair, got.sweep
    rows = []
    for i, c in enumerate(cells):
        load = f"c={c.concurrency}" if c.rate is None else f"{c.rate:g} req/s"
        rows.append(
            [str(i), c.arm, c.workload, load, str(c.num_requests), str(c.warmup), str(c.repeat)]
        )
    print_table(
        f"plan: pair {p.name}, sweep {s.name}: {len(cells)} cells, arms {', '.join(arm_names)}",
        ("#", "arm", "workload", "load", "requests", "warmup", "repeat"),
        rows,
        ids=("arm", "workload"),
    )
    smp = s.sampling
    Console().print(
        f"sampling: temperature {smp.temperature}, top_p {smp.top_p}, max_tokens {smp.max_tokens}"
        f", ignore_eos {smp.ignore_eos}"
    )
    if s.sequential is not None:
        q = s.sequential
        Console().print(
            f"sequential cells: each runs until the 95% intervals of {' and '.join(q.metrics)} "
            f"are within ±{q.target:.1%}, or {q.max_requests} requests, or {q.max_time_s:g} s: "
            "the requests and work shown are ceilings",
            highlight=False,
        )


def print_plan_work(console: Console, view: PlanView) -> None:
    """`avbench plan`'s second half: each arm's server command, then the work and its time."""
    import shlex

    from avbench.checks.runnable import arm_commands
    from avbench.inputs import checkpoints
    from avbench.plan.cost import plan_work, workload_turns

    pair, sweep = view.resolved.pair, view.resolved.sweep
    runnable = arm_commands(
        pair, sweep, list(dict.fromkeys(c.arm for c in view.cells)), view.python
    )
    work = plan_work(
        view.cells,
        max_tokens=sweep.sampling.max_tokens,
        turns=workload_turns(view.resolved.suite.workloads, sweep.workloads),
        commands=runnable.commands,
        unsupported=runnable.unsupported,
    )
    console.print("server command per arm (port chosen at run time):")
    for a in work.arms:
        note = f"  [unsupported here, not started: {a.unsupported}]" if a.unsupported else ""
        console.print(f"  {a.arm}: {shlex.join(a.command or [])}{note}", markup=False)
    for role, ref in (("target", pair.target), ("drafter", pair.drafter)):
        line = checkpoints.describe(role, ref)
        if line:
            console.print(f"  {line}", markup=False)
    unknown = (
        f" (counting one turn for {', '.join(work.unknown_turns)}: not available here)"
        if work.unknown_turns
        else ""
    )
    console.print(
        f"work: {work.requests:,} requests (warmup included), at most "
        f"{work.max_output_tokens:,} output tokens{unknown}, {work.server_starts} server starts",
        markup=False,
    )
    prev = _read_prev(view.from_run) if view.from_run is not None else None
    if prev is not None:
        _print_wall_time(console, view.cells, work, prev)
    if view.adaptive:
        _print_adaptive(console, view, work, prev)


def _read_prev(root: Path) -> PreviousRun:
    """The --from run, read once: what prices the plan and what the adaptive replay runs on."""
    from avbench.plan.cost import PreviousRun
    from avbench.store.run_store import RunStore

    store = RunStore.open(root)
    return PreviousRun(store.root, store.cells_frame(), store.read_manifest().wall_s)


def _print_wall_time(
    console: Console, cells: list[Cell], work: PlanWork, prev: PreviousRun
) -> None:
    from avbench.plan.cost import estimate_wall_time, format_duration

    try:
        est = estimate_wall_time(cells, work, prev)
    except ValueError as exc:
        raise AvbenchError(f"--from {prev.root}: {exc}") from None
    console.print(
        f"estimated wall time: {format_duration(est.seconds)} from run {prev.root.name} "
        f"({est.cells_priced} cells priced from the same cell, {est.cells_fallback} from a "
        f"coarser match; {format_duration(est.server_start_s)} per server start)",
        markup=False,
    )


def _print_adaptive(
    console: Console, view: PlanView, work: PlanWork, prev: PreviousRun | None
) -> None:
    """The adaptive sweep's first round and ceiling; with --from, its rounds replayed there."""
    from avbench.plan.cost import format_duration
    from avbench.run.adaptive import forecast

    pair, sweep = view.resolved.pair, view.resolved.sweep
    ahead = forecast(pair, sweep, view.cells, work, prev)
    first = ahead.first
    console.print(
        f"--adaptive: the first round measures {len(first)} cells "
        f"({', '.join(dict.fromkeys(c.arm for c in first))}, one repeat, step timings and drafts "
        f"captured); later rounds only the cells an undecided verdict wants: between "
        f"{len(first)} and {ahead.ceiling} cells in all (docs/adaptive.md)",
        markup=False,
    )
    r = ahead.replayed
    if prev is None or r is None:
        return
    console.print(
        f"--adaptive replayed on run {prev.root.name} (its measured throughput taken as "
        f"each prediction): {r.cells} cells in {r.rounds} round(s), about "
        f"{format_duration(r.seconds)}, against the fixed protocol's {len(view.cells)} cells, "
        f"about {format_duration(r.fixed_seconds)} ({r.seconds / r.fixed_seconds:.2f}x)",
        markup=False,
    )
