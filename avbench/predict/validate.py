"""Predicted against measured, cell by cell: the predictor's error and whether it is tolerated.

Per (pair, workload, arm, load) measured in both: the mean over repeats of the predicted and of
the measured value, the error (predicted − measured) / measured, and two measured repeat
spreads, (max − min) / mean: the arm's own cells', and the source cells' the predictions
replayed (a prediction scales its source cell's step times, so that cell's timing noise is in
the prediction whole). A throughput or median TPOT is within tolerance when |error| is at most
max(5%, the two spreads in quadrature); an acceptance length when |predicted − measured| is at
most max(0.05 tokens, the same), each spread saying what the same cell measured twice differs by.

The prediction's interval covers the measured value when |predicted − measured| is within the
uncertainties added in quadrature: the prediction's 95% half-width (the replay's sampling and
the cost model's unidentified part) and the two measured means' (half of each repeat spread).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

REL_TOLERANCE = 0.05
ACCEPT_TOLERANCE = 0.05  # tokens per step
METRICS = ("output_tok_s_per_gpu", "tpot_ms_median", "acceptance_length")
_KEYS = ["pair", "workload", "arm", "concurrency", "rate"]


@dataclass(frozen=True)
class Compared:
    pair: str
    workload: str
    arm: str
    load: str
    metric: str
    predicted: float
    measured: float
    error: float  # relative; absolute (tokens) for acceptance_length
    spread: float | None  # measured repeat spread (relative; absolute for acceptance_length)
    tolerance: float
    repeats: int
    interval: float | None = None  # the prediction's 95% half-width, in the error's units
    source_spread: float | None = None  # the replayed source cells' repeat spread, as spread

    @property
    def within(self) -> bool:
        return abs(self.error) <= self.tolerance

    @property
    def covered(self) -> bool | None:
        if self.interval is None:
            return None
        noise = math.hypot(self.spread or 0.0, self.source_spread or 0.0) / 2
        return abs(self.error) <= math.hypot(self.interval, noise)

    def to_dict(self) -> dict:
        return asdict(self) | {"within": self.within, "covered": self.covered}


def _spread(v: pd.Series, relative: bool) -> float | None:
    v = v.dropna()
    if len(v) < 2:
        return None
    span = float(v.max() - v.min())
    if not relative:
        return span
    return span / float(v.mean()) if v.mean() else None


def _load(row) -> str:
    c = row["concurrency"]
    return f"c={int(c)}" if c >= 0 else f"r={row['rate']:g}/s"


def _keyed(df: pd.DataFrame) -> pd.DataFrame:
    """Every key and metric column present; loads as numbers with -1 for "none" (NaN keys
    would never match)."""
    df = df.reindex(columns=sorted(set(df) | set(_KEYS) | set(METRICS)))
    return df.assign(
        concurrency=pd.to_numeric(df["concurrency"], errors="coerce").fillna(-1.0),
        rate=pd.to_numeric(df["rate"], errors="coerce").fillna(-1.0),
    )


def compare(measured: pd.DataFrame, predicted: pd.DataFrame) -> list[Compared]:
    """Every metric of every cell group measured and predicted alike."""
    if measured.empty or predicted.empty:
        return []
    measured, predicted = _keyed(measured), _keyed(predicted)
    out = []
    m_groups = {k: g for k, g in measured.groupby(_KEYS, dropna=False, sort=False)}
    for key, p in predicted.groupby(_KEYS, dropna=False, sort=False):
        m = m_groups.get(key)
        if m is None:
            continue
        sources = measured.iloc[0:0]
        if "predicted_from" in p and "cell_id" in measured:
            sources = measured[measured["cell_id"].isin(p["predicted_from"])]
        for metric in METRICS:
            pv, mv = p[metric].astype(float).mean(), m[metric].astype(float).mean()
            if not (np.isfinite(pv) and np.isfinite(mv)) or mv == 0:
                continue
            absolute = metric == "acceptance_length"
            spread = _spread(m[metric].astype(float), relative=not absolute)
            src = _spread(sources[metric].astype(float), relative=not absolute)
            error = pv - mv if absolute else (pv - mv) / mv
            noise = math.hypot(spread or 0.0, src or 0.0)
            tol = max(ACCEPT_TOLERANCE if absolute else REL_TOLERANCE, noise)
            half = p[f"{metric}_ci95"].astype(float).mean() if f"{metric}_ci95" in p else np.nan
            interval = None if not np.isfinite(half) else half if absolute else half / mv
            out.append(
                Compared(
                    str(key[0]),
                    str(key[1]),
                    str(key[2]),
                    _load(m.iloc[0]),
                    metric,
                    float(pv),
                    float(mv),
                    float(error),
                    spread,
                    tol,
                    int(m[metric].notna().sum()),
                    interval,
                    src,
                )  # fmt: skip
            )
    return out
