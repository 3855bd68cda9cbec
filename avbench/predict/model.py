"""The predictor: one measured speculative cell replayed as another arm would have run it.

Pure: a cell's captured steps and verify events plus step costs (and, for AV, vLLM's cost
tables) in, predicted metrics out; no server, no files. What it assumes (docs/predict.md):

- drafts and labels of a shorter arm are prefixes of the longer arm's, in distribution: the
  draft for an output position is accepted whatever K the arm runs, so a K' arm's step from a
  position accepts min(K', the run of accepted positions there); AV, decided batch-wide per
  step, keeps min(accepted, admitted) of each measured step;
- batch composition follows the measured arm: the same requests share the same steps, and a
  step that yields fewer tokens is repeated, tokens measured / predicted - 1 more times, as a
  decode step of its batch (a prefill or a stall in the measured step happens once); a dip in
  the batch (a request ended, the client's next one not yet in) lasts as measured, and its
  requests' repeats share the steps of the batch that follows it;
- a request ends where it was sent its last token: drafts a step accepted past it (max_tokens,
  a stop token) count toward acceptance, as vLLM's counters count them, and take no step;
- a step's time changes only through its parts' modelled costs (``step_costs``: the forward
  and sampling of the drafts verified, the drafter's first pass and positions, the rest's share
  per draft); idle time (the batch emptied, waiting for the client) is not stretched;
- the predicted figures are the measured ones times the modelled ratio (tok/s/GPU by the
  cell's time ratio, each request's TPOT by its own), so what the model leaves out cancels.

Policies: a static K', a per-batch-size schedule (K' of the batch that drafted), or AV at K
(vLLM's budget rule and slot admission, the online estimator refit on what AV would verify).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from avbench.estimator.online import EstimatorConfig, OnlineEstimator
from avbench.inputs.schedule import Schedule, k_at
from avbench.predict.curves import CostTables
from avbench.predict.step_costs import StepCosts
from avbench.predict.vllm_av import BudgetInputs, budget_rule

_BOOTSTRAP = 200


@dataclass(frozen=True)
class CellReplay:
    """One measured cell of a speculative arm at K, ready to replay.

    ``steps``: one row per engine step in order (``step``, ``n_reqs``, ``tokens``, ``drafts``,
    ``work_ms``, ``idle_ms``). ``events``: one row per (request, step) that verified drafts
    (``request_id``, ``step``, ``accepted``, ``scheduled``; for AV also ``f``, the K features).
    ``tpot_ms``: each successful measured request's measured TPOT. ``measured_tput``: the
    cell's measured ``output_tok_s_per_gpu``. ``emitted``: each request's output tokens after
    its first. Without ``steps`` (a server without the plugin: the server's per-request lists
    alone) only acceptance is predicted."""

    k: int
    steps: pd.DataFrame  # empty when no step timings were captured: acceptance alone
    events: pd.DataFrame
    tpot_ms: dict[str, float]
    measured_tput: float
    batch: int = 1  # the cell's concurrency: the batch size where no step says it
    # A request that stopped (max_tokens, a stop token) inside a step's accepted drafts was sent
    # fewer than the server counted: those count toward acceptance, as in vLLM's counters, but
    # no step is spent producing them (at K = 3, 1.6-2.4% of the tokens on the wide pair).
    emitted: dict[str, int] = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        return not self.steps.empty


@dataclass(frozen=True)
class Policy:
    """What the predicted arm verifies: ``static`` K', a ``schedule``, or ``av`` at K.
    ``head``: AV confides in a DSpark confidence head (its captured scores), not the online
    estimator, as vLLM does whenever the checkpoint has one."""

    kind: str
    k: int = 0
    schedule: Schedule | None = None
    head: bool = False

    def k_for(self, n_reqs: int) -> int:
        if self.kind == "schedule":
            assert self.schedule is not None
            return k_at(self.schedule, n_reqs)
        return self.k


@dataclass
class AvState:
    """What AV carries from step to step on one server: its estimator and each request's last
    confidences (the stale ones its budget rule reads)."""

    estimator: OnlineEstimator
    last_conf: dict[str, np.ndarray] = field(default_factory=dict)
    admitted_log: list[np.ndarray] = field(default_factory=list)  # per step, for checks

    @classmethod
    def cold(cls, k: int) -> AvState:
        return cls(OnlineEstimator(EstimatorConfig(num_positions=k)))


@dataclass(frozen=True)
class Replayed:
    """Per step and per verify event, measured and predicted."""

    steps: pd.DataFrame  # + tok, tok_pred, work_pred_ms, repeat_ms, repeat_share, verified_pred
    events: pd.DataFrame  # + accepted_sent, accepted_pred, verified_pred, scheduled_pred
    requests: pd.DataFrame  # request_id, draft_steps, accepted (predicted, per request)


@dataclass(frozen=True)
class Pricing:
    """What a timed replay is priced with: the per-part step costs (the predicted time) and
    vLLM's cost tables (AV's budget rule reads its own)."""

    costs: StepCosts
    tables: CostTables


@dataclass(frozen=True)
class Prediction:
    """Predicted cell metrics (None: not predictable from what was captured)."""

    output_tok_s_per_gpu: float | None
    tpot_ms_median: float | None
    acceptance_length: float | None
    verified_drafts_per_step: float | None
    # Half-width of the 95% interval per metric: the replay's sampling (bootstrap) and, for
    # throughput and TPOT, the cost model's part that one K cannot identify (``model_rel``).
    ci95: dict[str, float | None]
    model_rel: float | None = None  # that part, relative to the predicted time

    @property
    def interactivity_tok_s_user(self) -> float | None:
        return None if not self.tpot_ms_median else 1000.0 / self.tpot_ms_median


def step_times(steps: pd.DataFrame) -> pd.DataFrame:
    """``work_ms`` and ``idle_ms`` per captured step (rows of one server process, in order).

    A step lasts from its start to the next step's (``interval_ms`` of the next row); its busy
    part is forward + sampling + drafting, the rest the engine's overhead between steps (on a
    shared machine also the time the engine waited for a core), which more steps would repeat.
    Only a gap after which no request of the step goes on (the batch emptied: the engine waited
    for the client's next request) is idle beyond the median gap, and idle time is not
    stretched. The last step of a stretch has no successor and gets the median gap."""
    busy = (
        steps["forward_ms"].fillna(0.0)
        + steps["sample_ms"].fillna(0.0)
        + steps.get("draft_ms", pd.Series(0.0, index=steps.index)).fillna(0.0)
    ).to_numpy(float)
    nxt = steps["interval_ms"].shift(-1).to_numpy(float)
    consecutive = (steps["step"].shift(-1) == steps["step"] + 1).to_numpy()
    gap = np.where(consecutive, np.maximum(nxt - busy, 0.0), np.nan)
    median_gap = float(np.nanmedian(gap)) if np.isfinite(gap).any() else 0.0
    gap = np.where(np.isfinite(gap), gap, median_gap)
    ids = [set(r) for r in steps["request_ids"]] if "request_ids" in steps else None
    emptied = np.zeros(len(steps), dtype=bool)
    if ids is not None:
        emptied[:-1] = [not (a & b) for a, b in zip(ids[:-1], ids[1:], strict=True)]
    idle = np.where(emptied, np.maximum(gap - median_gap, 0.0), 0.0)
    return steps.assign(work_ms=busy + gap - idle, idle_ms=idle)


# ----------------------------------------------------------------------------- static, schedule
def position_labels(accepted: np.ndarray, scheduled: np.ndarray) -> np.ndarray:
    """One request's verify events laid on its output positions (after the prefill token):
    1 a draft there was accepted, 0 rejected, -1 never drafted (the target's bonus token after
    a fully accepted step)."""
    lab = np.full(int((accepted + 1).sum()), -1, dtype=np.int8)
    p = 0
    for a, k in zip(accepted, scheduled, strict=True):
        lab[p : p + a] = 1
        if a < k:
            lab[p + a] = 0
        p += a + 1
    return lab


def _walk(
    lab: np.ndarray, k_at: np.ndarray, rho: float, rng, end: int
) -> tuple[int, int, int, int]:
    """One pass over a request's positions as an arm drafting ``k_at[q]`` at position q would
    step: a step accepts drafts while the labels there are 1 (an unknown label is accepted with
    probability ``rho``), then emits the target's token. Steps start before ``end`` (the
    request's last token sent) and may accept past it, as vLLM counts them. Returns (steps,
    accepted, drafted, steps that drafted)."""
    q = steps = acc = drafted = drafting = 0
    while q < end:
        k = int(k_at[q])
        a = 0
        while a < k and q + a < len(lab):
            x = lab[q + a]
            if not (x == 1 or (x < 0 and rng.random() < rho)):
                break
            a += 1
        steps, acc, drafted, drafting = steps + 1, acc + a, drafted + k, drafting + (k > 0)
        q += a + 1
    return steps, acc, drafted, drafting


def continue_rate(labels: list[np.ndarray], run: int) -> float:
    """P(a draft is accepted | the ``run`` drafts before it were): what a never-drafted
    position (after a step that accepted all its K drafts) is taken to accept with, ``run`` =
    K - 1, the longest run after which the source shows a drafted position. Acceptance comes
    in stretches: on the wide CPU pair at K = 3 the rate after one accepted draft priced
    K = 2's acceptance length 0.04-0.07 token short. A run seen under ``_MIN_CONTINUE_PAIRS``
    times gives way to the next shorter; 0.5 where no pair was seen."""
    for r in range(max(run, 1), 0, -1):
        hits = seen = 0
        for x in labels:
            after = np.ones(max(len(x) - r, 0), dtype=bool)
            for back in range(1, r + 1):
                after &= x[r - back : len(x) - back] == 1
            known = after & (x[r:] >= 0)
            hits, seen = hits + int((x[r:][known] == 1).sum()), seen + int(known.sum())
        if seen >= _MIN_CONTINUE_PAIRS or (r == 1 and seen):
            return hits / seen
    return 0.5


_MIN_CONTINUE_PAIRS = 50


def replay_fixed(
    cell: CellReplay, costs: StepCosts | None, policy: Policy, walks: int = 8
) -> Replayed:
    """A static K' or a schedule, request by request along its output positions.

    The measured arm's verify events give each position's label; the predicted arm steps over
    the same positions with its own K' (a schedule: the K of the batch that drafted, i.e. of
    the measured step before the one that covered the position), each step accepting
    min(K', the run of accepted labels from where it starts). The per-event columns then carry
    each request's predicted tokens and drafts per step over its measured steps."""
    steps = cell.steps
    n = steps["n_reqs"].to_numpy(int) if cell.timed else np.zeros(0, int)
    n_prev = dict(zip(steps.get("step", []), np.concatenate((n[:1], n[:-1])), strict=True))
    kd = np.array([policy.k_for(int(x)) for x in n])
    ks = [policy.k_for(int(x)) for x in [*n_prev.values(), cell.batch]]
    if max(kd.max(initial=0), max(ks)) > cell.k:
        raise ValueError(f"a K above the captured arm's K {cell.k} cannot be replayed")
    ev = cell.events.sort_values(["request_id", "step"], kind="stable")
    groups = list(ev.groupby("request_id", sort=False))
    labels = [position_labels(g["accepted"].to_numpy(int), g["scheduled"].to_numpy(int)) for _, g in groups]  # fmt: skip
    rho, rng = continue_rate(labels, cell.k - 1), np.random.default_rng(0)
    parts, per_request = [], []
    for (rid, g), lab in zip(groups, labels, strict=True):
        spans = g["accepted"].to_numpy(int) + 1
        k_at = np.repeat([policy.k_for(int(n_prev.get(s, cell.batch))) for s in g["step"]], spans)
        sent = _last_sent(cell, rid, spans)
        runs = [_walk(lab, k_at, rho, rng, sent) for _ in range(walks)]
        n_steps, acc, drafted, drafting = np.array(runs, dtype=float).mean(0)
        n_steps = max(n_steps, 1.0)
        per_request.append((rid, drafting, acc))
        parts.append(g.assign(
            accepted_pred=sent / n_steps - 1.0,  # tokens per step, less its own
            accepted_sent=_sent(spans, sent) - 1,  # what the measured step sent it
            verified_pred=drafted / n_steps,
            scheduled_pred=drafted / n_steps,
        ))  # fmt: skip
    events = pd.concat(parts) if parts else ev.assign(accepted_sent=ev["accepted"], accepted_pred=0.0, verified_pred=0.0, scheduled_pred=0.0)  # fmt: skip
    requests = pd.DataFrame(per_request, columns=["request_id", "draft_steps", "accepted"])
    if not cell.timed:
        return Replayed(steps, events, requests)
    if costs is None:
        raise ValueError("a cell with step timings is replayed with step costs")
    return _finish(cell, costs, events, kd, requests)


def _last_sent(cell: CellReplay, rid: str, spans: np.ndarray) -> int:
    """Tokens a request was sent after its first: its ``spans`` (accepted + 1 per verify
    step) up to where it stopped."""
    total = int(spans.sum())
    return min(cell.emitted.get(rid, total), total)


def _sent(spans: np.ndarray, sent: int) -> np.ndarray:
    """Tokens each of a request's steps sent it, of the ``spans`` it verified, up to ``sent``."""
    before = np.concatenate(([0], np.cumsum(spans)[:-1]))
    return np.clip(sent - before, 0, spans)


def _accepted_sent(cell: CellReplay, ev: pd.DataFrame) -> pd.Series:
    """Per verify event, the drafts the measured step sent its request (the step's tokens
    less its own): what it accepted, less what came past the request's last token."""
    parts = []
    for rid, g in ev.sort_values(["request_id", "step"], kind="stable").groupby("request_id"):
        spans = g["accepted"].to_numpy(int) + 1
        parts.append(pd.Series(_sent(spans, _last_sent(cell, rid, spans)) - 1, index=g.index))
    return pd.concat(parts).reindex(ev.index) if parts else ev["accepted"]


def _drafted(cell: CellReplay) -> np.ndarray:
    """Positions each measured step drafted: K where the drafter ran, else 0."""
    ran = cell.steps["draft_ms"].notna() if "draft_ms" in cell.steps else False
    return np.where(ran, cell.k, 0)


def _finish(
    cell: CellReplay, costs: StepCosts, events: pd.DataFrame, k_to: np.ndarray, requests
) -> Replayed:
    """Tokens and work per step from the events' predicted verdicts, each step repriced part by
    part (``k_to``: the positions it drafts as predicted), and the decode step that repeats it
    where it yields fewer tokens (``repeat_ms``, of which the step's requests take
    ``repeat_share``). ``requests``: per request, predicted steps that drafted and drafts
    accepted (the acceptance length's terms)."""
    steps = cell.steps
    by = events.groupby("step")
    acc = by["accepted_sent"].sum().reindex(steps["step"], fill_value=0).to_numpy()
    acc_pred = by["accepted_pred"].sum().reindex(steps["step"], fill_value=0).to_numpy()
    verified = by["verified_pred"].sum().reindex(steps["step"], fill_value=0).to_numpy()
    n = steps["n_reqs"].to_numpy(int)
    drafts = steps["drafts"].to_numpy(float)
    k_from = _drafted(cell)
    k_pred = np.where(k_from > 0, k_to, 0)
    prefill = steps["tokens"].to_numpy() > n + drafts
    delta = costs.delta(n, drafts, verified, k_from, k_pred, prefill)
    # A step that also prefilled verified drafts of fewer requests than its batch: its repeats
    # are decode steps of the whole batch, at the drafts per request predicted for it.
    kept = np.divide(verified, drafts, out=np.zeros_like(drafts), where=drafts > 0)
    work = steps["work_ms"].to_numpy(float)
    rejoin = _rejoined_batch(n, prefill)
    k_at_n = dict(zip(n, k_to, strict=True))
    k_rejoin = np.where(k_pred > 0, [k_at_n[int(m)] for m in rejoin], 0)
    out = steps.assign(
        tok=n + acc,  # every request in the batch yields a token, plus its accepted drafts
        tok_pred=n + acc_pred,
        work_pred_ms=np.maximum(work + delta.total, 0.05 * work),
        repeat_ms=costs.repeat_ms(rejoin, kept * cell.k * rejoin, k_rejoin),
        repeat_share=n / rejoin,  # of each repeat step: the step's requests are n of its batch
        unidentified_ms=delta.unidentified,
        verified_pred=verified,
    )
    return Replayed(out, events, requests)


def _rejoined_batch(n: np.ndarray, prefill: np.ndarray) -> np.ndarray:
    """The batch a step's repeats run in. A decode step whose batch a later step exceeds is a
    dip (a request ended, the client's next one not yet in): it lasts as long whatever the arm,
    and its requests' missing tokens come in steps of the first larger batch after it. In the
    drain no batch grows again, and the step's own batch repeats."""
    rejoin = n.copy()
    waiting: list[int] = []  # steps whose larger batch has not come yet, batches non-increasing
    for i, size in enumerate(n):
        while waiting and n[waiting[-1]] < size:
            rejoin[waiting.pop()] = size
        waiting.append(i)
    return np.where(prefill, n, rejoin)


# ----------------------------------------------------------------------------- AV
def replay_av(
    cell: CellReplay,
    tables: CostTables,
    costs: StepCosts,
    state: AvState,
    code,
    head: bool = False,
) -> Replayed:
    """AV at K over the cell's steps, in order, carrying ``state`` (one server's estimator).

    Per step: confidences p = sigmoid(ω f + β) of the drafts from the estimator as it stood
    when they were drafted (``head``: the confidence head's captured scores, and no estimator,
    as in vLLM); the budget from vLLM's rule on each request's previous confidences
    (1 for its first verify step, as vLLM resets them); the slots from ``code.assign``
    (vLLM's ``_assign_draft_token_budget``); accepted = min(accepted at K, admitted); then the
    estimator sees the labels of the verified drafts only and refits every 100 steps."""
    est, k = state.estimator, cell.k
    ev = cell.events.sort_values(["step", "request_id"], kind="stable")
    groups = {s: g for s, g in ev.groupby("step", sort=False)}
    acc_pred, admitted_all = [], []
    for s, n_reqs, tokens, drafts in cell.steps[["step", "n_reqs", "tokens", "drafts"]].itertuples(
        index=False
    ):
        g = groups.get(s)
        if g is None:
            if not head:
                est.observe_step(np.zeros(0), np.zeros(0, int), np.zeros(0))
            continue
        f = np.stack(g["f"].to_numpy())[:, :k]
        if head:
            conf = np.stack(g["conf"].to_numpy())[:, :k].astype(np.float32)
        else:
            conf = est.predict(f, np.broadcast_to(np.arange(k), f.shape)).astype(np.float32)
        cap = g["scheduled"].to_numpy(np.int32)
        stale = np.stack([state.last_conf.get(r, np.ones(k, np.float32)) for r in g["request_id"]])
        budget = budget_rule(
            BudgetInputs(
                stale,
                cap,
                int(tokens) - int(drafts),
                int(n_reqs),
                tables.draft_ms(k, int(n_reqs)),
                tables.verify,
            )  # fmt: skip
        )
        if budget >= cap.sum():
            admitted = cap.copy()
        elif budget == 0:  # vLLM zeroes the capacities without ranking
            admitted = np.zeros_like(cap)
        else:
            admitted = code.assign(conf, cap, budget)
        a = np.minimum(g["accepted"].to_numpy(int), admitted)
        if not head:
            _observe(est, f, a, admitted)
        state.last_conf.update(zip(g["request_id"], conf, strict=True))
        state.admitted_log.append(admitted)
        acc_pred.append(pd.Series(a, index=g.index))
        admitted_all.append(pd.Series(admitted, index=g.index))
    counted = (pd.concat(acc_pred) if acc_pred else pd.Series(0, index=ev.index)).reindex(ev.index)
    sent = _accepted_sent(cell, ev)
    events = ev.assign(
        accepted_sent=sent,
        # a trimmed step still sends no more than the request had left
        accepted_pred=np.minimum(counted, sent),
        verified_pred=pd.concat(admitted_all) if admitted_all else 0,
        scheduled_pred=ev["scheduled"],  # vLLM counts what was scheduled, trimmed or not
    )
    drafting = events["scheduled_pred"] > 0
    # acceptance as vLLM counts it: drafts accepted past the request's last token too
    by = counted[drafting].groupby(events.loc[drafting, "request_id"])
    requests = pd.DataFrame({"draft_steps": by.size(), "accepted": by.sum()}).reset_index()
    return _finish(cell, costs, events, np.full(len(cell.steps), k), requests)


def _observe(est: OnlineEstimator, f: np.ndarray, accepted: np.ndarray, admitted) -> None:
    """The labels vLLM's estimator gets from one step: accepted drafts 1, the first rejected
    verified draft 0; trimmed drafts and those after a rejection none."""
    fs, pos, ys = [], [], []
    for row, a, m in zip(f, accepted, admitted, strict=True):
        n = min(int(a) + 1, int(m))
        fs.append(row[:n])
        pos.append(np.arange(n))
        ys.append((np.arange(n) < a).astype(float))
    est.observe_step(np.concatenate(fs), np.concatenate(pos), np.concatenate(ys))


# ----------------------------------------------------------------------------- aggregate
def _predicted_ms(steps: pd.DataFrame) -> pd.Series:
    """Each step's predicted time to produce its measured tokens: the step repriced, then
    repeated as a decode step as often as fewer tokens per step need (tok / tok_pred - 1 more
    times), and its idle time once."""
    stretch = steps["tok"] / steps["tok_pred"]
    repeats = (stretch - 1) * steps["repeat_share"] * steps["repeat_ms"]
    return steps["work_pred_ms"] + repeats + steps["idle_ms"]


def _time_ratio(steps: pd.DataFrame) -> float:
    """Predicted / measured time to produce the cell's tokens."""
    return float(_predicted_ms(steps).sum() / (steps["work_ms"] + steps["idle_ms"]).sum())


def _model_rel(steps: pd.DataFrame) -> float:
    """The predicted time's half-width from what one K cannot identify, relative to it (the
    steps' parts err together: their half-widths add)."""
    pred = _predicted_ms(steps).sum()
    steps_made = 1 + (steps["tok"] / steps["tok_pred"] - 1) * steps["repeat_share"]
    return float((steps["unidentified_ms"] * steps_made).sum() / pred) if pred > 0 else 0.0


def _request_ratios(r: Replayed) -> pd.Series:
    """Per request: predicted / measured TPOT over its verify steps (its own tokens per step
    decide how often those steps repeat, as decode steps: other requests' prefills in them
    happen once)."""
    work = r.steps.set_index("step")
    ev = r.events.assign(
        w=r.events["step"].map(work["work_ms"]),
        wp=r.events["step"].map(work["work_pred_ms"]),
        rp=r.events["step"].map(work["repeat_ms"]),
    )
    g = ev.groupby("request_id")
    stretch = (g["accepted_sent"].sum() + g.size()) / (g["accepted_pred"].sum() + g.size())
    return (g["wp"].sum() + (stretch - 1) * g["rp"].sum()) / g["w"].sum()


def summarize(cell: CellReplay, r: Replayed, seed: int = 0) -> Prediction:
    """Predicted cell metrics, each with a bootstrap interval (steps for throughput, requests
    for TPOT and acceptance)."""
    rng = np.random.default_rng(seed)
    tpot = np.zeros(0)
    if cell.timed:
        ratios = _request_ratios(r)
        tpot = np.array([cell.tpot_ms[q] * ratios[q] for q in ratios.index if q in cell.tpot_ms])
    # What spec_decode_num_drafts counts: steps that drafted, request by request.
    acc = r.requests[["accepted", "draft_steps"]].to_numpy(float)
    tput = cell.measured_tput / _time_ratio(r.steps) if cell.timed else None
    boots: dict[str, list[float]] = {"output_tok_s_per_gpu": [], "tpot_ms_median": [], "acceptance_length": []}  # fmt: skip
    for _ in range(_BOOTSTRAP):
        if cell.timed:
            idx = rng.integers(0, len(r.steps), len(r.steps))
            boots["output_tok_s_per_gpu"].append(
                cell.measured_tput / _time_ratio(r.steps.iloc[idx])
            )
        if len(tpot):
            boots["tpot_ms_median"].append(float(np.median(rng.choice(tpot, len(tpot)))))
        if len(acc):
            pick = acc[rng.integers(0, len(acc), len(acc))]
            boots["acceptance_length"].append(1.0 + pick[:, 0].sum() / max(pick[:, 1].sum(), 1))
    tpot_median = float(np.median(tpot)) if len(tpot) else None
    model = _model_rel(r.steps) if cell.timed else None
    ci95 = {m: _half_width(v) for m, v in boots.items()}
    for metric, value in (("output_tok_s_per_gpu", tput), ("tpot_ms_median", tpot_median)):
        ci95[metric] = _with_model(ci95[metric], value, model)
    return Prediction(
        output_tok_s_per_gpu=tput,
        tpot_ms_median=tpot_median,
        acceptance_length=1.0 + acc[:, 0].sum() / acc[:, 1].sum() if acc[:, 1].sum() else None,
        verified_drafts_per_step=float(r.steps["verified_pred"].mean()) if cell.timed else None,
        ci95=ci95,
        model_rel=model,
    )


def _half_width(samples: list[float]) -> float | None:
    if len(samples) < 2:
        return None
    lo, hi = np.percentile(samples, [2.5, 97.5])
    return float((hi - lo) / 2)


def _with_model(boot: float | None, value: float | None, model: float | None) -> float | None:
    """The bootstrap half-width and the cost model's, independent: added in quadrature."""
    if value is None or model is None:
        return boot
    return float(np.hypot(boot or 0.0, model * value))


def predict_cell(
    cell: CellReplay,
    pricing: Pricing | None,
    policy: Policy,
    av: AvState | None = None,
    code=None,
) -> tuple[Prediction, Replayed]:
    """One predicted cell: replay, then summarize. ``pricing``: None where no cell was timed."""
    if policy.kind == "av":
        if av is None or code is None or not cell.timed or pricing is None:
            raise ValueError("an AV replay needs step timings, the server's AV state and code")
        replayed = replay_av(cell, pricing.tables, pricing.costs, av, code, policy.head)
    else:
        replayed = replay_fixed(cell, pricing.costs if pricing else None, policy)
    return summarize(cell, replayed), replayed
