"""An engine step's time, part by part, as its batch and its drafts change.

Fitted on the captured steps of the source arm (static K) and of the baseline, decode steps
(no prefill in the batch) as medians per batch size n, linear between the sizes seen, and the
source's prefilling steps for the one price that differs there:

- **target forward**: the baseline's forward at n tokens plus ``forward_per_draft(n)`` per
  draft token in the forward, the source's excess over the baseline at the same batch spread
  over its K·n drafts (at a fixed batch the forward is close to linear in the drafts per
  request: on the wide CPU pair K = 1 and 2 read off K = 3 and the baseline land within 4%);
  in a step that also prefills a prompt a draft costs ``prefill_per_draft`` instead, regressed
  on the source's prefilling steps (a forward over hundreds of tokens: 1.5-1.7 ms a token
  there against 1.1-1.2 in decode steps on the wide CPU pair);
- **sampling**: ``sample_per_row`` per draft row verified. The speculative sampler's slope over
  n at K, spread over K + 1 rows per request, bounds the cost of a row from above (it also
  holds any per-request part); the baseline's cost per logits row was meant to bound it from
  below (rejection sampling does more per row than plain sampling). The prediction takes their
  middle and half the range as unidentified: on the wide CPU pair at c = 8 a K = 1 arm and a
  K = 0 range both measured 0.14 ms per row removed (bounds 0.12 and 0.145), on the tiny pair
  K = 1 and 2 came out below the baseline's row. What the speculative sampler costs beyond the
  baseline's whatever it verifies (a step of a K = 0 range still pays it) is in the measured
  step and stays;
- **drafting**: the drafter's first pass (over every token the step verified) costs the
  source's less ``first_pass_per_draft`` per draft not verified, and each position drafted costs
  what the source's position j cost at that batch (per-position timings of Model Runner V1).
  One K fixes the first pass's slope over n only at K + 1 tokens per request; a later position
  is a forward of one token per request, so the two slopes give an upper bound on the part per
  token, ``c = (slope of the first pass - slope of a later position's forward) / K`` (the first
  pass also carries per-request work of its own). The prediction takes c in [c/2, c]: its
  middle, and the half-range as unidentified (on the wide CPU pair, K = 1 and 2 and a K = 0
  range measured c at 0.66-0.79 of the bound);
- **the rest** of the step (scheduler, output processing): the source's exceeds the baseline's
  by E(n), part of it for running a speculative server at all (which stays) and part per draft
  verified; one K cannot split the two, so the prediction takes the middle of the two extremes
  (all of E per draft, none of it) and the half-range is the part of its interval that one K
  cannot identify.

A step that a shorter proposal must repeat (it yields fewer tokens) is repeated as a decode step
of that batch, not as measured: ``repeat_ms`` prices the source's median decode step at the
batch with the predicted drafts, so a prompt prefilled in the measured step, or a stall in it,
happens once whatever K the arm drafts.

Every part is a delta from a measured step: ``delta`` prices a step as predicted against the
same step as measured, so what the model leaves out cancels (docs/predict.md).

A model is fitted per workload (``fit_by_workload``): a forward or a draft position costs more
where the context is longer, so one median per batch size over workloads of different prompt
lengths prices the long-prompt workload's drafting too cheap and the short one's too dear (on
the wide CPU pair a K = 1 step on HumanEval came out 7-13% too long, on GSM8K 4-9% too short).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from avbench.errors import AvbenchError


@dataclass(frozen=True)
class PerBatch:
    """A curve over the batch size: ``values[n]`` (index 0 unused), linear between the sizes
    measured, flat beyond them."""

    values: np.ndarray

    def at(self, n: np.ndarray) -> np.ndarray:
        idx = np.clip(np.asarray(n, dtype=int), 1, len(self.values) - 1)
        return self.values[idx]

    @classmethod
    def zero(cls, n_max: int) -> PerBatch:
        return cls(np.zeros(n_max + 1))


def per_batch(n: np.ndarray, y: np.ndarray, n_max: int) -> PerBatch | None:
    """The median of ``y`` per batch size, interpolated over 1..n_max (None: no finite y)."""
    ok = np.isfinite(y) & (n > 0)
    if not ok.any():
        return None
    med = pd.Series(y[ok]).groupby(n[ok].astype(int)).median()
    grid = np.arange(n_max + 1, dtype=float)
    return PerBatch(np.interp(grid, med.index.to_numpy(float), med.to_numpy(float)))


@dataclass(frozen=True)
class PartDelta:
    """ms per step of each part (arrays over steps), and the half-width one K cannot identify."""

    forward: np.ndarray
    sample: np.ndarray
    draft: np.ndarray
    rest: np.ndarray
    unidentified: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.forward + self.sample + self.draft + self.rest


@dataclass(frozen=True)
class StepCosts:
    """The per-part cost model (module docstring); ``notes`` say what it could not fit."""

    k: int
    forward_per_draft: PerBatch
    sample_per_row: float  # the middle of the two bounds (module docstring)
    sample_row_range: float  # half their range: unidentified
    rest_excess: PerBatch  # E(n): the source's rest less the baseline's
    first_pass_per_draft: float  # the middle of [c/2, c]; the half-range is unidentified
    positions: tuple[PerBatch, ...]  # the cost of draft position j (index j - 1)
    decode_work: PerBatch  # the source's work per decode step (no prefill in the batch)
    notes: tuple[str, ...] = ()
    # A draft's forward in a step that also prefills, and that price's 95% half-width (None:
    # too few such steps; priced as in a decode step of the batch)
    prefill_per_draft: tuple[float, float] | None = None

    def repeat_ms(self, n, verified, k_to) -> np.ndarray:
        """A decode step of n requests verifying ``verified`` drafts and drafting ``k_to``
        positions: the source's median decode step at n, repriced (arrays over steps)."""
        n = np.asarray(n, dtype=float)
        full = self.k * n
        step = self.delta(n, full, verified, np.where(full > 0, self.k, 0), k_to)
        return np.maximum(self.decode_work.at(n) + step.total, 0.0)

    def positions_ms(self, n: np.ndarray, k: np.ndarray) -> np.ndarray:
        """What drafting k positions costs at batch n beyond the first pass."""
        table = np.stack([p.at(n) for p in self.positions])  # (K, steps)
        cum = np.vstack([np.zeros(table.shape[1]), np.cumsum(table, axis=0)])
        return cum[np.clip(np.asarray(k, dtype=int), 0, self.k), np.arange(table.shape[1])]

    def _rest(self, n, d_from, d_to) -> tuple[np.ndarray, np.ndarray]:
        """Rest delta with E split at none and all of it per draft: (middle, half-range)."""
        per_draft = self.rest_excess.at(n) / np.maximum(self.k * np.asarray(n, dtype=float), 1.0)
        change = per_draft * (d_to - d_from)
        return change / 2, np.abs(change) / 2

    def delta(self, n, d_from, d_to, k_from, k_to, prefill=None) -> PartDelta:
        """Each part's change when a step of n requests verifies ``d_to`` drafts instead of
        ``d_from`` and drafts ``k_to`` positions instead of ``k_from`` (arrays over steps;
        ``prefill``: which steps also prefill a prompt, their drafts' forward priced apart)."""
        n, d_from, d_to = (np.asarray(x, dtype=float) for x in (n, d_from, d_to))
        rest, half = self._rest(n, d_from, d_to)
        first_half = self.first_pass_per_draft / 3 * np.abs(d_to - d_from)
        sample_range = self.sample_row_range * np.abs(d_to - d_from)
        draft = self.first_pass_per_draft * (d_to - d_from) + (
            self.positions_ms(n, k_to) - self.positions_ms(n, k_from)
        )
        per_draft, per_draft_half = self.forward_per_draft.at(n), np.zeros_like(n)
        if prefill is not None and self.prefill_per_draft is not None:
            price, price_half = self.prefill_per_draft
            per_draft = np.where(prefill, price, per_draft)
            per_draft_half = np.where(prefill, price_half, 0.0)
        return PartDelta(
            forward=per_draft * (d_to - d_from),
            sample=self.sample_per_row * (d_to - d_from),
            draft=draft,
            rest=rest,
            unidentified=half + first_half + sample_range + per_draft_half * np.abs(d_to - d_from),
        )


def step_parts(steps: pd.DataFrame) -> pd.DataFrame:
    """Decode steps (no prefill in the batch) with their parts in ms: ``forward``, ``sample``,
    ``draft`` and ``rest`` (the step's work less the three; ``work_ms`` from ``step_times``)."""
    dec = steps[steps["tokens"] == steps["n_reqs"] + steps["drafts"]]
    draft = dec["draft_ms"].astype(float).fillna(0.0) if "draft_ms" in dec else 0.0
    return dec.assign(
        forward=dec["forward_ms"].astype(float),
        sample=dec["sample_ms"].astype(float),
        draft=draft,
        rest=dec["work_ms"] - dec["forward_ms"] - dec["sample_ms"] - draft,
    )


def _prefill_per_draft(source: pd.DataFrame, k: int) -> tuple[float, float] | None:
    """A draft token's forward (ms) in the source's steps that also prefill a prompt, and its
    95% half-width: the forward regressed on the prompt tokens (and their square: attention
    over a prompt grows with it) and the decoding requests' tokens (K + 1 per request that
    drafted), refitted once without the steps beyond three robust standard deviations (a
    stalled core). None: under ``_MIN_PREFILL_STEPS`` such steps."""
    pre = source[(source["tokens"] > source["n_reqs"] + source["drafts"]) & (source["drafts"] > 0)]
    if len(pre) < _MIN_PREFILL_STEPS:
        return None
    decoding = pre["drafts"].to_numpy(float) * (k + 1) / k
    prompt = (pre["tokens"].to_numpy(float) - decoding) / 1000.0  # thousands: a sane scale
    x = np.column_stack([np.ones(len(pre)), prompt, prompt**2, decoding])
    y = pre["forward_ms"].to_numpy(float)
    keep = np.isfinite(y)
    coef, *_ = np.linalg.lstsq(x[keep], y[keep], rcond=None)
    resid = y - x @ coef
    mad = np.median(np.abs(resid[keep] - np.median(resid[keep])))
    keep &= np.abs(resid) <= 3 * 1.4826 * mad + 1e-9
    coef, *_ = np.linalg.lstsq(x[keep], y[keep], rcond=None)
    resid = (y - x @ coef)[keep]
    dof = max(int(keep.sum()) - x.shape[1], 1)
    var = float(resid @ resid) / dof * np.linalg.pinv(x[keep].T @ x[keep])[3, 3]
    return max(float(coef[3]), 0.0), 1.96 * float(np.sqrt(max(var, 0.0)))


_MIN_PREFILL_STEPS = 30


def _slope(curve: PerBatch, n_max: int) -> float:
    grid = np.arange(1, n_max + 1)
    return float(np.polyfit(grid, curve.at(grid), 1)[0]) if n_max > 1 else 0.0


def _position_curves(src: pd.DataFrame, k: int, n_max: int) -> list[PerBatch] | None:
    """Position j's cost per batch from V1's per-position ends (None: not timed)."""
    if "draft_pos_ms" not in src or "draft_first_ms" not in src:
        return None
    rows = [
        (n, f, list(p))
        for n, f, p in zip(src["n_reqs"], src["draft_first_ms"], src["draft_pos_ms"], strict=True)
        if p is not None and len(p) == k and f is not None and np.isfinite(f)
    ]
    if not rows:
        return None
    n = np.array([r[0] for r in rows])
    ends = np.array([[r[1], *r[2]] for r in rows], dtype=float)
    curves = [per_batch(n, ends[:, j + 1] - ends[:, j], n_max) for j in range(k)]
    return None if any(c is None for c in curves) else [c for c in curves if c is not None]


def _first_pass_per_draft(src: pd.DataFrame, positions: list[PerBatch], k: int, n_max: int):
    """The middle of [c/2, c], c = (slope of the first pass over n - slope of a later
    position's forward) / K (module docstring)."""
    first = per_batch(src["n_reqs"].to_numpy(), src["draft_first_ms"].to_numpy(float), n_max)
    if k < 2 or first is None:
        return 0.0, "the drafter's first pass per draft: one drafted position cannot tell it (0)"
    later = PerBatch(np.mean([p.values for p in positions[1:]], axis=0) - positions[0].values)
    bound = max((_slope(first, n_max) - _slope(later, n_max)) / k, 0.0)
    return 0.75 * bound, None


def fit_step_costs(source: pd.DataFrame, baseline: pd.DataFrame, k: int) -> StepCosts:
    """The model from the source arm's steps (static K, ``step_times`` applied per cell) and the
    baseline's (may be empty: then sampling and the rest are carried as measured, and the
    forward per draft comes from the source's own forward over tokens)."""
    src = step_parts(source)
    src = src[src["drafts"] == k * src["n_reqs"]]
    if src.empty:
        raise AvbenchError("no captured decode step of the source arm to fit step costs on")
    n_max = int(max(source["n_reqs"].max(), baseline["n_reqs"].max() if len(baseline) else 0))
    n = src["n_reqs"].to_numpy()
    fwd_k = per_batch(n, src["forward"].to_numpy(), n_max)
    work_k = per_batch(n, src["work_ms"].to_numpy(float), n_max)
    assert fwd_k is not None and work_k is not None
    notes: list[str] = []
    base = step_parts(baseline) if len(baseline) else baseline
    base = base[base["drafts"] == 0] if len(base) else base
    if len(base):
        nb = base["n_reqs"].to_numpy()
        fwd_b = per_batch(nb, base["forward"].to_numpy(), n_max)
        smp_b = per_batch(nb, base["sample"].to_numpy(), n_max)
        rest_b = per_batch(nb, base["rest"].to_numpy(), n_max)
        assert fwd_b is not None and smp_b is not None and rest_b is not None
        base_row = max(_slope(smp_b, n_max), 0.0)
        smp_k = per_batch(n, src["sample"].to_numpy(), n_max)
        assert smp_k is not None
        bound = max(_slope(smp_k, n_max) / (k + 1), base_row)
        per_row, row_range = (bound + base_row) / 2, (bound - base_row) / 2
        rest_k = per_batch(n, src["rest"].to_numpy(), n_max)
        assert rest_k is not None
        excess = PerBatch(rest_k.values - rest_b.values)
    else:
        notes.append("no baseline steps: sampling and the rest carried from the source")
        tokens = (src["n_reqs"] + src["drafts"]).to_numpy()
        fwd_b = PerBatch(
            np.interp(np.arange(n_max + 1, dtype=float), *_median_xy(tokens, src["forward"]))
        )
        per_row, row_range, excess = 0.0, 0.0, PerBatch.zero(n_max)
    grid = np.arange(n_max + 1, dtype=float)
    per_draft = PerBatch((fwd_k.values - fwd_b.values) / np.maximum(k * grid, 1.0))
    positions = _position_curves(src, k, n_max)
    if positions is None:
        notes.append("no per-position draft timings: drafting taken as linear in positions")
        total = per_batch(n, src["draft"].to_numpy(), n_max)
        each = PerBatch(total.values / k) if total is not None else PerBatch.zero(n_max)
        positions, first_per = [each] * k, 0.0
    else:
        first_per, why = _first_pass_per_draft(src, positions, k, n_max)
        if why:
            notes.append(why)
    prefill = _prefill_per_draft(source, k)
    if prefill is None and (source["tokens"] > source["n_reqs"] + source["drafts"]).any():
        notes.append("too few steps that prefill: their drafts priced as in a decode step")
    return StepCosts(
        k, per_draft, per_row, row_range, excess, first_per, tuple(positions), work_k,
        tuple(notes), prefill,
    )  # fmt: skip


def fit_by_workload(source: pd.DataFrame, baseline: pd.DataFrame, k: int) -> dict[str, StepCosts]:
    """One model per workload of the source's steps (column ``workload`` on both frames); a
    workload the baseline did not run takes every baseline step."""
    models = {}
    for workload, steps in source.groupby("workload", sort=True):
        base = baseline[baseline["workload"] == workload] if len(baseline) else baseline
        models[str(workload)] = fit_step_costs(steps, base if len(base) else baseline, k)
    return models


def _median_xy(x: np.ndarray, y: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    med = pd.Series(y.to_numpy(float)).groupby(x.astype(int)).median()
    return med.index.to_numpy(float), med.to_numpy(float)
