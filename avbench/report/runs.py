"""Read one or several finished runs for the report and the recommendation."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from avbench.errors import AvbenchError
from avbench.metrics.quality import fill_identity
from avbench.store.artefacts import MergedManifest, RunManifest
from avbench.store.failures import FailureKind
from avbench.store.run_store import RunStore


@dataclass(frozen=True)
class NotMeasured:
    """An arm a run planned but could not run (unsupported by that vLLM or hardware)."""

    run_id: str
    arm: str
    reason: str


@dataclass
class Run:
    store: RunStore
    manifest: RunManifest

    @property
    def run_id(self) -> str:
        return self.manifest.run_id or self.store.root.name

    @property
    def pair(self) -> str:
        return self.manifest.pair_name


@dataclass
class RunSet:
    runs: list[Run]
    cells: pd.DataFrame  # every finished cell row of every run, with run_id and pair
    # `avbench predict`'s rows (predicted.jsonl) of every run: never measurements.
    predicted: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Pair labels that name a sampling profile (see load_runs) -> the run each came from.
    profile_runs: dict[str, str] = field(default_factory=dict)
    # Rows stored as measured that hold no output token (void_rows): left out of ``cells``.
    void: pd.DataFrame = field(default_factory=pd.DataFrame)

    def void_note(self) -> str | None:
        """One line naming the rows set aside as void, or None when there are none."""
        if self.void.empty:
            return None
        ids = ", ".join(f"{r.run_id}/{r.cell_id}" for r in self.void.itertuples())
        return (
            f"{len(self.void)} cell(s) stored as measured hold no output token, left out of "
            f"every table, figure and verdict: {ids}. Their server's engine had died (avbench stored "
            "such cells as measured until it checked the engine's health); measure them again "
            "in a new run."
        )

    def with_predictions(self) -> pd.DataFrame:
        """Measured cells, plus predicted ones where no repeat of that arm, workload and load
        was measured (a point is measured or predicted, never a mix; ``predicted`` marks)."""
        if self.predicted.empty:
            return self.cells
        keys = ["run_id", "arm", "workload", "concurrency", "rate"]

        def key(df: pd.DataFrame) -> pd.Series:  # NaN never compares equal: -1 for no load
            k = df.reindex(columns=keys)
            for c in ("concurrency", "rate"):
                k[c] = pd.to_numeric(k[c], errors="coerce").fillna(-1.0)
            return k.astype(str).agg("|".join, axis=1)

        have = set(key(self.cells)) if not self.cells.empty else set()
        gaps = ~key(self.predicted).isin(have)
        return pd.concat([self.cells, self.predicted[gaps.to_numpy()]], ignore_index=True)

    def unresolved_failures(self) -> list[dict[str, Any]]:
        """Failed cells no later attempt (--resume) finished, unsupported arms left out."""
        out = []
        for run in self.runs:
            done = set(run.store.finished_cells())
            for f in run.store.failures():
                if f.cell_id not in done and f.kind != FailureKind.UNSUPPORTED:
                    out.append(f.to_row() | {"run_id": run.run_id})
        # One line per cell: a cell that failed twice shows its latest reason.
        return list({(f["run_id"], f.get("cell_id")): f for f in out}.values())

    def not_measured(self) -> list[NotMeasured]:
        out = []
        for run in self.runs:
            measured = set(self.cells.loc[self.cells["run_id"] == run.run_id, "arm"])
            for a in run.manifest.arms:
                if a.supported is False and a.name not in measured:
                    out.append(NotMeasured(run.run_id, a.name, a.unsupported_reason or ""))
        return out

    def run_of(self, run_id: str) -> Run:
        return next(r for r in self.runs if r.run_id == run_id)

    def manifest_of(self, pair: str) -> RunManifest:
        """The manifest of the first run (or merged run's source) that swept this pair."""
        if pair in self.profile_runs:
            return self.run_of(self.profile_runs[pair]).manifest
        for run in self.runs:
            sources = run.manifest.sources if isinstance(run.manifest, MergedManifest) else {}
            for m in [run.manifest, *sources.values()]:
                if m.pair.get("name") == pair:
                    return m
        raise AvbenchError(f"no run of pair {pair} among {', '.join(r.run_id for r in self.runs)}")

    def latencies(self, row: pd.Series) -> tuple[np.ndarray, np.ndarray]:
        """Per-request TTFT and TPOT (ms) of one cell's measured, successful requests."""
        from avbench.metrics.data import request_latencies_ms

        store = self.run_of(row["run_id"]).store
        if not store.requests_path(row["cell_id"]).exists():
            return np.zeros(0), np.zeros(0)
        ms = request_latencies_ms(store.read_records(row["cell_id"]))
        return ms["ttft_ms_median"], ms["tpot_ms_median"]

    def refits(self) -> pd.DataFrame:
        """The estimator's refits from plugin captures, each attributed to the cell whose
        stretch of the arm (from the previous cell's end to its own) contains it."""
        frames = []
        for run in self.runs:
            cells = self.cells[self.cells["run_id"] == run.run_id]
            for arm_dir in sorted((run.store.root / "arms").glob("*/capture")):
                arm = arm_dir.parent.name
                rows = [
                    json.loads(line)
                    for f in sorted(arm_dir.glob("refits.*.jsonl"))
                    for line in f.read_text(encoding="utf-8").splitlines()
                    if line.strip()
                ]
                if not rows:
                    continue
                refits = pd.DataFrame(rows).assign(run_id=run.run_id, arm=arm)
                frames.append(_attribute(refits, cells[cells["arm"] == arm]))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


_NONE = np.array(None, dtype=object)  # no cell: an object column of None


def _attribute(refits: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    if cells.empty or "finished_at" not in cells:
        return refits.assign(workload=None, cell_id=None)
    ends = cells.assign(
        end=[datetime.fromisoformat(t).timestamp() for t in cells["finished_at"]]
    ).sort_values("end")
    idx = np.searchsorted(ends["end"].to_numpy(), refits["time"].to_numpy(float), side="left")
    inside = idx < len(ends)
    pick = ends.iloc[np.minimum(idx, len(ends) - 1)]
    return refits.assign(
        workload=np.where(inside, pick["workload"].to_numpy(), _NONE),
        cell_id=np.where(inside, pick["cell_id"].to_numpy(), _NONE),
    )


def _of_run(rows: pd.DataFrame, run: Run) -> pd.DataFrame:
    """A run's rows with its id, and its pair where a row was written without one (cells and
    predictions from before rows named their pair)."""
    pair = rows["pair"].fillna(run.pair) if "pair" in rows else run.pair
    return rows.assign(pair=pair, run_id=run.run_id)


def load_runs(paths: Sequence[Path]) -> RunSet:
    if not paths:
        raise AvbenchError("expected at least one run directory")
    from avbench.predict.predicted import read_predicted

    runs: list[Run] = []
    frames: list[pd.DataFrame] = []
    predicted: list[pd.DataFrame] = []
    for p in paths:
        store = RunStore.open(Path(p))
        run = Run(store, store.read_manifest())
        if any(r.run_id == run.run_id for r in runs):
            raise AvbenchError(f"{p}: run {run.run_id} given twice")
        runs.append(run)
        # The identity check of cells measured before their baseline, completed from records.
        cells = pd.DataFrame(
            fill_identity(list(store.finished_cells().values()), store.read_records)
        )
        if not cells.empty:
            frames.append(_of_run(cells, run))
        rows = read_predicted(store.root)
        if rows:
            predicted.append(_of_run(pd.DataFrame(rows), run).assign(predicted=True))
    cells = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    pred = pd.concat(predicted, ignore_index=True) if predicted else pd.DataFrame()
    profile_runs = _label_profiles(runs, [cells, pred])
    void = void_rows(cells)
    kept, dropped = (cells[m].reset_index(drop=True) for m in (~void, void))
    return RunSet(runs, kept, pred, profile_runs, dropped)


def void_rows(cells: pd.DataFrame) -> pd.Series:
    """Rows stored as measured with 0 output tokens: what a dead engine behind a live HTTP
    server left before avbench failed such cells (no finish reason, no token, status 200)."""
    if cells.empty or "output_tokens" not in cells:
        return pd.Series(False, index=cells.index)
    return pd.to_numeric(cells["output_tokens"], errors="coerce").eq(0)


def _sampling(run: Run) -> str | None:
    smp = run.manifest.sweep.get("sampling")
    if not smp:
        return None
    return f"temp {smp.get('temperature', 1.0):g}, top_p {smp.get('top_p', 1.0):g}"


def _label_profiles(runs: list[Run], frames: list[pd.DataFrame]) -> dict[str, str]:
    """Runs of one pair sampled differently are different answers, never one average: their
    cells (in ``frames``, relabelled in place) carry the pair as "<pair> (<sampling>)", so
    points, frontiers and recommendations keep them apart. Returns label -> its first run."""
    profiles: dict[str, set[str]] = {}
    for run in runs:  # a run that recorded no sampling takes no side
        if (smp := _sampling(run)) is not None:
            profiles.setdefault(run.pair, set()).add(smp)
    out: dict[str, str] = {}
    for run in runs:
        if len(profiles.get(run.pair, ())) < 2 or _sampling(run) is None:
            continue
        label = f"{run.pair} ({_sampling(run)})"
        out.setdefault(label, run.run_id)
        for df in frames:
            if not df.empty:
                df.loc[(df["run_id"] == run.run_id) & (df["pair"] == run.pair), "pair"] = label
    return out
