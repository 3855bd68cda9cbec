"""A run's captures read into the predictor's inputs (all file reading of ``avbench predict``).

Per measured cell of a speculative arm at K:

- its engine steps: ``steps/<cell>.steps.parquet`` (the plugin's step timing capture);
- its verify events, one per (request, step) that verified drafts, with the accepted prefix:
  from the plugin's draft capture (exact steps; the drafter's features for AV), else from the
  server's per-request ``per_step_accepted`` (the request's steps after its first, aligned
  from its last). Requests the draft capture did not sample take the per-request lists; for AV
  they borrow the features of a captured request of the same step that accepted as many;
- each successful request's measured TPOT, and the cell's measured tok/s/GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from avbench.errors import AvbenchError
from avbench.predict.model import CellReplay, step_times
from avbench.serving.capture import read_captured, steps_path
from avbench.store.records import RequestRecord
from avbench.store.run_store import RunStore


class MissingCapture(AvbenchError):
    """What a prediction needs was not captured in the run."""


@dataclass(frozen=True)
class SourceCell:
    row: dict  # the measured cell row
    replay: CellReplay
    writer: str  # the server process that ran it (its steps file)


def arm_rows(store: RunStore, arm: str) -> list[dict]:
    """The arm's finished cells in the order they ran."""
    rows = [r for r in store.finished_cells().values() if r.get("arm") == arm]
    return sorted(rows, key=lambda r: r.get("finished_at") or "")


def read_cell_steps(store: RunStore, cell_id: str) -> pd.DataFrame | None:
    path = steps_path(store.root, cell_id)
    return pd.read_parquet(path) if path.exists() else None


def _tpot_ms(records: list[RequestRecord]) -> dict[str, float]:
    out = {}
    for r in records:
        if r.warmup or not r.ok or r.response_id is None or r.ttft is None or r.e2e is None:
            continue
        n = r.completion_tokens if r.completion_tokens is not None else sum(r.chunk_tokens)
        if n > 1:
            out[r.response_id] = (r.e2e - r.ttft) / (n - 1) * 1000.0
    return out


def _events_from_requests(
    steps: pd.DataFrame, records: list[RequestRecord], first: int | None = None
) -> pd.DataFrame:
    """Verify events from the server's per-request lists, placed on the request's steps
    (``first``: numbered from it instead, where no steps were captured)."""
    where: dict[str, list[int]] = {}
    for s, ids in zip(steps["step"], steps["request_ids"], strict=True):
        for rid in ids:
            where.setdefault(rid, []).append(int(s))
    rows = []
    for r in records:
        acc, drafted = r.spec_per_step_accepted, r.spec_per_step_drafted
        mine = where.get(r.response_id or "", [])[1:]  # its first step is the prefill
        if first is not None:
            mine = list(range(first, first + len(acc)))
        n = min(len(acc), len(mine))
        for s, a, d in zip(mine[len(mine) - n :], acc[len(acc) - n :], drafted[len(drafted) - n :], strict=True):  # fmt: skip
            rows.append((r.response_id, s, int(a), int(d)))
    return pd.DataFrame(rows, columns=["request_id", "step", "accepted", "scheduled"])


def _events_from_drafts(captured: pd.DataFrame, k: int) -> pd.DataFrame:
    """Verify events from captured draft rows (every scheduled draft, labeled or not)."""
    if captured.empty:
        return pd.DataFrame(columns=["request_id", "step", "accepted", "scheduled", "f"])
    c = captured.sort_values(["request_id", "step", "position"])
    g = c.groupby(["request_id", "step"], sort=False)

    def features(x: pd.Series) -> np.ndarray:
        f = np.full(k, np.nan)
        f[: len(x)] = x.to_numpy(float)[:k]
        return f

    out = pd.DataFrame(
        {
            "accepted": g["label"].agg(lambda x: int((x == 1).sum())),
            "scheduled": g.size(),
            "f": g["logit_q_max"].agg(features),
        }
    ).reset_index()
    return out.astype({"step": int, "accepted": int, "scheduled": int})


def _borrow_features(events: pd.DataFrame) -> pd.DataFrame:
    """Rows without features take those of a captured event of the same step that accepted as
    many drafts (else any captured event of the step); rows with none to borrow are dropped."""
    have = events["f"].notna()
    if have.all():
        return events
    donors = events[have]
    f = events["f"].copy()
    for i in events.index[~have]:
        same = donors[donors["step"] == events.at[i, "step"]]
        pick = same[same["accepted"] == events.at[i, "accepted"]]
        pick = pick if len(pick) else same
        f.at[i] = pick["f"].iloc[0] if len(pick) else None
    out = events.assign(f=f)
    return out[out["f"].notna()]


def cell_events(
    store: RunStore, row: dict, steps: pd.DataFrame, records: list[RequestRecord], av: bool
) -> pd.DataFrame:
    """One cell's verify events (see the module docstring for the sources)."""
    k = int(row["k"])
    ids = [r.response_id for r in records if not r.warmup and r.response_id]
    captured = pd.DataFrame()
    capture_dir = row.get("capture_dir")
    if "drafts" in (row.get("capture") or []) and capture_dir:
        captured = read_captured(store.root / capture_dir, ids)
    from_drafts = _events_from_drafts(captured, k)
    from_lists = _events_from_requests(steps, [r for r in records if not r.warmup])
    # The capture's exact steps where it saw every verify step the server counted for the
    # request; else (a request not sampled, a verdict the capture missed) the server's list.
    server_count = from_lists.groupby("request_id").size()
    capture_count = from_drafts.groupby("request_id").size()
    complete = capture_count[capture_count.eq(server_count.reindex(capture_count.index))]
    covered = set(complete.index) if len(server_count) else set(capture_count.index)
    from_drafts = from_drafts[from_drafts["request_id"].isin(covered)]
    rest = from_lists[~from_lists["request_id"].isin(covered)].assign(f=None)
    events = pd.concat([from_drafts, rest], ignore_index=True) if len(rest) else from_drafts
    if events.empty:
        raise MissingCapture(
            f"{row['cell_id']}: no accepted prefixes (the draft capture and the server's "
            "per-request spec-decode metrics are both absent)"
        )
    return _borrow_features(events) if av else events


def source_cell(store: RunStore, row: dict, av: bool = False) -> SourceCell:
    """Everything the predictor reads of one measured speculative cell. Without step timings
    (a server without the plugin) the server's per-request lists still give acceptance."""
    cell_id = row["cell_id"]
    steps = read_cell_steps(store, cell_id)
    records = store.read_records(cell_id) if store.requests_path(cell_id).exists() else []
    untimed = steps is None or steps.empty
    if untimed and (av or not any(r.spec_per_step_accepted for r in records)):
        raise MissingCapture(
            f"{cell_id}: no step timings (steps/{cell_id}.steps.parquet"
            + ("" if av else " or per-request spec-decode metrics in its records")
            + "; sweep with --capture steps,drafts)"
        )
    if steps is None or steps.empty:  # untimed
        steps = pd.DataFrame(columns=["step", "request_ids"])
        events = _events_from_requests(steps, [r for r in records if not r.warmup], first=0)
    else:
        steps = step_times(steps.sort_values("step", ignore_index=True))
        events = cell_events(store, row, steps, records, av)
    replay = CellReplay(
        k=int(row["k"]),
        steps=steps,
        events=events,
        tpot_ms=_tpot_ms(records),
        measured_tput=float(row["output_tok_s_per_gpu"]),
        batch=int(row.get("concurrency") or 1),
    )
    return SourceCell(row, replay, "" if untimed else str(steps["writer"].iloc[0]))


def curve_steps(store: RunStore, rows: list[dict]) -> pd.DataFrame:
    """The captured steps of these cells, with their arm's K, for the cost curves."""
    frames = []
    for row in rows:
        steps = read_cell_steps(store, row["cell_id"])
        if steps is not None and len(steps):
            frames.append(steps.assign(k=int(row.get("k") or 0)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
