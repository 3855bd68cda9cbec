"""Live captures filed per cell, after each cell of a sweep (what the plugin wrote is read by
``avbench.serving.capture``):

- drafts: the shards' rows whose request id (the id the client saw) belongs to one of the cell's
  measured requests become ``<run>/drafts/<cell_id>.drafts.parquet``, labeled rows only, in the
  schema ``avbench tables`` reads (``estimator.drafts.DRAFT_SCHEMA``). One estimator stream per
  server worker: run_id ``<run>/<arm>/pid<pid>`` (its engine steps are one sequence), pair_id the
  pair, workload_id the cell's workload;
- refits: the estimator lives as long as the server, across cells, so each cell row records the
  refits that happened during the cell (warmup included: the estimator learns from it too) and
  the coefficients in force at its start and at its end;
- steps (every arm, the baseline too): the engine steps that served one of the cell's measured
  requests become ``<run>/steps/<cell_id>.steps.parquet``, one row per step with its timings
  and the client ids of the requests in its batch (what ``avbench predict`` reads).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd

from avbench.estimator.drafts import captured_to_drafts, drafts_path, write_drafts
from avbench.serving.capture import (
    ArmCapture,
    estimator_ran,
    read_captured,
    read_refits,
    read_status,
    read_steps,
    refit_summary,
    steps_path,
    verified_summary,
    wait_flushed,
    wait_steps_flushed,
)


def file_cell(
    run_dir: Path,
    cell_id: str,
    workload: str,
    ac: ArmCapture,
    cell_started: float,
    response_ids: list[str],
) -> dict:
    """Write the cell's labeled drafts and return its capture columns for the cell row."""
    t_end = time.time()
    row: dict = {
        "capture": list(ac.settings.kinds),
        "draft_fraction": ac.settings.draft_fraction,
        # Relative to the run directory for a launched server; as given for an attached one.
        "capture_dir": str(
            ac.directory.relative_to(run_dir)
            if ac.directory.is_relative_to(run_dir)
            else ac.directory
        ),
    }
    if set(ac.settings.kinds) - {"steps"}:  # the drafts writer's flush (steps: their own)
        row["capture_flushed"] = wait_flushed(ac.directory, t_end, ac.server_started)
    status = [s for s in read_status(ac.directory) if s.get("time", 0) >= ac.server_started]
    row["capture_errors"] = sum(sum(s.get("errors", {}).values()) for s in status)
    row["capture_inert"] = sorted({w for s in status for w in s.get("inert", [])}) or None
    if "drafts" in ac.settings.kinds:
        captured = read_captured(ac.directory, response_ids)
        parts = [
            captured_to_drafts(
                g,
                {
                    "run_id": f"{ac.run_id}/{ac.arm}/pid{pid}",
                    "pair_id": ac.pair,
                    "workload_id": workload,
                },
            )  # fmt: skip
            for pid, g in captured.groupby("pid", sort=True)
        ]
        labeled = pd.concat(parts, ignore_index=True) if parts else None
        if labeled is not None and len(labeled):
            write_drafts(labeled, drafts_path(run_dir, cell_id))
        row["capture_draft_rows"] = 0 if labeled is None else len(labeled)
        row["capture_requests"] = int(captured["request_id"].nunique())
        row |= verified_summary(captured)
    if "steps" in ac.settings.kinds:
        row |= _file_steps(run_dir, cell_id, ac, t_end, response_ids)
    if "refits" in ac.settings.kinds:
        refits = read_refits(ac.directory)
        # No estimator, no coefficients: the cold start is in force only where one runs.
        row["estimator"] = "online" if estimator_ran(ac, refits) else "none"
        if row["estimator"] == "online":
            row |= refit_summary(refits, ac.server_started, cell_started, t_end, ac.k)
    return row


def _file_steps(run_dir: Path, cell_id: str, ac: ArmCapture, t_end: float, ids) -> dict:
    """The steps that served the cell's measured requests, per server process in order."""
    flushed = wait_steps_flushed(ac.directory, t_end, ac.server_started)
    steps = read_steps(ac.directory)
    out: dict = {"capture_steps": 0, "capture_steps_flushed": flushed}
    if steps.empty:
        return out
    steps = steps[steps["time"] >= ac.server_started]
    wanted = set(ids)
    mine = steps[[bool(wanted.intersection(r)) for r in steps["request_ids"]]]
    if mine.empty:
        return out
    path = steps_path(run_dir, cell_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    mine.sort_values(["writer", "step"]).to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return out | {
        "capture_steps": len(mine),
        "step_timing": str(mine["timing"].iloc[0]),
        "verified_drafts_per_step": float(mine["verified"].mean()),
    }
