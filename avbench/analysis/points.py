"""From cell rows to points: one per (pair, workload, arm, load), the mean over repeats.

A load is a closed-loop concurrency (``c=4``) or an open-loop rate (``r=2/s``); each is its own
point. Noise is the spread of the interleaved repeats, (max - min) / mean (|p1 - p2| / mean for
two; docs/fair-comparisons.md), NaN with a single repeat. "All workloads" pools a pair's workloads: per repeat
the mean over workloads, then the same mean and spread over repeats; an arm that lacks a
workload at some load and repeat has no pooled point there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

POOLED = "all workloads"

# Cell columns a point keeps (mean over repeats); the counters are summed instead.
MEAN_COLUMNS = {
    "output_tok_s_per_gpu": "y",
    "interactivity_tok_s_user": "x",
    "tpot_ms_median": "tpot_ms",
    "ttft_ms_median": "ttft_ms",
    "acceptance_length": "acceptance_length",
    "acceptance_rate": "acceptance_rate",
    # From live captures (AV arms: the drafts the target verified, not those AV trimmed).
    "verified_acceptance_rate": "verified_acceptance_rate",
    "verified_tokens_per_draft": "verified_tokens_per_draft",
    "trimmed_share": "trimmed_share",
    # Predicted cells: the 95% half-width of the predicted throughput (avbench predict).
    "output_tok_s_per_gpu_ci95": "y_ci95",
}
# A counter column and its per-verified-draft twin from captures.
PER_VERIFIED = {
    "acceptance_rate": "verified_acceptance_rate",
    "draft_tokens_per_draft": "verified_tokens_per_draft",
}
SUM_COLUMNS = ("num_drafts", "num_draft_tokens", "output_tokens")
# Data-quality columns a point keeps as the worst of its cells: one bad cell makes it suspect.
MAX_COLUMNS = ("stream_burst_frac",)
KEYS = ["pair", "workload", "arm", "load"]

# A point is burst-delivered above this share of its streams arriving in one burst
# (stream_burst_frac). Such a stream has TPOT and ITL near 0 and a TTFT near its end-to-end
# time, and median TPOT (interactivity is 1000 / it) is then not the streamed requests' median:
# with a share f of near-zero TPOTs it is their (0.5 - f) / (1 - f) quantile, the 47th
# percentile at 5% (within a cell's noise), the 44th at 10%, the 28th at the 31% seen on a
# 2-core demo cell. Throughput counts tokens over the window and is the same either way.
BURST_SUSPECT_FRAC = 0.05


def _load_columns(cells: pd.DataFrame) -> pd.DataFrame:
    conc = pd.to_numeric(cells.get("concurrency"), errors="coerce")
    rate = pd.to_numeric(cells.get("rate"), errors="coerce")
    closed = rate.isna()
    return pd.DataFrame(
        {
            "load": np.where(
                closed,
                [f"c={c:g}" for c in conc.fillna(-1)],
                [f"r={r:g}/s" for r in rate.fillna(-1)],
            ),
            "concurrency": conc.where(closed),
            "rate": rate,
            # Closed loop first, then open loop; each ascending.
            "load_order": np.where(closed, conc.fillna(0), 1e9 + rate.fillna(0)),
        },
        index=cells.index,
    )


def normalize_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Cell rows with every column the analysis reads (missing ones as NaN) and a load key."""
    cells = cells.copy()
    pos_cols = [c for c in cells.columns if c.startswith("accept_pos_")]
    for col in [*MEAN_COLUMNS, *SUM_COLUMNS, *MAX_COLUMNS, *pos_cols, "repeat", "k"]:
        if col not in cells:
            cells[col] = np.nan
        cells[col] = pd.to_numeric(cells[col], errors="coerce")
    if "pair" not in cells:
        cells["pair"] = "?"
    kinds = cells["arm"].str.split("-").str[0]
    cells["arm_kind"] = cells["arm_kind"].fillna(kinds) if "arm_kind" in cells else kinds
    # avbench predict's rows: a point with any predicted cell is a predicted point.
    cells["predicted"] = (
        cells["predicted"].fillna(False).astype(bool) if "predicted" in cells else False
    )
    cells["repeat"] = cells["repeat"].fillna(0)
    loads = _load_columns(cells)
    return pd.concat([cells.drop(columns=loads.columns, errors="ignore"), loads], axis=1)


def _sum_or_nan(v: pd.Series) -> float:
    return v.sum(min_count=1)


def _spread(v: pd.Series) -> float:
    v = v.dropna()
    if len(v) < 2 or v.mean() == 0:
        return np.nan
    return float((v.max() - v.min()) / v.mean())


def _aggregate(cells: pd.DataFrame) -> pd.DataFrame:
    pos_cols = sorted(
        (c for c in cells.columns if c.startswith("accept_pos_")),
        key=lambda c: int(c.rsplit("_", 1)[1]),
    )
    groups = cells.groupby(KEYS, sort=False, dropna=False)
    means = groups[[*MEAN_COLUMNS, *pos_cols]].mean().rename(columns=MEAN_COLUMNS)
    sums = groups[list(SUM_COLUMNS)].sum(min_count=1)
    worst = groups[list(MAX_COLUMNS)].max()
    first = groups[["arm_kind", "k", "concurrency", "rate", "load_order"]].first()
    extra = pd.DataFrame(
        {
            "y_spread": groups["output_tok_s_per_gpu"].agg(_spread),
            "repeats": groups["output_tok_s_per_gpu"].count(),
            "predicted": groups["predicted"].max().astype(bool),
        }
    )
    out = pd.concat([first, means, sums, worst, extra], axis=1).reset_index()
    out["draft_tokens_per_draft"] = out["num_draft_tokens"] / out["num_drafts"].where(
        out["num_drafts"] > 0
    )
    return out.sort_values(["pair", "workload", "arm", "load_order"], ignore_index=True)


def _pool_workloads(cells: pd.DataFrame) -> pd.DataFrame:
    n_workloads = cells.groupby("pair")["workload"].nunique()
    keys = ["pair", "arm", "load", "repeat"]
    num = [c for c in cells.columns if c in MEAN_COLUMNS or c.startswith("accept_pos_")]
    groups = cells.groupby(keys, sort=False, dropna=False)
    pooled = groups[num].mean().join(groups[list(SUM_COLUMNS)].sum(min_count=1))
    pooled = pooled.join(groups[list(MAX_COLUMNS)].max())
    pooled = (
        pooled.join(groups[["arm_kind", "k", "concurrency", "rate", "load_order"]].first())
        .join(groups["predicted"].max())
        .join(groups["workload"].nunique().rename("n_workloads"))
    )
    pooled = pooled.reset_index()
    complete = pooled["n_workloads"] == pooled["pair"].map(n_workloads)
    return pooled[complete].drop(columns="n_workloads").assign(workload=POOLED)


def build_points(cells: pd.DataFrame) -> pd.DataFrame:
    """Per-workload points, then the pooled ones (workload == POOLED)."""
    if cells.empty:
        return pd.DataFrame(columns=[*KEYS, "x", "y", "y_spread", "repeats", "predicted"])
    cells = normalize_cells(cells)
    # Several rows for one repeat (the same cell from two runs) average into one sample.
    per_repeat = (
        cells.groupby([*KEYS, "repeat"], sort=False, dropna=False)
        .agg(
            {
                **{c: "mean" for c in cells.columns if c in MEAN_COLUMNS},
                **{c: "mean" for c in cells.columns if c.startswith("accept_pos_")},
                **dict.fromkeys(SUM_COLUMNS, _sum_or_nan),
                **dict.fromkeys(MAX_COLUMNS, "max"),
                **{c: "first" for c in ("arm_kind", "k", "concurrency", "rate", "load_order")},
                "predicted": "max",
            }
        )
        .reset_index()
    )
    per_workload = _aggregate(per_repeat)
    pooled = _aggregate(_pool_workloads(per_repeat))
    return pd.concat([per_workload, pooled], ignore_index=True)


def per_verified(point: Mapping, column: str) -> tuple[float | None, bool]:
    """A point's ``column`` (a PER_VERIFIED key) per verified draft, and whether it is that.

    Arms without AV verify every scheduled draft, so their counters already are. vLLM's
    counters count the drafts scheduled before AV trims them: an AV point takes its captured
    value, or, without captures, the counters' value per scheduled draft (False)."""
    if point.get("arm_kind") != "av":
        return as_number(point.get(column)), True
    captured = as_number(point.get(PER_VERIFIED[column]))
    if captured is not None:
        return captured, True
    return as_number(point.get(column)), False


def burst_delivered(point: Mapping) -> str | None:
    """Why a point's latency figures are suspect (burst-delivered streams), None when they
    are not."""
    frac = as_number(point.get("stream_burst_frac"))
    if frac is None or frac <= BURST_SUSPECT_FRAC:
        return None
    return (
        f"burst-delivered: {frac:.0%} of a cell's streams arrived in one burst (over "
        f"{BURST_SUSPECT_FRAC:.0%}), so its TPOT, ITL, TTFT and interactivity describe the "
        "delivery, not the generation"
    )


def as_number(v) -> float | None:
    """A point's value, None where it is missing (None or NaN)."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def views(points: pd.DataFrame) -> list[tuple[str, str]]:
    """(pair, workload) in first-seen order, each pair's pooled view after its workloads."""
    out: list[tuple[str, str]] = []
    for pair in dict.fromkeys(points["pair"]):
        sub = points[points["pair"] == pair]
        workloads = [w for w in dict.fromkeys(sub["workload"]) if w != POOLED]
        out += [(pair, w) for w in workloads]
        if (sub["workload"] == POOLED).any() and len(workloads) > 1:
            out.append((pair, POOLED))
    return out
