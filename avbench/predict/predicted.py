"""``avbench predict RUN``: predicted cells beside the measured ones, and how well they agree.

From one measured speculative arm at K (the *source*, by default the largest static K with
step timings) and the baseline's step timings (for the verify cost of small forwards), every
source cell is replayed as each target arm would have run it. Targets:

- ``static-k<K'>`` for K' below the source's K;
- ``dyn``: the schedule given with ``--schedule`` or, with ``--schedule recommend``, the
  schedule ``avbench recommend`` would deploy from the measured and predicted static arms;
- ``av``: Adaptive Verification at the source's K (its OFF twin), replayed per server in the
  order its cells ran, the estimator starting cold with each server.

Predicted rows go to ``RUN/predicted.jsonl`` (rewritten whole; a cell is never in both it and
``cells.jsonl``), each with ``predicted`` true, the source run and cell, and the predictor's
version; where a measured cell of the same arm exists, ``RUN/predicted_vs_measured.jsonl``
holds the comparison (docs/predict.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd

from avbench.errors import AvbenchError
from avbench.inputs.schedule import Schedule, max_k
from avbench.plan.cells import Arm, Cell
from avbench.predict.curves import fit_cost_tables
from avbench.predict.model import AvState, Policy, Prediction, Pricing, predict_cell, step_times
from avbench.predict.source import (
    Coverage,
    MissingCapture,
    SourceCell,
    arm_rows,
    curve_steps,
    read_cell_steps,
    source_cell,
)
from avbench.predict.step_costs import fit_by_workload
from avbench.predict.validate import compare
from avbench.predict.vllm_av import DecisionCode, decision_code
from avbench.store.artefacts import RunManifest
from avbench.store.run_store import RunStore, _atomic_write

PREDICTED_FILE = "predicted.jsonl"
COMPARED_FILE = "predicted_vs_measured.jsonl"
PREDICTOR = "avbench-predict 1"
# Columns a predicted row copies from its source cell: what the cell is and what was asked.
_COPIED = (
    "workload", "concurrency", "rate", "repeat", "num_requests", "warmup", "run_id", "pair",
    "gpus", "temperature", "top_p", "max_tokens", "ignore_eos", "chat_template_kwargs", "api",
    "input_len", "output_len", "len_range", "prompts_sha256",
)  # fmt: skip


@dataclass(frozen=True)
class PredictRequest:
    run_dir: Path
    targets: tuple[str, ...] = ("static", "dyn", "av")  # arm names, or kinds for all of one
    source: str | None = None  # the measured arm to replay; None: the largest static K
    schedule: Schedule | Literal["recommend"] | None = "recommend"  # the dyn target's schedule
    prefer_vllm: bool = True


@dataclass
class PredictResult:
    source: str
    rows: list[dict] = field(default_factory=list)
    compared: list = field(default_factory=list)
    decision_code: str = ""
    skipped: list[str] = field(default_factory=list)  # targets not predicted, with why
    coverage: dict[str, Coverage] = field(default_factory=dict)  # per AV arm, over its cells


def _source_arm(store: RunStore, wanted: str | None) -> str:
    """The arm to replay: the largest static K with step timings, else with the server's
    per-request acceptance (which predicts acceptance alone)."""
    cells = store.finished_cells().values()
    static = sorted({(int(r["k"]), r["arm"]) for r in cells if r.get("arm_kind") == "static"})
    if wanted is not None:
        if wanted not in {r.get("arm") for r in cells}:
            raise MissingCapture(f"{store.root}: --from {wanted}: no measured cell of that arm")
        return wanted
    for column in ("capture_steps", "req_spec_steps"):
        found = [a for _, a in static if any(r.get(column) for r in arm_rows(store, a))]
        if found:
            return found[-1]
    what = (
        "no static-K arm was measured"
        if not static
        else "no step timings or per-request spec-decode metrics were captured"
    )
    raise MissingCapture(
        f"{store.root}: nothing to predict from: {what} (sweep with --capture steps,drafts; "
        "see docs/predict.md)"
    )


def _pricing(store: RunStore, sources: list[SourceCell], code: DecisionCode) -> dict[str, Pricing]:
    """Per workload: step costs from that workload's source and baseline steps (step_costs'
    docstring says why), vLLM's cost tables from all of them; empty when none were timed."""
    if not any(s.replay.timed for s in sources):
        return {}
    k = sources[0].replay.k
    baseline = arm_rows(store, "baseline")
    tables = fit_cost_tables(
        curve_steps(store, [s.row for s in sources] + baseline), k, code.build_cost_tables
    )
    timed = [s.replay.steps.assign(workload=s.row["workload"]) for s in sources if s.replay.timed]
    base = [
        step_times(f.sort_values("step", ignore_index=True)).assign(workload=r["workload"])
        for r, f in _baseline_steps(store, baseline)
    ]
    costs = fit_by_workload(pd.concat(timed), pd.concat(base) if base else pd.DataFrame(), k)
    return {w: Pricing(c, tables) for w, c in costs.items()}


def _baseline_steps(store: RunStore, rows: list[dict]) -> list[tuple[dict, pd.DataFrame]]:
    frames = [(r, read_cell_steps(store, r["cell_id"])) for r in rows]
    return [(r, f) for r, f in frames if f is not None and len(f)]


def _row(source: SourceCell, arm: Arm, pred: Prediction, spec: dict | None, code: str) -> dict:
    src = source.row
    cell = Cell(arm.name, src["workload"], src.get("concurrency"), src.get("rate"),
                int(src["repeat"]), int(src["num_requests"]), int(src["warmup"]))  # fmt: skip
    row = {c: src.get(c) for c in _COPIED} | cell.to_dict()
    row |= {
        "arm_kind": arm.kind,
        "k": arm.k,
        "speculative_config": spec,
        "predicted": True,
        "predicted_from_run": src.get("run_id"),
        "predicted_from": src["cell_id"],
        "predictor": f"{PREDICTOR}; decision code: {code}",
        "output_tok_s_per_gpu": pred.output_tok_s_per_gpu,
        "output_tok_s": None
        if pred.output_tok_s_per_gpu is None
        else pred.output_tok_s_per_gpu * int(src.get("gpus") or 1),
        "tpot_ms_median": pred.tpot_ms_median,
        "interactivity_tok_s_user": pred.interactivity_tok_s_user,
        "acceptance_length": pred.acceptance_length,
        "verified_drafts_per_step": pred.verified_drafts_per_step,
        "cost_model_rel": pred.model_rel,
    }
    row |= {f"{m}_ci95": v for m, v in pred.ci95.items()}
    return row


def _spec_config(manifest: RunManifest, arm: Arm, schedule: Schedule | None) -> dict | None:
    from avbench.inputs.suite import Pair, Sweep
    from avbench.serving.server import speculative_config

    if not manifest.pair or not manifest.sweep:
        raise AvbenchError(f"run {manifest.run_id}: its manifest names no pair and sweep")
    sweep = manifest.sweep
    if arm.kind == "dyn":
        sweep = sweep | {"arms": [*sweep.get("arms", []), "dyn"], "schedule": schedule}
    return speculative_config(Pair.model_validate(manifest.pair), arm, Sweep.model_validate(sweep))


def _predict_arm(ctx: _Context, arm: Arm, policy: Policy) -> list[dict]:
    rows: list[dict] = []
    states: dict[str, AvState] = {}
    for s in ctx.sources:
        state = None
        if policy.kind == "av":
            state = states.setdefault(s.writer, AvState.cold(s.replay.k))
        pricing = ctx.pricing.get(s.row["workload"])
        pred, _ = predict_cell(s.replay, pricing, policy, state, ctx.code)
        row = _row(s, arm, pred, ctx.spec(arm, policy.schedule), ctx.code.source)
        if policy.kind == "av" and s.coverage is not None:
            row |= s.coverage.to_row() | {"av_confidences": "head" if policy.head else "estimator"}
        rows.append(row)
    return rows


def uses_confidence_head(pair: dict | None) -> bool:
    """AV of this pair decides with a DSpark confidence head: vLLM uses the checkpoint's head
    whenever it has one (confidence_head "auto"), and offers no switch to ignore it."""
    pair = pair or {}
    return pair.get("method") == "dspark" and pair.get("confidence_head") == "auto"


def _av_sources(
    store: RunStore, rows: list[dict], pair: dict | None
) -> tuple[list[SourceCell], str | None, bool]:
    """The source cells read for AV, why AV cannot be predicted from them (None: it can), and
    whether its confidences are a head's (captured scores) rather than the estimator's."""
    if not all(r.get("capture_steps") and "drafts" in (r.get("capture") or []) for r in rows):
        return [], "AV needs step timings and drafts (capture both)", False
    try:
        sources = [source_cell(store, r, av=True) for r in rows]
    except MissingCapture as exc:
        return [], f"refused: {exc}", False
    head = uses_confidence_head(pair)
    bare = [s.row["cell_id"] for s in sources if s.replay.events["conf"].isna().any()]
    if head and bare:
        return (
            [],
            (
                f"refused: pair {(pair or {}).get('name')} runs AV on its DSpark confidence head "
                "(confidence_head auto: vLLM uses the checkpoint's head whenever it has one), and "
                f"{bare[0]} captured no head scores (vLLM computes them only with AV on): the "
                "online estimator would predict another AV"
            ),
            True,
        )
    return sources, None, head


@dataclass
class _Context:
    store: RunStore
    manifest: RunManifest
    sources: list[SourceCell]
    pricing: dict[str, Pricing]  # per workload; empty: no step timings (acceptance alone)
    code: DecisionCode

    def spec(self, arm: Arm, schedule: Schedule | None) -> dict | None:
        return _spec_config(self.manifest, arm, schedule)


def _recommended_schedule(store: RunStore, predicted: list[dict]) -> Schedule | None:
    """The schedule `avbench recommend` would deploy from measured and predicted static arms."""
    from avbench.analysis.points import POOLED, build_points
    from avbench.analysis.recommend import recommend

    cells = pd.DataFrame([*store.finished_cells().values(), *predicted])
    points = build_points(cells[cells["arm_kind"].isin(["baseline", "static"])])
    view = points[points["workload"] == POOLED]
    if view.empty:
        view = points
    return recommend(view, str(points["pair"].iloc[0]), POOLED).deploy_schedule


def _targets(req: PredictRequest, k: int) -> list[str]:
    out = []
    for t in req.targets:
        if t == "static":
            out += [f"static-k{x}" for x in range(1, k)]
        else:
            out.append(t)
    return list(dict.fromkeys(out))


def _check_k(arm: Arm, target: str, k: int, source: str) -> None:
    """A replay only shortens the source's proposals: a larger K, or AV at another K, was
    never drafted and cannot be predicted from it."""
    if arm.kind == "dyn" and arm.k > k:
        raise AvbenchError(
            f"--schedule: K {arm.k} is above the source {source}'s K {k}; only K <= {k} can be "
            "predicted from it (measure a larger K, or give a schedule within it)"
        )
    if arm.kind == "av" and arm.k != k:
        raise AvbenchError(
            f"--arms {target}: AV is predicted at the source {source}'s K {k} only (av-k{k})"
        )
    if arm.k > k:
        raise AvbenchError(
            f"--arms {target}: K {arm.k} is above the source {source}'s K {k}; only K <= {k} "
            "can be predicted from it (measure a larger K with --capture steps,drafts)"
        )


def predict_run(req: PredictRequest) -> PredictResult:
    store = RunStore.open(req.run_dir)
    manifest = store.read_manifest()
    source = _source_arm(store, req.source)
    rows = arm_rows(store, source)
    # AV scores the drafter's features: it needs the drafts capture as well as the steps.
    av_refusal, head = None, False
    sources: list[SourceCell] = []
    if any(t == "av" or t.startswith("av-") for t in req.targets):
        sources, av_refusal, head = _av_sources(store, rows, manifest.pair)
    sources = sources or [source_cell(store, r) for r in rows]
    # vLLM's code only matters for cost tables and AV: without step timings, skip its import.
    code = decision_code(req.prefer_vllm and any(s.replay.timed for s in sources))
    ctx = _Context(store, manifest, sources, _pricing(store, sources, code), code)
    k = sources[0].replay.k
    result = PredictResult(source, decision_code=code.source)
    for target in _targets(req, k):
        if target == "dyn":
            schedule = (
                _recommended_schedule(store, result.rows)
                if isinstance(req.schedule, str)  # "recommend"
                else req.schedule
            )
            if not schedule:
                result.skipped.append("dyn: no schedule (recommend deploys no speculation)")
                continue
            arm, policy = Arm("dyn", max_k(schedule)), Policy("schedule", schedule=schedule)
        elif target == "av":
            arm, policy = Arm("av", k), Policy("av", k, head=head)
        else:
            try:
                arm = Arm.parse(target)
            except ValueError as exc:
                raise AvbenchError(f"--arms: {exc}") from None
            if arm.kind not in ("static", "av"):
                raise AvbenchError(
                    f"--arms {target}: expected static-k<K>, av-k<K>, static, dyn or av"
                )
            policy = Policy(arm.kind, arm.k, head=head and arm.kind == "av")
        _check_k(arm, target, k, source)
        if arm.kind == "av" and av_refusal is not None:
            result.skipped.append(f"{arm.name}: {av_refusal}")
            continue
        result.rows += _predict_arm(ctx, arm, policy)
        if arm.kind == "av":
            result.coverage[arm.name] = sum(
                (s.coverage for s in sources if s.coverage is not None), Coverage()
            )
    if result.rows:  # a refusal leaves the run's earlier predictions as they were
        _write(store, result)
    return result


def _write(store: RunStore, result: PredictResult) -> None:
    """Predicted rows replace earlier predictions of the same arms; the comparison is redone."""
    path = store.root / PREDICTED_FILE
    kept = [
        r for r in read_predicted(store.root) if r["arm"] not in {x["arm"] for x in result.rows}
    ]
    rows = kept + result.rows
    _atomic_write(
        path, "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows).encode()
    )
    result.compared = compare(
        pd.DataFrame(list(store.finished_cells().values())), pd.DataFrame(rows)
    )
    lines = "".join(json.dumps(c.to_dict(), sort_keys=True) + "\n" for c in result.compared)
    _atomic_write(store.root / COMPARED_FILE, lines.encode())


def read_predicted(run_dir: Path) -> list[dict]:
    """A run's predicted rows (none when it was never predicted)."""
    path = Path(run_dir) / PREDICTED_FILE
    if not path.exists():
        return []
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    except json.JSONDecodeError as exc:
        raise AvbenchError(f"{path}: not a predicted-cells file ({exc})") from None
