"""What a plan costs before it runs: server starts, requests, an output-token bound, wall time.

Server starts: the runner starts one server per (repeat, arm) group of consecutive cells
(repeats interleave arms), for arms this vLLM supports. Requests count warmup ones too. The
output-token bound is requests x turns per conversation x max_tokens (a request may stop
early, never later). The wall-time estimate (from a previous run) prices each cell at that
run's measured seconds per request of the same arm, workload and load (falling back to the
same workload and load, then the same load, then the run's mean), and each server start at
that run's time outside its measured windows divided by its server starts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from avbench.inputs.workload import WorkloadSpec
from avbench.plan.cells import Cell
from avbench.workloads.registry import LOADERS


@dataclass(frozen=True)
class ArmWork:
    arm: str
    command: list[str] | None  # None when attached to a running server
    unsupported: str | None  # the reason, when this vLLM cannot run it
    cells: int
    requests: int
    server_starts: int


@dataclass(frozen=True)
class PlanWork:
    arms: list[ArmWork]
    requests: int
    max_output_tokens: int
    server_starts: int
    unknown_turns: list[str] = field(default_factory=list)  # workloads counted as one turn


def plan_work(
    cells: list[Cell],
    *,
    max_tokens: int,
    turns: dict[str, int | None],
    commands: dict[str, list[str] | None],
    unsupported: dict[str, str],
) -> PlanWork:
    """``turns[workload]``: most user turns of any conversation (None: unknown, counted as 1)."""
    starts: dict[str, int] = dict.fromkeys(commands, 0)
    for (_, arm), _group in itertools.groupby(cells, key=lambda c: (c.repeat, c.arm)):
        if arm not in unsupported:
            starts[arm] = starts.get(arm, 0) + 1
    arms = []
    for arm in dict.fromkeys(c.arm for c in cells):
        mine = [c for c in cells if c.arm == arm]
        runs = arm not in unsupported
        arms.append(
            ArmWork(
                arm=arm,
                command=commands.get(arm),
                unsupported=unsupported.get(arm),
                cells=len(mine),
                requests=sum(c.num_requests + c.warmup for c in mine) if runs else 0,
                server_starts=starts.get(arm, 0),
            )
        )
    run = [c for c in cells if c.arm not in unsupported]
    bound = sum((c.num_requests + c.warmup) * (turns.get(c.workload) or 1) for c in run)
    return PlanWork(
        arms=arms,
        requests=sum(a.requests for a in arms),
        max_output_tokens=bound * max_tokens,
        server_starts=sum(a.server_starts for a in arms),
        unknown_turns=sorted({c.workload for c in run if turns.get(c.workload) is None}),
    )


@dataclass(frozen=True)
class WallTime:
    seconds: float
    cells_priced: int  # priced from the same arm, workload and load
    cells_fallback: int  # priced from a coarser match
    server_start_s: float  # per start, from the previous run


@dataclass(frozen=True)
class PreviousRun:
    """A stored run whose measurements price a plan (`avbench plan --from`)."""

    root: Path
    cells: pd.DataFrame  # its finished cells, one row each
    wall_s: float | None  # from its start to its end; None when it did not record both


def estimate_wall_time(cells: list[Cell], work: PlanWork, previous: PreviousRun) -> WallTime:
    """Price the plan with a previous run's measurements (see the module docstring)."""
    prev_cells = previous.cells
    if prev_cells.empty or "window_s" not in prev_cells:
        raise ValueError("the previous run has no measured cells")
    prev = prev_cells.assign(
        spr=prev_cells["window_s"] / prev_cells["num_requests"].clip(lower=1),
        load=[_load(r) for r in prev_cells.to_dict("records")],
    )
    by_arm = prev.groupby(["arm", "workload", "load"])["spr"].mean().to_dict()
    by_workload = prev.groupby(["workload", "load"])["spr"].mean().to_dict()
    by_load = prev.groupby("load")["spr"].mean().to_dict()
    overall = float(prev["spr"].mean())
    unsupported = {a.arm for a in work.arms if a.unsupported}
    total = exact = coarse = 0
    for c in cells:
        if c.arm in unsupported:
            continue
        load = _load(c.__dict__)
        spr = by_arm.get((c.arm, c.workload, load))
        if spr is None:
            coarse += 1
            spr = by_workload.get((c.workload, load), by_load.get(load, overall))
        else:
            exact += 1
        total += (c.num_requests + c.warmup) * spr
    # Time the previous run spent outside measured cell time, per server start.
    prev_wall = previous.wall_s
    prev_in_cells = float(((prev["num_requests"] + prev["warmup"].fillna(0)) * prev["spr"]).sum())
    prev_starts = prev.groupby(["repeat", "arm"]).ngroups or 1
    per_start = max(0.0, (prev_wall or prev_in_cells) - prev_in_cells) / prev_starts
    return WallTime(total + per_start * work.server_starts, exact, coarse, per_start)


def price(cells: list[Cell], work: PlanWork, previous: PreviousRun) -> float:
    """Seconds for ``cells`` measured as one resume (its own server starts), priced by a
    previous run; ``work`` gives each arm's command and whether it runs here."""
    part = plan_work(
        cells,
        max_tokens=0,  # only the server starts count here, not the token bound
        turns={},
        commands={a.arm: a.command for a in work.arms},
        unsupported={a.arm: a.unsupported for a in work.arms if a.unsupported},
    )
    return estimate_wall_time(cells, part, previous).seconds


def workload_turns(specs: dict[str, WorkloadSpec], names: list[str]) -> dict[str, int | None]:
    """The most turns of a conversation per workload; None where it cannot be loaded here."""
    turns: dict[str, int | None] = {}
    for w in names:
        spec = specs[w]
        try:
            turns[w] = max(len(c.turns) for c in LOADERS[spec.dataset].load(spec).conversations)
        except Exception:  # not available here: the bound counts one turn and says so
            turns[w] = None
    return turns


def _load(row: dict) -> str:
    rate = row.get("rate")
    if rate is not None and not pd.isna(rate):
        return f"r{float(rate):g}"
    return f"c{int(row['concurrency'])}"


def format_duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
