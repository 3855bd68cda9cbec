"""The decision-driven sweep (``avbench sweep --adaptive``): measure only what a verdict hinges on.

Round 0 measures the baseline and the max-K static arm (AV off, with step timings and drafts
captured) at every workload and concurrency of the sweep, one repeat. Each later round
predicts the sweep's other static arms (and AV where this vLLM runs it) from the max-K arm's
captures, takes each concurrency's standing (analysis/adaptive.py) and measures the cells the
undecided ones want: a predicted contender at repeat 0, or one more repeat of measured ones.
The sweep stops when every verdict is decided or inside noise, or when the budget (cells or
server-seconds) would be exceeded by the next round. On request (``--complete``) a finished run
then measures every cell of the requested sweep the rounds left out: the fixed protocol's
verdicts on the same measurements, beside the rounds' own.

Everything is one run directory: the manifest's plan grows by each round's cells and the
runner measures them as a resume would, so a crash loses nothing and ``--resume`` continues;
``adaptive.json`` (the store's AdaptiveRecord) holds the policy and every round's standings.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd

from avbench.analysis.adaptive import OPTION_KINDS, Standing, Uncertainty, Wanted, replay, standings
from avbench.analysis.points import POOLED, build_points
from avbench.errors import AvbenchError, StoreError
from avbench.inputs.suite import Pair, Sweep
from avbench.plan.cells import Arm, Cell, arms_for, build_plan
from avbench.plan.cost import PlanWork, PreviousRun, price
from avbench.run.progress import SweepReporter
from avbench.run.runner import SweepOptions, SweepOutcome, resume_sweep, start_sweep
from avbench.serving.server import VllmInstall, probe_vllm
from avbench.store.artefacts import ADAPTIVE, AdaptiveRecord, SweepManifest
from avbench.store.run_store import RunStore, read_adaptive, write_adaptive


class AdaptiveStopped(AvbenchError):
    """The adaptive sweep cannot go on (its measurements are kept in the run)."""

    exit_code = 1


@dataclass(frozen=True)
class AdaptivePolicy:
    uncertainty: Uncertainty = Uncertainty()
    max_repeats: int | None = None  # None: the sweep's repeats
    budget_cells: int | None = None
    budget_s: float | None = None  # server-seconds: wall time of the rounds, one server at a time

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> AdaptivePolicy:
        return cls(**(d | {"uncertainty": Uncertainty(**d["uncertainty"])}))


@dataclass
class AdaptiveState:
    """What adaptive.json holds: the full sweep the rounds draw cells from, and the rounds."""

    policy: AdaptivePolicy
    sweep: dict  # the requested sweep (its arms, K values and repeats bound the rounds)
    rounds: list[dict] = field(default_factory=list)
    status: str = "running"  # running, decided, inside noise, budget, failed
    completion: dict | None = None  # the store's AdaptiveCompletion, once --complete started

    @property
    def seconds(self) -> float:
        return sum(r.get("seconds", 0.0) for r in self.rounds)

    @property
    def cells(self) -> int:
        return sum(len(r.get("cells", [])) for r in self.rounds)

    def write(self, root: Path) -> None:
        """Into the run's ``adaptive.json`` (the store's AdaptiveRecord)."""
        record = AdaptiveRecord.model_validate(
            {
                "policy": self.policy.to_dict(),
                "sweep": self.sweep,
                "rounds": self.rounds,
                "status": self.status,
                "server_seconds": self.seconds,
            }
            | ({"completion": self.completion} if self.completion is not None else {})
        )
        write_adaptive(root, record)

    @classmethod
    def read(cls, root: Path) -> AdaptiveState:
        try:
            record = read_adaptive(root)
        except StoreError as exc:
            raise AdaptiveStopped(str(exc)) from None
        if record is None:
            raise AdaptiveStopped(f"{root}: not an adaptive run (no {ADAPTIVE})")
        try:
            policy = AdaptivePolicy.from_dict(record.policy)
        except (KeyError, TypeError) as exc:
            raise AdaptiveStopped(
                f"{root / ADAPTIVE}: not an adaptive state file (policy: {exc})"
            ) from None
        rounds = [r.model_dump(mode="json", exclude_unset=True) for r in record.rounds]
        completion = record.completion.model_dump(mode="json") if record.completion else None
        return cls(policy, record.sweep, rounds, record.status, completion)


def first_round(pair: Pair, sweep: Sweep) -> Sweep:
    """The baseline and the max-K static arm, one repeat, step timings and drafts captured."""
    k = (
        max(a.k for a in arms_for(pair, sweep) if a.kind == "static")
        if "static" in sweep.arms
        else pair.max_k
    )
    capture = sorted({*sweep.capture, "steps", "drafts"})
    # Validated, not model_copy'd: the manifest it goes into is validated when read back.
    # The static arm drafts as the sweep's arms do (draft_method: probabilistic when the sweep
    # has an AV arm), since it stands for AV's OFF twin: dropping "av" from the arms must not
    # drop that, or it would draft greedily and V2's drafts capture, which needs
    # probabilistic drafts, would switch itself off (AV then predicted from nothing).
    return Sweep.model_validate(
        sweep.model_dump()
        | {"arms": ["baseline", "static"], "k_values": [k], "static_k": "max", "schedule": None,
           "repeats": 1, "capture": capture, "draft_fraction": 1.0,
           "draft_sample_method": sweep.draft_method}
    )  # fmt: skip


def _max_k_arm(pair: Pair, sweep: Sweep) -> Arm:
    return next(a for a in arms_for(pair, first_round(pair, sweep)) if a.kind == "static")


def _targets(pair: Pair, sweep: Sweep, source: Arm, av_runs: bool) -> tuple[str, ...]:
    """The arms to predict: the sweep's static K below the source's, and AV where it runs."""
    arms = arms_for(pair, sweep)
    out = [a.name for a in arms if a.kind == "static" and a.k < source.k]
    if av_runs and any(a.kind == "av" for a in arms):
        out.append("av")
    return tuple(out)


def _points(store: RunStore) -> pd.DataFrame:
    """Pooled points of the measured cells and, for arm × load not measured, the predicted."""
    from avbench.predict.predicted import read_predicted

    measured = list(store.finished_cells().values())

    def key(r: dict) -> tuple:
        return r["arm"], r["workload"], r.get("concurrency")

    have = {key(r) for r in measured}
    # A cell that failed keeps its prediction: the point then rests on it, and says so.
    predicted = [r for r in read_predicted(store.root) if key(r) not in have]
    points = build_points(pd.DataFrame(measured + predicted))
    return points[points["workload"] == POOLED]


def _standings(store: RunStore, state: AdaptiveState, pair: Pair, av_runs: bool) -> list[Standing]:
    from avbench.predict.predicted import PredictRequest, predict_run

    sweep = Sweep.model_validate(state.sweep)
    source = _max_k_arm(pair, sweep)
    targets = _targets(pair, sweep, source, av_runs)
    if targets:
        predict_run(PredictRequest(store.root, targets, source.name, schedule=None))
    max_repeats = state.policy.max_repeats or sweep.repeats
    return standings(_points(store), state.policy.uncertainty, max_repeats)


def cells_for(wanted: list[Wanted], pair: Pair, sweep: Sweep) -> list[Cell]:
    """The full sweep's cells (every workload) of each wanted arm, concurrency and repeat."""
    repeats = max([sweep.repeats, *(w.repeat + 1 for w in wanted)])
    full = build_plan(pair, sweep.model_copy(update={"repeats": repeats}))
    keys = {(w.arm, w.concurrency, w.repeat) for w in wanted}
    return [c for c in full if (c.arm, c.concurrency, c.repeat) in keys]


def _first_round_measured(store: RunStore, state: AdaptiveState, source: Arm) -> None:
    """Stop (state "failed", written) when a cell of the first round has no measurement."""
    try:
        _verify_first_round(store, source)
    except AdaptiveStopped:
        state.status = "failed"
        state.write(store.root)
        raise


def _verify_first_round(store: RunStore, source: Arm) -> None:
    failed = [f for f in store.failures() if f.arm in ("baseline", source.name)]
    done = store.finished_cells()
    lost = [f for f in failed if f.cell_id not in done]
    if lost:
        raise AdaptiveStopped(
            f"adaptive sweep stopped: {len(lost)} cell(s) of the first round failed "
            f"({lost[0].cell_id}: {lost[0].reason}); every arm is predicted from "
            f"{source.name} and the baseline, so nothing can be decided without them. What was "
            f"measured is kept in {store.root}; fix the cause and --resume it"
        )


def _describe(standing: Standing) -> dict:
    return {
        "concurrency": standing.concurrency,
        "verdict": standing.verdict,
        "winner": standing.winner.arm,
        "state": standing.state,
        "margin": standing.margin,
        "contenders": [o.arm for o in standing.contenders],
        "predicted": [o.arm for o in (standing.winner, *standing.contenders) if o.predicted],
        "rests_on_prediction": standing.rests_on_prediction,
        "cell_noise": standing.cell_noise,
    }


def _over_budget(state: AdaptiveState, cells: list[Cell], round_s: float) -> bool:
    p = state.policy
    if p.budget_cells is not None and state.cells + len(cells) > p.budget_cells:
        return True
    return p.budget_s is not None and state.seconds + round_s > p.budget_s


def _grow_plan(store: RunStore, run: _Run, cells: list[Cell]) -> None:
    from avbench.run.runner import _describe_arms

    m = store.read_manifest()
    assert isinstance(m, SweepManifest)
    plan = list(m.plan)
    known = {c.id for c in plan}
    plan += [c for c in cells if c.id not in known]
    arms = _describe_arms(run.opts, plan, run.install, [])
    engines = {a.name: a.engine for a in m.arms}
    for a in arms:
        if engines.get(a.name):
            a.engine = engines[a.name]
    store.update_manifest(plan=[c.to_dict() for c in plan], arms=arms, status="running")


@dataclass
class _Run:
    """One invocation's view of the run: its options and the vLLM install its arms use."""

    store: RunStore
    opts: SweepOptions
    install: VllmInstall

    @property
    def av_runs(self) -> bool:
        """AV is predicted only where this vLLM could then measure it."""
        from avbench.run.runner import unsupported_reason

        return unsupported_reason(self.opts, Arm("av", self.opts.pair.max_k), self.install) is None


@dataclass
class AdaptiveOutcome:
    run_dir: Path
    state: AdaptiveState
    standings: list[Standing]
    last: SweepOutcome | None = None


def _next_cells(run: _Run, state: AdaptiveState, now: list[Standing]) -> list[Cell] | None:
    """The next round's cells; None when the same cells already failed in an earlier round."""
    sweep = Sweep.model_validate(state.sweep)
    cells = cells_for([w for s in now for w in s.wanted], run.opts.pair, sweep)
    tried = {c for r in state.rounds for c in r.get("cells", [])}
    done = run.store.finished_cells()
    if cells and all(c.id in tried and c.id not in done for c in cells):
        return None
    return cells


def _rounds(run: _Run, state: AdaptiveState, reporter: SweepReporter) -> AdaptiveOutcome:
    outcome = None
    while True:
        now = _standings(run.store, state, run.opts.pair, run.av_runs)
        record = {"round": len(state.rounds), "standings": [_describe(s) for s in now]}
        cells = _next_cells(run, state, now)
        if cells is None:
            state.status = "failed"
            break
        if not cells:
            noisy = any(s.state == "inside noise" for s in now)
            state.status = "inside noise" if noisy else "decided"
            break
        per_cell = state.seconds / max(state.cells, 1)
        if _over_budget(state, cells, per_cell * len(cells)):
            state.status = "budget"
            break
        _grow_plan(run.store, run, cells)
        t0 = time.monotonic()
        # The cells a verdict still hinges on are measured alone: a co-tenant's noise could
        # decide a close verdict (--gpus; docs/scale-out.md).
        alone = {"isolate": sorted({c.arm for c in cells})}
        outcome = resume_sweep(run.store.root, _overrides(run.opts) | alone, reporter)
        seconds = time.monotonic() - t0
        state.rounds.append(record | {"cells": [c.id for c in cells], "seconds": seconds})
        state.write(run.store.root)
    state.rounds.append(record)
    state.write(run.store.root)
    if state.status == "failed":
        raise AdaptiveStopped(
            f"adaptive sweep stopped: the cells round {record['round']} wants failed when "
            f"measured before; what was measured is kept in {run.store.root} (failures.jsonl "
            "says why; fix the cause and --resume it)"
        )
    return AdaptiveOutcome(run.store.root, state, now, outcome)


def _overrides(opts: SweepOptions) -> dict:
    """What resume_sweep cannot read from the manifest: this invocation's server settings."""
    return {
        "port": opts.port,
        "host": opts.host,
        "api_key": opts.api_key,
        "vllm_python": opts.vllm_python,
        "ready_timeout_s": opts.ready_timeout_s,
        "gpus": opts.gpus,
        "isolate": opts.isolate,
    }


def adaptive_sweep(
    opts: SweepOptions, policy: AdaptivePolicy, reporter: SweepReporter | None = None
) -> AdaptiveOutcome:
    """A new adaptive run: the first round, then rounds until decided or the budget is spent."""
    if opts.endpoint is not None:
        raise AvbenchError("--adaptive launches its arms: it cannot attach to --endpoint")
    reporter = reporter or SweepReporter()
    first = replace(opts, sweep=first_round(opts.pair, opts.sweep))
    state = AdaptiveState(policy, opts.sweep.model_dump(mode="json"))
    t0 = time.monotonic()
    outcome = start_sweep(first, reporter)
    store = outcome.store
    first_plan = store.read_manifest()
    assert isinstance(first_plan, SweepManifest)
    cells = [c.id for c in first_plan.plan]
    state.rounds.append({"round": 0, "cells": cells, "seconds": time.monotonic() - t0})
    state.write(store.root)
    _first_round_measured(store, state, _max_k_arm(opts.pair, opts.sweep))
    return _rounds(_Run(store, opts, probe_vllm(opts.vllm_python)), state, reporter)


def resume_adaptive(
    run_dir: Path, opts_override: dict, reporter: SweepReporter | None = None
) -> AdaptiveOutcome:
    """Finish the cells the last round planned, then go on with the rounds (or with the
    completion, once one started)."""
    reporter = reporter or SweepReporter()
    state = AdaptiveState.read(run_dir)
    if state.completion is not None:
        return complete_adaptive(run_dir, opts_override, reporter)
    t0 = time.monotonic()
    outcome = resume_sweep(run_dir, opts_override, reporter)
    if state.rounds:
        state.rounds[-1]["seconds"] = state.rounds[-1].get("seconds", 0.0) + time.monotonic() - t0
    state.status = "running"
    run = _run_of(outcome.store, opts_override)
    _first_round_measured(
        run.store, state, _max_k_arm(run.opts.pair, Sweep.model_validate(state.sweep))
    )
    return _rounds(run, state, reporter)


def complete_adaptive(
    run_dir: Path, opts_override: dict, reporter: SweepReporter | None = None
) -> AdaptiveOutcome:
    """Measure every cell of the requested sweep that the rounds of a finished adaptive run
    left out, and take each verdict with every cell measured: the fixed protocol's verdicts on
    the rounds' own measurements, which a second, separate run could not give (two fixed runs
    on one machine differ by its drift between them). The rounds' record stays as it was."""
    reporter = reporter or SweepReporter()
    state = AdaptiveState.read(run_dir)
    if state.completion is None and state.status in ("running", "failed"):
        raise AdaptiveStopped(
            f"--complete: the rounds of {run_dir} have not finished (status {state.status}); "
            "--resume it first, then complete it"
        )
    store = RunStore.open(run_dir)
    run = _run_of(store, opts_override)
    sweep = Sweep.model_validate(state.sweep)
    full = build_plan(run.opts.pair, sweep)
    if state.completion is None:
        planned = {c for r in state.rounds for c in r.get("cells", [])}
        missing = [c.id for c in full if c.id not in planned]
        state.completion = {"cells": missing, "seconds": 0.0, "standings": []}
        state.write(store.root)  # before measuring: a resume then goes on with the completion
    wanted = set(state.completion["cells"])
    _grow_plan(store, run, [c for c in full if c.id in wanted])
    t0 = time.monotonic()
    outcome = resume_sweep(store.root, opts_override, reporter)
    state.completion["seconds"] += time.monotonic() - t0
    if outcome.failed:
        state.write(store.root)
        first = outcome.failed[0]
        raise AdaptiveStopped(
            f"--complete: {len(outcome.failed)} cell(s) failed ({first['cell_id']}: "
            f"{first['reason'].splitlines()[0]}); what was measured is kept in {store.root}: "
            "fix the cause and --resume it to finish the completion"
        )
    now = standings(_points(store), state.policy.uncertainty, sweep.repeats)
    state.completion["standings"] = [_describe(s) for s in now]
    state.write(store.root)
    return AdaptiveOutcome(store.root, state, now, outcome)


def _run_of(store: RunStore, opts_override: dict) -> _Run:
    """This invocation's view of a stored run: its manifest's pair and sweep, these settings."""
    m = store.read_manifest()
    assert isinstance(m, SweepManifest)
    pair = Pair.model_validate(m.pair)
    opts = SweepOptions(pair=pair, sweep=Sweep.model_validate(m.sweep), workloads={},
                        results_dir=store.root.parent, run_id=m.run_id, **opts_override)  # fmt: skip
    return _Run(store, opts, probe_vllm(opts.vllm_python))


# ----------------------------------------------------------------------------- before a run
@dataclass(frozen=True)
class Replayed:
    """The rounds replayed on a stored run, its measured throughput taken as each prediction,
    and priced by it like the fixed protocol."""

    cells: int
    rounds: int
    seconds: float
    fixed_seconds: float  # the fixed protocol's cells


@dataclass(frozen=True)
class AdaptiveForecast:
    """What ``sweep --adaptive`` would measure of a plan (`avbench plan --adaptive`)."""

    first: list[Cell]  # round 0
    ceiling: int  # cells a verdict can ask for: the options that run here
    replayed: Replayed | None  # None without a stored run


def forecast(
    pair: Pair, sweep: Sweep, cells: list[Cell], work: PlanWork, previous: PreviousRun | None
) -> AdaptiveForecast:
    """Round 0 and the ceiling of the plan ``cells``; with ``previous``, its rounds replayed."""
    first = build_plan(pair, first_round(pair, sweep))
    unsupported = {a.arm for a in work.arms if a.unsupported}
    # The rounds measure the options a verdict picks from (no dyn arm), and what runs here.
    runnable = [
        c for c in cells if c.arm not in unsupported and Arm.parse(c.arm).kind in OPTION_KINDS
    ]
    if previous is None:
        return AdaptiveForecast(first, len(runnable), None)
    rounds = _replayed_rounds(previous, cells, {c.arm for c in first}, sweep.repeats)
    later = [cells_for(list(w), pair, sweep) for w in rounds]
    replayed = Replayed(
        cells=len(first) + sum(len(r) for r in later),
        rounds=1 + len(rounds),
        seconds=sum(price(r, work, previous) for r in [first, *later]),
        fixed_seconds=price(cells, work, previous),
    )
    return AdaptiveForecast(first, len(runnable), replayed)


def _replayed_rounds(
    previous: PreviousRun, cells: list[Cell], first: set[str], repeats: int
) -> list[tuple[Wanted, ...]]:
    frame = previous.cells
    points = build_points(frame[frame["arm"].isin({c.arm for c in cells})])
    pooled = points[points["workload"] == POOLED]
    missing = first - set(pooled["arm"])
    if missing:
        raise AvbenchError(
            f"--from {previous.root}: no measured {', '.join(sorted(missing))}: the adaptive "
            "replay needs the arms of its first round"
        )
    return replay(pooled, first, Uncertainty(), repeats)
