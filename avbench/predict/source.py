"""A run's captures read into the predictor's inputs (all file reading of ``avbench predict``).

Per measured cell of a speculative arm at K:

- its engine steps: ``steps/<cell>.steps.parquet`` (the plugin's step timing capture);
- its verify events, one per (request, step) that verified drafts, with the accepted prefix:
  from the plugin's draft capture (exact steps; the drafter's features for AV, and a DSpark
  confidence head's scores where vLLM computed them), else from the server's per-request
  ``per_step_accepted`` (the request's steps after its first, aligned from its last). Requests
  the draft capture did not sample take the per-request lists; for AV they borrow the features
  of a captured event that accepted as many drafts, from their own step where one was captured,
  else from elsewhere in the cell (with ``draft_fraction`` 0.1 at c = 8 about 43% of steps
  have no captured request: dropping them would replay AV on the steps that happened to be
  sampled). :class:`Coverage` counts which is which; every AV prediction carries it;
- each successful request's measured TPOT, and the cell's measured tok/s/GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from avbench.errors import AvbenchError
from avbench.loadgen.records import RequestRecord
from avbench.predict.model import CellReplay, step_times
from avbench.serving.capture import read_captured, steps_path
from avbench.store.run_store import RunStore


class MissingCapture(AvbenchError):
    """What a prediction needs was not captured in the run."""


@dataclass(frozen=True)
class Coverage:
    """Where an AV replay's verify events (one per request and step) got the drafter's
    confidences: captured with them, or borrowed from a captured event that accepted as many
    drafts in the same step, else elsewhere in the cell."""

    events: int = 0
    captured: int = 0
    same_step: int = 0
    same_cell: int = 0

    @property
    def share(self) -> float:
        """The share of verify steps with their own captured features."""
        return self.captured / self.events if self.events else 0.0

    def __add__(self, other: Coverage) -> Coverage:
        return Coverage(
            self.events + other.events,
            self.captured + other.captured,
            self.same_step + other.same_step,
            self.same_cell + other.same_cell,
        )

    def line(self) -> str:
        return (
            f"feature coverage {self.share:.0%}: {self.captured} of {self.events} verify steps "
            f"with captured features, {self.same_step} borrowed from their step, "
            f"{self.same_cell} from elsewhere in their cell"
        )

    @classmethod
    def from_rows(cls, rows: list[dict]) -> Coverage:
        """Pooled over predicted rows (``to_row``'s columns)."""
        return cls(*(int(sum(r.get(c) or 0 for r in rows)) for c in _COVERAGE_COLUMNS[1:]))

    def to_row(self) -> dict:
        values = (self.share, self.events, self.captured, self.same_step, self.same_cell)
        return dict(zip(_COVERAGE_COLUMNS, values, strict=True))


_COVERAGE_COLUMNS = (
    "av_coverage", "av_events", "av_events_captured", "av_events_borrowed_step",
    "av_events_borrowed_cell",
)  # fmt: skip


@dataclass(frozen=True)
class SourceCell:
    row: dict  # the measured cell row
    replay: CellReplay
    writer: str  # the server process that ran it (its steps file)
    coverage: Coverage | None = None  # AV sources: where each verify event's features came from


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


def _emitted(records: list[RequestRecord]) -> dict[str, int]:
    """Per measured request, the output tokens it was sent after its first (usage's count)."""
    return {
        r.response_id: r.completion_tokens - 1
        for r in records
        if not r.warmup and r.ok and r.response_id and r.completion_tokens
    }


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
    """Verify events from captured draft rows (every scheduled draft, labeled or not): ``f``
    the drafter's features, ``conf`` a confidence head's scores (None where none was run)."""
    if captured.empty:
        return pd.DataFrame(columns=["request_id", "step", "accepted", "scheduled", "f", "conf"])
    c = captured.sort_values(["request_id", "step", "position"])
    g = c.groupby(["request_id", "step"], sort=False)

    def per_position(x: pd.Series) -> np.ndarray | None:
        if x.isna().all():
            return None
        f = np.full(k, np.nan)
        f[: len(x)] = x.to_numpy(float)[:k]
        return f

    out = pd.DataFrame(
        {
            "accepted": g["label"].agg(lambda x: int((x == 1).sum())),
            "scheduled": g.size(),
            "f": g["logit_q_max"].agg(per_position),
            "conf": g["head_score"].agg(per_position),
        }
    ).reset_index()
    return out.astype({"step": int, "accepted": int, "scheduled": int})


def _donor(pools: list[np.ndarray], donors: pd.DataFrame, accepted: int, scheduled: int, n: int):
    """The n-th (round robin) donor of the first pool holding one that drafted at least as
    many positions, preferring one that accepted as many."""
    for pool in pools:
        ok = pool[donors["scheduled"].to_numpy()[pool] >= scheduled]
        same = ok[donors["accepted"].to_numpy()[ok] == accepted]
        for pick in (same, ok):
            if len(pick):
                return pick[n % len(pick)]
    return None


def _borrow_features(events: pd.DataFrame, cell_id: str) -> tuple[pd.DataFrame, Coverage]:
    """Every event without captured features takes a captured event's (its step's, else the
    cell's: :func:`_donor`); none is dropped. A cell with no captured features at all has
    nothing to lend: refused."""
    have = events["f"].notna().to_numpy()
    donors = events[have].reset_index(drop=True)
    if donors.empty:
        raise MissingCapture(
            f"{cell_id}: no captured drafter confidences in any verify step (the drafts "
            "capture recorded none: on Model Runner V2 it needs draft_sample_method "
            "probabilistic); AV cannot be predicted from it"
        )
    by_step = {s: np.flatnonzero(donors["step"].to_numpy() == s) for s in set(donors["step"])}
    every = np.arange(len(donors))
    cols = [c for c in ("f", "conf") if c in events]
    out = events.copy()
    counts = {"step": 0, "cell": 0}
    for n, i in enumerate(events.index[~have]):
        row = events.loc[i]
        pools = [by_step.get(row["step"], every[:0]), every]
        d = _donor(pools, donors, int(row["accepted"]), int(row["scheduled"]), n)
        d = n % len(donors) if d is None else d  # none drafted as far: the nearest we have
        counts["step" if donors.at[d, "step"] == row["step"] else "cell"] += 1
        for c in cols:
            out.at[i, c] = donors.at[d, c]
    cov = Coverage(len(events), int(have.sum()), counts["step"], counts["cell"])
    return out, cov


def cell_events(
    store: RunStore, row: dict, steps: pd.DataFrame, records: list[RequestRecord], av: bool
) -> tuple[pd.DataFrame, Coverage | None]:
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
    rest = from_lists[~from_lists["request_id"].isin(covered)].assign(f=None, conf=None)
    events = pd.concat([from_drafts, rest], ignore_index=True) if len(rest) else from_drafts
    if events.empty:
        raise MissingCapture(
            f"{row['cell_id']}: no accepted prefixes (the draft capture and the server's "
            "per-request spec-decode metrics are both absent)"
        )
    return _borrow_features(events, row["cell_id"]) if av else (events, None)


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
    coverage = None
    if steps is None or steps.empty:  # untimed
        steps = pd.DataFrame(columns=["step", "request_ids"])
        events = _events_from_requests(steps, [r for r in records if not r.warmup], first=0)
    else:
        steps = step_times(steps.sort_values("step", ignore_index=True))
        events, coverage = cell_events(store, row, steps, records, av)
    replay = CellReplay(
        k=int(row["k"]),
        steps=steps,
        events=events,
        tpot_ms=_tpot_ms(records),
        measured_tput=float(row["output_tok_s_per_gpu"]),
        batch=int(row.get("concurrency") or 1),
        emitted=_emitted(records),
    )
    return SourceCell(row, replay, "" if untimed else str(steps["writer"].iloc[0]), coverage)


def curve_steps(store: RunStore, rows: list[dict]) -> pd.DataFrame:
    """The captured steps of these cells, with their arm's K, for the cost curves."""
    frames = []
    for row in rows:
        steps = read_cell_steps(store, row["cell_id"])
        if steps is not None and len(steps):
            frames.append(steps.assign(k=int(row.get("k") or 0)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
