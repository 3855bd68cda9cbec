"""Which per-concurrency verdicts are decided, and which cells would decide the others.

An adaptive sweep measures the baseline and the max-K arm, predicts the other static arms from
the max-K arm's captures (avbench predict), and then measures only what a verdict hinges on.
Here, per concurrency of one view (all workloads pooled, as the recommendation decides):

- every option (the baseline, each static K, AV) gets an interval, its throughput times
  1 ± a relative half-width: a prediction's is its own 95% half-width (the replay's sampling
  and the cost model's unidentified part) and ``Uncertainty.single`` (the noise of the one
  measured cell it replays) in quadrature, or ``Uncertainty.predicted`` where a prediction
  carries no interval; a measured option's is the larger of its repeat spread and
  ``Uncertainty.single`` (the noise of one cell, which a single repeat cannot show), over the
  square root of its repeats (the option is the mean of its interleaved repeats);
- ``single`` is a floor the run itself raises (``Uncertainty.learned``): once options were
  measured twice or more, one cell's noise is at least the median of their repeat spreads. A
  2-core machine shared with other tenants moved one cell 19% between server starts, where
  5% had called a verdict decided on a single cell;
- the winner is the option with the highest throughput (ties to the smaller K, as recommend
  decides);
- another option ties with it when the winner's lead is inside the 95% interval of the
  difference of the two: the two half-widths (in tok/s) in quadrature, as for a difference of
  two independent estimates (asking that the two intervals not overlap would be a test at
  about 99.5%, and would call near-ties of a few percent undecidable on any measurement);
- the verdict is decided when no other option ties with the winner;
- otherwise the contenders (the winner and every option that ties with it) decide it:
  the predicted ones are measured first; once all are measured, each gets one more repeat, up to
  ``max_repeats``; past that the verdict stays "inside noise" (the margin is smaller than what
  the sweep can resolve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import pandas as pd

OPTION_KINDS = ("baseline", "static", "av")

State = Literal["decided", "measure", "repeat", "inside noise"]


@dataclass(frozen=True)
class Uncertainty:
    """Relative half-widths of the options' intervals (see the module docstring)."""

    predicted: float = 0.10
    single: float = 0.05

    def learned(self, view: pd.DataFrame) -> Uncertainty:
        """``single`` raised to the median repeat spread of the measured options of ``view``
        (pooled points) that have two repeats or more."""
        measured = view[view["arm_kind"].isin(OPTION_KINDS) & view["y"].notna()]
        if "predicted" in measured:
            measured = measured[~measured["predicted"].fillna(False).astype(bool)]
        spreads = measured.loc[measured["repeats"].fillna(1) >= 2, "y_spread"].dropna()
        if spreads.empty:
            return self
        return replace(self, single=max(self.single, float(spreads.median())))

    def of(self, option: Option) -> float:
        if option.predicted:
            if option.interval is None:
                return self.predicted
            return math.hypot(option.interval, self.single)
        # One cell's half-width is at least `single` (its repeat spread where that is wider);
        # the option's value is the mean of its interleaved repeats.
        spread = option.spread if option.repeats >= 2 and option.spread is not None else 0.0
        return max(spread, self.single) / math.sqrt(max(option.repeats, 1))


@dataclass(frozen=True)
class Option:
    arm: str
    kind: str
    k: int
    tput: float
    predicted: bool
    repeats: int  # measured repeats (0 when predicted)
    spread: float | None  # (max - min) / mean over the repeats
    interval: float | None = None  # a prediction's 95% half-width, relative

    @property
    def verdict(self) -> str:
        """The deployable answer this option stands for."""
        if self.kind == "baseline":
            return "no speculation"
        return "AV" if self.kind == "av" else f"static K={self.k}"


@dataclass(frozen=True)
class Wanted:
    """A cell an adaptive round should measure (every workload of the sweep at this load)."""

    arm: str
    concurrency: int
    repeat: int


@dataclass(frozen=True)
class Standing:
    concurrency: int
    winner: Option
    contenders: tuple[Option, ...]  # options other than the winner that tie with it (_ties)
    state: State
    wanted: tuple[Wanted, ...]  # empty unless state is "measure" or "repeat"
    margin: float | None  # winner's lead over the best other option, relative
    cell_noise: float = 0.0  # one measured cell's half-width in effect (Uncertainty.learned)

    @property
    def verdict(self) -> str:
        return self.winner.verdict

    @property
    def rests_on_prediction(self) -> bool:
        return any(o.predicted for o in (self.winner, *self.contenders))


def _options(at: pd.DataFrame) -> list[Option]:
    rows = at[at["arm_kind"].isin(OPTION_KINDS) & at["y"].notna()]
    out = []
    for _, r in rows.iterrows():
        predicted = bool(r.get("predicted", False))
        spread = r.get("y_spread")
        ci = r.get("y_ci95")
        out.append(
            Option(
                arm=str(r["arm"]),
                kind=str(r["arm_kind"]),
                k=0 if r["arm_kind"] == "baseline" else int(r["k"]),
                tput=float(r["y"]),
                predicted=predicted,
                repeats=0 if predicted else int(r.get("repeats") or 1),
                spread=None if spread is None or math.isnan(spread) else float(spread),
                interval=_relative(ci, float(r["y"])) if predicted else None,
            )
        )
    return out


def _relative(half: float | None, value: float) -> float | None:
    if half is None or not math.isfinite(half) or value <= 0:
        return None
    return float(half) / value


def _wanted(contenders: list[Option], concurrency: int, max_repeats: int) -> tuple[State, tuple]:
    predicted = [o for o in contenders if o.predicted]
    if predicted:
        return "measure", tuple(Wanted(o.arm, concurrency, 0) for o in predicted)
    more = [o for o in contenders if o.repeats < max_repeats]
    if more:
        return "repeat", tuple(Wanted(o.arm, concurrency, o.repeats) for o in more)
    return "inside noise", ()


def _ties(winner: Option, other: Option, unc: Uncertainty) -> bool:
    half = math.hypot(winner.tput * unc.of(winner), other.tput * unc.of(other))
    return winner.tput - other.tput <= half


def standing(at: pd.DataFrame, concurrency: int, unc: Uncertainty, max_repeats: int) -> Standing:
    """The standing of one concurrency's verdict from its points (one pooled view)."""
    options = _options(at)
    if not options:
        raise ValueError(f"c={concurrency}: no baseline, static or AV point")
    winner = min(options, key=lambda o: (-o.tput, o.k))
    others = [o for o in options if o is not winner]
    reach = [o for o in others if _ties(winner, o, unc)]
    best_other = max((o.tput for o in others), default=None)
    margin = None if not best_other else (winner.tput - best_other) / best_other
    if not reach:
        return Standing(concurrency, winner, (), "decided", (), margin, unc.single)
    state, wanted = _wanted([winner, *reach], concurrency, max_repeats)
    return Standing(concurrency, winner, tuple(reach), state, wanted, margin, unc.single)


def standings(view: pd.DataFrame, unc: Uncertainty, max_repeats: int) -> list[Standing]:
    """Every closed-loop concurrency's standing, ascending (open-loop rates take no part), with
    one cell's noise learned from the whole view's repeats."""
    closed = view[view["concurrency"].notna()]
    unc = unc.learned(closed)
    return [
        standing(closed[closed["concurrency"] == c], int(c), unc, max_repeats)
        for c in sorted(closed["concurrency"].unique())
    ]


def replay(
    view: pd.DataFrame, first: set[str], unc: Uncertainty, max_repeats: int
) -> list[tuple[Wanted, ...]]:
    """The later rounds an adaptive sweep would take if every option were what ``view`` (a fully
    measured run's pooled points) says: the ``first`` arms measured once, every other option
    predicted exactly. Each round is the cells it wants; a repeat takes the view's spread once
    two repeats exist. What it cannot know: a prediction's real error, which can move an option
    nearer the winner (another round) or farther (fewer cells) than the view puts it."""
    closed = view[view["concurrency"].notna() & view["arm_kind"].isin(OPTION_KINDS)]
    sim = closed.assign(
        predicted=~closed["arm"].isin(first),
        repeats=1,
        y_spread=float("nan"),
    ).reset_index(drop=True)
    true_spread = closed["y_spread"].reset_index(drop=True)
    rounds: list[tuple[Wanted, ...]] = []
    while True:
        wanted = tuple(w for s in standings(sim, unc, max_repeats) for w in s.wanted)
        if not wanted:
            return rounds
        rounds.append(wanted)
        for w in wanted:
            at = (sim["arm"] == w.arm) & (sim["concurrency"] == w.concurrency)
            sim.loc[at, "predicted"] = False
            sim.loc[at, "repeats"] = w.repeat + 1
            if w.repeat + 1 >= 2:
                sim.loc[at, "y_spread"] = true_spread[at]
