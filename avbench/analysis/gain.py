"""The OFF -> ON gain table (PR #52228's layout): one row per workload at one load, a mean row.

OFF and ON are two arms of the same pair that differ in one switch (static-kK -> av-kK, or a
fixed K -> the dyn schedule). Noise is the larger of the two arms' repeat spreads; a throughput
change no larger than it is "within noise". With one repeat per arm the noise is unknown and the
table says so instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from avbench.analysis.points import POOLED, as_number, per_verified

Verdict = Literal["ON faster", "ON slower", "within noise", "no change"]


def _pct(off: float | None, on: float | None) -> float | None:
    if off is None or on is None or off == 0:
        return None
    return (on - off) / off * 100.0


@dataclass(frozen=True)
class GainRow:
    workload: str
    tput_off: float | None
    tput_on: float | None
    tput_delta_pct: float | None
    noise_pct: float | None  # None: unknown (a single repeat)
    tpot_off: float | None
    tpot_on: float | None
    tpot_delta_pct: float | None
    accept_len_off: float | None
    accept_len_on: float | None
    # Accepted per verified draft ON minus OFF; when ON (AV) has no captures its counters are
    # per scheduled draft and ``accept_rate_per_verified`` is False (the page says so).
    accept_rate_delta_pp: float | None
    accept_rate_per_verified: bool = True
    trimmed_on: float | None = None  # share of ON's scheduled drafts AV trimmed (captures)

    @property
    def verdict(self) -> Verdict | None:
        d = self.tput_delta_pct
        if d is None:
            return None
        if self.noise_pct is not None and abs(d) <= self.noise_pct:
            return "within noise"
        if d == 0:
            return "no change"
        return "ON faster" if d > 0 else "ON slower"

    @property
    def noise_known(self) -> bool:
        return self.noise_pct is not None


@dataclass(frozen=True)
class GainTable:
    pair: str
    off_arm: str
    on_arm: str
    load: str
    rows: tuple[GainRow, ...]
    mean: GainRow | None  # over the workloads where both arms have a point
    missing: tuple[str, ...]  # workloads where one of the arms has no point at this load

    @property
    def losses(self) -> tuple[GainRow, ...]:
        return tuple(r for r in self.rows if r.verdict == "ON slower")


def _row(workload: str, off: pd.Series, on: pd.Series) -> GainRow:
    cols = ("y", "y_spread", "tpot_ms", "acceptance_length")
    g = {side: {k: as_number(s.get(k)) for k in cols} for side, s in (("off", off), ("on", on))}
    spread_off, spread_on = g["off"]["y_spread"], g["on"]["y_spread"]
    noise = None if spread_off is None or spread_on is None else max(spread_off, spread_on) * 100.0
    (rate_off, off_verified), (rate_on, on_verified) = (
        per_verified(s, "acceptance_rate") for s in (off, on)
    )
    return GainRow(
        workload=workload,
        tput_off=g["off"]["y"],
        tput_on=g["on"]["y"],
        tput_delta_pct=_pct(g["off"]["y"], g["on"]["y"]),
        noise_pct=noise,
        tpot_off=g["off"]["tpot_ms"],
        tpot_on=g["on"]["tpot_ms"],
        tpot_delta_pct=_pct(g["off"]["tpot_ms"], g["on"]["tpot_ms"]),
        accept_len_off=g["off"]["acceptance_length"],
        accept_len_on=g["on"]["acceptance_length"],
        accept_rate_delta_pp=None
        if rate_off is None or rate_on is None
        else (rate_on - rate_off) * 100.0,
        accept_rate_per_verified=off_verified and on_verified,
        trimmed_on=as_number(on.get("trimmed_share")),
    )


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known and len(known) == len(values) else None


def _mean_row(rows: list[GainRow]) -> GainRow | None:
    if not rows:
        return None

    def m(attr: str) -> float | None:
        return _mean([getattr(r, attr) for r in rows])

    return GainRow(
        workload="mean",
        tput_off=m("tput_off"),
        tput_on=m("tput_on"),
        tput_delta_pct=m("tput_delta_pct"),
        noise_pct=m("noise_pct"),
        tpot_off=m("tpot_off"),
        tpot_on=m("tpot_on"),
        tpot_delta_pct=m("tpot_delta_pct"),
        accept_len_off=m("accept_len_off"),
        accept_len_on=m("accept_len_on"),
        accept_rate_delta_pp=m("accept_rate_delta_pp"),
        accept_rate_per_verified=all(r.accept_rate_per_verified for r in rows),
        trimmed_on=m("trimmed_on"),
    )


def gain_tables(points: pd.DataFrame, pair: str, off_arm: str, on_arm: str) -> list[GainTable]:
    """One table per load at which either arm was measured, per-workload rows only."""
    p = points[(points["pair"] == pair) & (points["workload"] != POOLED)]
    p = p[p["arm"].isin([off_arm, on_arm]) & p["y"].notna()]
    tables = []
    for load in dict.fromkeys(p.sort_values("load_order")["load"]):
        at = p[p["load"] == load]
        rows, missing = [], []
        for workload in dict.fromkeys(points.loc[points["pair"] == pair, "workload"]):
            if workload == POOLED:
                continue
            off = at[(at["workload"] == workload) & (at["arm"] == off_arm)]
            on = at[(at["workload"] == workload) & (at["arm"] == on_arm)]
            if off.empty or on.empty:
                missing.append(workload)
                continue
            rows.append(_row(workload, off.iloc[0], on.iloc[0]))
        tables.append(
            GainTable(pair, off_arm, on_arm, load, tuple(rows), _mean_row(rows), tuple(missing))
        )
    return tables


def comparisons(arms: pd.DataFrame) -> list[tuple[str, str]]:
    """(OFF, ON) arm pairs of one pair that differ in one switch: static-kK vs av-kK, and
    static-kK vs dyn-kK (the schedule against always drafting its largest K)."""
    names = set(arms["arm"])
    out = []
    for kind in ("av", "dyn"):
        for arm in sorted(arms.loc[arms["arm_kind"] == kind, "arm"].unique()):
            off = arm.replace(f"{kind}-", "static-", 1)
            if off in names:
                out.append((off, arm))
    return out
