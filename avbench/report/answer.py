"""The answer of a set of runs: recommendations per pair with the configs to deploy."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from avbench.analysis.points import POOLED, build_points
from avbench.analysis.recommend import Recommendation, recommend
from avbench.errors import AvbenchError
from avbench.inputs.schedule import max_k
from avbench.inputs.suite import Pair, Sweep
from avbench.plan.cells import Arm
from avbench.report.runs import RunSet
from avbench.serving.server import speculative_config


@dataclass(frozen=True)
class Answer:
    pooled: Recommendation  # all workloads of the pair (or its only workload)
    per_workload: tuple[Recommendation, ...]
    deploy: dict[str, dict | None]  # "the schedule" / "AV" -> --speculative-config


def _deploy(runs: RunSet, rec: Recommendation) -> dict[str, dict | None]:
    """Speculative configs built exactly as the sweep built its arms (same drafting method and
    pinned backend), from the manifest of the pair's first run."""
    manifest = runs.manifest_of(rec.pair)
    pair = Pair.model_validate(manifest.pair)
    sweep = manifest.sweep
    out: dict[str, dict | None] = {}
    if rec.deploy_schedule is not None:
        schedule = rec.deploy_schedule
        dyn = Sweep.model_validate(
            sweep | {"arms": [*sweep.get("arms", []), "dyn"], "schedule": schedule}
        )
        out["the schedule"] = speculative_config(pair, Arm("dyn", max_k(schedule)), dyn)
    if rec.av_arm and any(d.verdict == "AV" for d in rec.decisions):
        out["AV"] = speculative_config(pair, Arm.parse(rec.av_arm), Sweep.model_validate(sweep))
    return out


def answers(runs: RunSet, points: pd.DataFrame | None = None) -> list[Answer]:
    points = build_points(runs.with_predictions()) if points is None else points
    out = []
    for pair in dict.fromkeys(points["pair"]) if not points.empty else []:
        p = points[points["pair"] == pair]
        workloads = [w for w in dict.fromkeys(p["workload"]) if w != POOLED]
        per = tuple(recommend(p[p["workload"] == w], pair, w) for w in workloads)
        pooled = recommend(p[p["workload"] == POOLED], pair, POOLED) if len(per) > 1 else per[0]
        out.append(Answer(pooled, per, _deploy(runs, pooled)))
    return out


def dyn_settings_from(runs: RunSet, pair: str) -> dict:
    """Sweep settings for a follow-up dyn arm (`sweep --schedule-from`): the best static K per
    concurrency of these runs (pooled) as one schedule, with the drafting method and attention
    backend their arms ran, so the dyn arm is comparable with the static envelope."""
    mine = [a for a in answers(runs) if a.pooled.pair == pair]
    ids = ", ".join(r.run_id for r in runs.runs)
    if not mine:
        raise AvbenchError(f"--schedule-from {ids}: no measured cell of pair {pair}")
    if mine[0].pooled.schedule is None:
        raise AvbenchError(
            f"--schedule-from {ids}: no static-K arm of pair {pair} was measured at a "
            "concurrency, so there is no best static K to schedule"
        )
    sweep = Sweep.model_validate(runs.manifest_of(pair).sweep)
    return {
        "schedule": mine[0].pooled.schedule,
        "draft_sample_method": sweep.draft_method,
        "attention_backend": sweep.attention_backend,
    }
