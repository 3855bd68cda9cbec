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
    import pandas as pd
    from rich.console import Console

    from avbench.analysis.adaptive import Wanted
    from avbench.commands.resolve import Resolved
    from avbench.plan.cells import Arm, Cell
    from avbench.plan.cost import PlanWork
    from avbench.store.artefacts import RunManifest


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

    from avbench.inputs import checkpoints

    work = _plan_work(view)
    pair = view.resolved.pair
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


def _plan_work(view: PlanView) -> PlanWork:
    """Each arm's server command (and why this vLLM cannot run it), and the work."""
    from avbench.errors import UnsupportedArm
    from avbench.plan.cells import Arm
    from avbench.plan.cost import plan_work
    from avbench.serving.server import build_command, check_arm_supported, probe_vllm

    pair, sweep = view.resolved.pair, view.resolved.sweep
    try:
        install = probe_vllm(view.python)
    except AvbenchError:
        install = None
    commands: dict[str, list[str] | None] = {}
    unsupported: dict[str, str] = {}
    av: list[Arm] = []
    for name in dict.fromkeys(c.arm for c in view.cells):
        arm = Arm.parse(name)
        commands[name] = build_command(pair, arm, port=8000, python=view.python, sweep=sweep)
        if install is not None and install.distribution is not None:
            try:
                check_arm_supported(pair, arm, install)
                av += [arm] if arm.kind == "av" else []
            except UnsupportedArm as exc:
                unsupported[name] = str(exc)
    if av and install is not None:
        unsupported |= _refused_at_start(view, av, f"{install.distribution} {install.version}")
    return plan_work(
        view.cells,
        max_tokens=sweep.sampling.max_tokens,
        turns=_turns(view.resolved),
        commands=commands,
        unsupported=unsupported,
    )


def _refused_at_start(view: PlanView, av: list[Arm], vllm: str) -> dict[str, str]:
    """AV arms this vLLM would refuse at start, by its own start-up checks (none loads a
    model: avbench.checks.av_start): arm -> reason. Checks that cannot run say nothing."""
    from avbench.checks.av_start import av_start_checks

    pair, sweep = view.resolved.pair, view.resolved.sweep
    try:
        found = av_start_checks([(pair, arm, sweep) for arm in av], view.python)
    except AvbenchError:
        return {}
    return {r.arm: reason for r in found if (reason := r.reason(vllm)) is not None}


def _turns(got: Resolved) -> dict[str, int | None]:
    """The most turns of a conversation per workload; None where it cannot be loaded here."""
    from avbench.workloads.registry import LOADERS

    turns: dict[str, int | None] = {}
    for w in got.sweep.workloads:
        spec = got.suite.workloads[w]
        try:
            turns[w] = max(len(c.turns) for c in LOADERS[spec.dataset].load(spec).conversations)
        except Exception:  # not available here: the bound counts one turn and says so
            turns[w] = None
    return turns


@dataclass(frozen=True)
class _PrevRun:
    """The --from run, read once: what prices the plan and what the adaptive replay runs on."""

    root: Path
    cells: pd.DataFrame
    manifest: RunManifest


def _read_prev(root: Path) -> _PrevRun:
    from avbench.store.run_store import RunStore

    store = RunStore.open(root)
    return _PrevRun(store.root, store.cells_frame(), store.read_manifest())


def _print_wall_time(console: Console, cells: list[Cell], work: PlanWork, prev: _PrevRun) -> None:
    from avbench.plan.cost import estimate_wall_time, format_duration

    try:
        est = estimate_wall_time(cells, work, prev.cells, prev.manifest)
    except ValueError as exc:
        raise AvbenchError(f"--from {prev.root}: {exc}") from None
    console.print(
        f"estimated wall time: {format_duration(est.seconds)} from run {prev.root.name} "
        f"({est.cells_priced} cells priced from the same cell, {est.cells_fallback} from a "
        f"coarser match; {format_duration(est.server_start_s)} per server start)",
        markup=False,
    )


def _price(cells: list[Cell], work: PlanWork, prev: _PrevRun) -> float:
    """Seconds for ``cells`` measured as one resume (its own server starts), priced by --from."""
    from avbench.plan.cost import estimate_wall_time, plan_work

    part = plan_work(
        cells,
        max_tokens=0,  # only the server starts count here, not the token bound
        turns={},
        commands={a.arm: a.command for a in work.arms},
        unsupported={a.arm: a.unsupported for a in work.arms if a.unsupported},
    )
    return estimate_wall_time(cells, part, prev.cells, prev.manifest).seconds


def _print_adaptive(
    console: Console, view: PlanView, work: PlanWork, prev: _PrevRun | None
) -> None:
    """The adaptive sweep's first round and ceiling; with --from, its rounds replayed there."""
    from avbench.analysis.adaptive import OPTION_KINDS
    from avbench.plan.cells import Arm, build_plan
    from avbench.run.adaptive import cells_for, first_round

    pair, sweep = view.resolved.pair, view.resolved.sweep
    first = build_plan(pair, first_round(pair, sweep))
    unsupported = {a.arm for a in work.arms if a.unsupported}
    # The rounds measure the options a verdict picks from (no dyn arm), and what runs here.
    runnable = [
        c for c in view.cells if c.arm not in unsupported and Arm.parse(c.arm).kind in OPTION_KINDS
    ]
    console.print(
        f"--adaptive: the first round measures {len(first)} cells "
        f"({', '.join(dict.fromkeys(c.arm for c in first))}, one repeat, step timings and drafts "
        f"captured); later rounds only the cells an undecided verdict wants: between "
        f"{len(first)} and {len(runnable)} cells in all (docs/adaptive.md)",
        markup=False,
    )
    if prev is None:
        return
    from avbench.plan.cost import format_duration

    rounds = _replayed_rounds(view, prev, {c.arm for c in first})
    later = [cells_for(list(w), pair, sweep) for w in rounds]
    cells = len(first) + sum(len(r) for r in later)
    seconds = sum(_price(r, work, prev) for r in [first, *later])
    fixed = _price(view.cells, work, prev)
    console.print(
        f"--adaptive replayed on run {prev.root.name} (its measured throughput taken as "
        f"each prediction): {cells} cells in {1 + len(rounds)} round(s), about "
        f"{format_duration(seconds)}, against the fixed protocol's {len(view.cells)} cells, about "
        f"{format_duration(fixed)} ({seconds / fixed:.2f}x)",
        markup=False,
    )


def _replayed_rounds(view: PlanView, prev: _PrevRun, first: set[str]) -> list[tuple[Wanted, ...]]:
    from avbench.analysis.adaptive import Uncertainty, replay
    from avbench.analysis.points import POOLED, build_points

    frame = prev.cells
    points = build_points(frame[frame["arm"].isin({c.arm for c in view.cells})])
    pooled = points[points["workload"] == POOLED]
    missing = first - set(pooled["arm"])
    if missing:
        raise AvbenchError(
            f"--from {prev.root}: no measured {', '.join(sorted(missing))}: the adaptive "
            "replay needs the arms of its first round"
        )
    return replay(pooled, first, Uncertainty(), view.resolved.sweep.repeats)
