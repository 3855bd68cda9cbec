"""The throughput-interactivity frontier of one view (a pair and a workload, or all workloads).

x = interactivity (1000 / median TPOT, tok/s per user), y = output tok/s per GPU; both are
better when larger. A point is on the frontier when no other point of the view is at least as
good on both axes and better on one, so two identical points are both on it (a tie).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


def pareto_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """True where no other point dominates. A point with a missing coordinate is never on the
    frontier and dominates nothing."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    valid = ~(np.isnan(x) | np.isnan(y))
    ge_x = x[None, :] >= x[:, None]
    ge_y = y[None, :] >= y[:, None]
    strictly = (x[None, :] > x[:, None]) | (y[None, :] > y[:, None])
    dominated = (ge_x & ge_y & strictly & valid[None, :]).any(axis=1)
    return valid & ~dominated


def with_frontier(view: pd.DataFrame) -> pd.DataFrame:
    """The view's points with an ``on_frontier`` column."""
    return view.assign(on_frontier=pareto_mask(view["x"].to_numpy(), view["y"].to_numpy()))


def frontier_line(view: pd.DataFrame) -> pd.DataFrame:
    """The frontier's points in drawing order (ascending interactivity)."""
    v = with_frontier(view)
    return v[v["on_frontier"]].sort_values(["x", "y"], ascending=[True, False])


@dataclass(frozen=True)
class FrontierCount:
    """How often one arm is on the frontier, over the loads it was measured at."""

    arm: str
    on: tuple[str, ...]  # loads where its point is on the frontier
    measured: tuple[str, ...]  # loads where it has a point
    missing: tuple[str, ...]  # loads of the view where it has none

    @property
    def n(self) -> int:
        return len(self.on)

    @property
    def m(self) -> int:
        return len(self.measured)

    def sentence(self) -> str:
        if not self.measured:
            return f"{self.arm} has no measured point"
        text = f"{self.arm} is on the frontier at {self.n} of {self.m} loads"
        if self.on:
            text += f" ({', '.join(self.on)})"
        if self.missing:
            text += f"; not measured at {', '.join(self.missing)}"
        return text


def frontier_count(view: pd.DataFrame, arm: str) -> FrontierCount:
    v = with_frontier(view).sort_values("load_order")
    loads = list(dict.fromkeys(v["load"]))
    mine = v[(v["arm"] == arm) & v["x"].notna() & v["y"].notna()]
    measured = list(dict.fromkeys(mine["load"]))
    return FrontierCount(
        arm=arm,
        on=tuple(dict.fromkeys(mine.loc[mine["on_frontier"], "load"])),
        measured=tuple(measured),
        missing=tuple(lo for lo in loads if lo not in measured),
    )


def static_envelope(view: pd.DataFrame) -> pd.DataFrame:
    """Per load, the static-K point with the highest throughput (ties: the smaller K)."""
    static = view[(view["arm_kind"] == "static") & view["y"].notna()]
    if static.empty:
        return static
    best = static.sort_values(["load_order", "y", "k"], ascending=[True, False, True])
    return best.drop_duplicates("load", keep="first").reset_index(drop=True)
