"""AV's cost tables: cost curves from captured engine steps, turned into tables by vLLM's own
builder, for vLLM's budget rule (the replay's step time is priced by ``step_costs``).

- verify cost (ms) against the tokens in the target's forward: ``forward_ms + sample_ms`` of
  every captured step (baseline and speculative arms alike), median per token count;
- draft cost (ms) against the requests in the batch, for each number of draft positions K'
  up to the captured arm's K. Model Runner V1 times each position's sampling, so
  D(n, K') = time to the end of position K' + the proposal's tail after its last position, and
  D(n, 0) = the drafter's first pass alone (dynamic K = 0 still runs it). Model Runner V2 drafts
  in one CUDA graph: D(n, K') = draft_ms · K' / K (cost linear in positions, an assumption).

vLLM's ``build_cost_tables_from_curves`` snaps a size to the next profiled one (CUDA graphs
pad a batch to the next captured size). Captured steps are not padded profiles, so the curve
handed to it is first made dense (linear between observed sizes): its tables then interpolate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from avbench.errors import AvbenchError


@dataclass(frozen=True)
class CostTables:
    """ms per step part: ``draft[k][n]`` drafts k positions for n requests; ``verify[t]``
    verifies a forward of t tokens. Built by vLLM's ``build_cost_tables_from_curves``."""

    draft: dict[int, np.ndarray]
    verify: np.ndarray
    verify_points: int  # distinct token counts the verify curve was fitted on
    draft_points: int  # distinct batch sizes behind the draft curves

    def draft_ms(self, k: int, n: int) -> float:
        table = self.draft[k]
        return float(table[min(n, len(table) - 1)])

    def verify_ms(self, tokens: int) -> float:
        return float(self.verify[min(int(tokens), len(self.verify) - 1)])


def _median_curve(x: np.ndarray, y: np.ndarray) -> list[tuple[int, float]]:
    ok = np.isfinite(y) & (x > 0)
    if not ok.any():
        return []
    frame = pd.DataFrame({"x": x[ok].astype(int), "y": y[ok]})
    med = frame.groupby("x")["y"].median()
    return [(int(a), float(b)) for a, b in med.items()]


def _dense(curve: list[tuple[int, float]]) -> list[tuple[int, float]]:
    xs = np.array([c[0] for c in curve], dtype=float)
    ys = np.array([c[1] for c in curve], dtype=float)
    grid = np.arange(int(xs[0]), int(xs[-1]) + 1)
    return list(zip(grid.tolist(), np.interp(grid, xs, ys).tolist(), strict=True))


def draft_samples(steps: pd.DataFrame, k: int) -> np.ndarray:
    """Per step: the draft cost of its first k positions (NaN where it cannot be read)."""
    total = steps["draft_ms"].to_numpy(float)
    pos = steps["draft_pos_ms"] if "draft_pos_ms" in steps else pd.Series([None] * len(steps))
    first = steps["draft_first_ms"] if "draft_first_ms" in steps else pd.Series([None] * len(steps))
    out = np.full(len(steps), np.nan)
    for i, (p, f, t) in enumerate(zip(pos, first, total, strict=True)):
        if p is None or len(p) == 0 or not np.isfinite(t):
            continue
        p = [float(v) for v in p]
        tail = t - p[-1]
        if k == 0:
            out[i] = (f if f is not None else 0.0) + tail
        elif k <= len(p):
            out[i] = p[k - 1] + tail
    return out


def fit_cost_tables(steps: pd.DataFrame, max_k: int, builder: Callable) -> CostTables:
    """Tables for K' = 0..max_k from captured steps (``builder``: vLLM's function or ours)."""
    if steps.empty:
        raise AvbenchError("no captured steps to fit cost curves on")
    verify_y = steps["forward_ms"].to_numpy(float) + steps["sample_ms"].to_numpy(float)
    verify = _median_curve(steps["tokens"].to_numpy(int), verify_y)
    if not verify:
        raise AvbenchError("captured steps carry no forward/sample timings")
    drafting = steps[steps["draft_ms"].notna()] if "draft_ms" in steps else steps.iloc[0:0]
    n_max = int(steps["n_reqs"].max()) * 2 + 8
    t_max = int(steps["tokens"].max()) + max_k * n_max + 64
    drafts: dict[int, np.ndarray] = {}
    n_points = 0
    for k in range(max_k + 1):
        y = draft_samples(drafting, k) if len(drafting) else np.zeros(0)
        if len(drafting) and np.isnan(y).all() and k > 0:
            # No per-position timings (Model Runner V2): linear in the positions drafted.
            y = drafting["draft_ms"].to_numpy(float) * k / max(1, int(drafting["k"].max()))
        curve = _median_curve(drafting["n_reqs"].to_numpy(int), y) if len(drafting) else []
        n_points = max(n_points, len(curve))
        curve = _dense(curve) if curve else [(1, 0.0)]
        drafts[k] = builder(curve, _dense(verify), n_max, t_max)[0]
    verify_table = builder([(1, 0.0)], _dense(verify), n_max, t_max)[1]
    return CostTables(drafts, verify_table, len(verify), n_points)
