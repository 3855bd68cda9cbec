"""What to deploy at each concurrency: AV, a per-batch-size K schedule, or no speculation.

At one closed-loop concurrency the arms serve the same number of users, so the one with the
higher output throughput per GPU also gives each user more tokens per second: throughput is
the criterion. Per concurrency:
- the best static K is the static arm with the highest throughput (a tie goes to the smaller
  K: less drafting for the same result);
- the deployed K is that, or 0 where the baseline does at least as well;
- the verdict is "AV" when the AV arm beats the deployed K, else "schedule" (K > 0) or
  "no speculation";
- the margin is the winner's lead over the best other option, and it exceeds the noise when it
  is larger than the larger repeat spread of the two (unknown with a single repeat).
Two schedules come out: the best static K at every concurrency (what a `dyn` arm measures
against the static envelope) and the one to deploy, with K = 0 where no speculation wins.
Open-loop rates are not batch sizes and take no part.
A burst-delivered option (points.burst_delivered) still takes part, since throughput counts
tokens over the window however they were delivered, but the verdict resting on it carries that
caveat: the per-user speed it implies is not what a user of those streams saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import pandas as pd

from avbench.analysis.points import burst_delivered
from avbench.inputs.schedule import Schedule, schedule_from_best_k

Verdict = Literal["AV", "schedule", "no speculation"]


@dataclass(frozen=True)
class Option:
    label: str  # "baseline", "static-k3", "av-k3"
    k: int
    tput: float
    spread: float | None
    predicted: bool = False  # an avbench predict point, not a measurement
    burst_frac: float | None = None  # set when burst-delivered: its stream_burst_frac


@dataclass(frozen=True)
class Decision:
    concurrency: int
    verdict: Verdict
    schedule_k: int  # the K the deployed schedule runs at this concurrency (0: no drafts)
    best_static: Option | None  # the best static-K arm here
    winner: Option
    runner_up: Option | None  # best option of another verdict; None: nothing to compare with
    notes: tuple[str, ...] = ()

    @property
    def margin_pct(self) -> float | None:
        if self.runner_up is None or self.runner_up.tput == 0:
            return None
        return (self.winner.tput - self.runner_up.tput) / self.runner_up.tput * 100.0

    @property
    def noise_pct(self) -> float | None:
        if self.runner_up is None:
            return None
        a, b = self.winner.spread, self.runner_up.spread
        return None if a is None or b is None else max(a, b) * 100.0

    @property
    def beyond_noise(self) -> bool | None:
        m, n = self.margin_pct, self.noise_pct
        return None if m is None or n is None else m > n

    @property
    def predicted(self) -> tuple[str, ...]:
        """The options this verdict compares that are predictions, not measurements."""
        return tuple(
            o.label for o in (self.winner, self.runner_up) if o is not None and o.predicted
        )

    @property
    def burst_delivered(self) -> tuple[Option, ...]:
        """The options this verdict compares whose streams arrived in bursts."""
        compared = (self.winner, self.runner_up)
        return tuple(o for o in compared if o is not None and o.burst_frac is not None)


@dataclass(frozen=True)
class VerdictRange:
    first: int  # concurrency
    last: int
    verdict: Verdict
    ks: tuple[int, ...]  # schedule K over the range


@dataclass(frozen=True)
class Recommendation:
    pair: str
    scope: str  # a workload, or points.POOLED
    decisions: tuple[Decision, ...]
    schedule: Schedule | None  # best static K per concurrency; None: no static arm measured
    deploy_schedule: Schedule | None  # K = 0 where no speculation wins; None: it wins everywhere
    av_arm: str | None

    @property
    def ranges(self) -> tuple[VerdictRange, ...]:
        out: list[VerdictRange] = []
        for d in self.decisions:
            if out and out[-1].verdict == d.verdict:
                r = out[-1]
                out[-1] = VerdictRange(r.first, d.concurrency, r.verdict, (*r.ks, d.schedule_k))
            else:
                out.append(VerdictRange(d.concurrency, d.concurrency, d.verdict, (d.schedule_k,)))
        return tuple(out)


def _options(at: pd.DataFrame, kind: str) -> list[Option]:
    rows = at[(at["arm_kind"] == kind) & at["y"].notna()]
    return [
        Option(
            label=r["arm"],
            k=0 if kind == "baseline" else int(r["k"]),
            tput=float(r["y"]),
            spread=None if math.isnan(r["y_spread"]) else float(r["y_spread"]),
            predicted=bool(r.get("predicted", False)),
            burst_frac=float(r["stream_burst_frac"]) if burst_delivered(r) else None,
        )
        for _, r in rows.iterrows()
    ]


def _best(options: list[Option]) -> Option | None:
    # Highest throughput; on a tie the smaller K (baseline first).
    return min(options, key=lambda o: (-o.tput, o.k), default=None)


def decide(at: pd.DataFrame, concurrency: int) -> Decision | None:
    """The decision at one concurrency from its points (one view); None without any option."""
    base = _best(_options(at, "baseline"))
    static = _best(_options(at, "static"))
    av = _best(_options(at, "av"))
    sched = _best([o for o in (base, static) if o is not None])
    notes = []
    if base is None:
        notes.append("baseline not measured")
    if static is None:
        notes.append("no static-K arm measured")
    if av is None:
        notes.append("AV not measured")
    if sched is None and av is None:
        return None
    if av is not None and (sched is None or av.tput > sched.tput):
        # The runner-up is what would be deployed instead: the schedule's choice here.
        k = sched.k if sched else 0
        return _noted(Decision(concurrency, "AV", k, static, av, sched, tuple(notes)))
    assert sched is not None
    verdict: Verdict = "schedule" if sched.k > 0 else "no speculation"
    others = [o for o in (av, static if sched is base else base) if o is not None]
    return _noted(
        Decision(concurrency, verdict, sched.k, static, sched, _best(others), tuple(notes))
    )


def _noted(d: Decision) -> Decision:
    """A verdict that rests on a prediction or on burst-delivered streams says so."""
    notes = list(d.notes)
    if d.predicted:
        notes.append(f"rests on predicted {', '.join(d.predicted)} (avbench predict; not measured)")
    if d.burst_delivered:
        shares = ", ".join(f"{o.label} {o.burst_frac:.0%}" for o in d.burst_delivered)
        notes.append(
            f"burst-delivered streams ({shares} in one burst): throughput stands, the per-user "
            "speed it implies was not what those users saw"
        )
    return replace(d, notes=tuple(notes))


def recommend(view: pd.DataFrame, pair: str, scope: str) -> Recommendation:
    """The recommendation for one view (a workload, or all workloads pooled)."""
    closed = view[view["concurrency"].notna()]
    decisions = []
    for c in sorted(closed["concurrency"].unique()):
        d = decide(closed[closed["concurrency"] == c], int(c))
        if d is not None:
            decisions.append(d)
    av_arms = sorted(view.loc[view["arm_kind"] == "av", "arm"].unique())
    return Recommendation(
        pair=pair,
        scope=scope,
        decisions=tuple(decisions),
        schedule=schedule_from_best_k(
            {d.concurrency: d.best_static.k for d in decisions if d.best_static}
        ),
        deploy_schedule=schedule_from_best_k({d.concurrency: d.schedule_k for d in decisions}),
        av_arm=av_arms[-1] if av_arms else None,
    )
