"""Merge several runs (one per pair or per machine) into one run directory reports can read.

Layout of a merged run (RunStore's, plus the sources):
  manifest.json          merged_from: the source run ids; sources: {run_id: its manifest}
  cells.jsonl            every source's rows; cell_id prefixed with the pair ("<pair>__<id>")
                         when sources share a cell id; source_run / source_cell_id keep the origin
  failures.jsonl         the same for failures
  requests/, scrapes/    per cell, renamed like the rows
  sources/<run_id>/      each source's manifest.json, failures.jsonl and arms/ (server logs)

Two sources that measured the same cell of the same pair are an error: one would hide the other.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from avbench.errors import AvbenchError
from avbench.store.artefacts import (
    SCHEMA_VERSION,
    MergedArmEntry,
    MergedManifest,
    RunManifest,
    Versions,
)
from avbench.store.run_store import RunStore, utcnow


class MergeError(AvbenchError):
    """The runs cannot be merged (same cell twice, output exists, not a run)."""


@dataclass(frozen=True)
class MergeResult:
    store: RunStore
    cells: int
    failures: int
    sources: list[str]


def merge_runs(runs: list[Path], out: Path) -> MergeResult:
    if len(runs) < 1:
        raise MergeError("merge: give at least one run directory")
    stores = [RunStore.open(r) for r in runs]
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise MergeError(f"{out}: output directory exists and is not empty")
    manifests = [s.read_manifest() for s in stores]
    ids = [m.run_id or s.root.name for s, m in zip(stores, manifests, strict=True)]
    if len(set(ids)) != len(ids):
        raise MergeError(f"merge: a run is given twice ({', '.join(ids)})")

    rows_by_source = [s.finished_cells() for s in stores]
    all_ids = [cid for rows in rows_by_source for cid in rows]
    prefix = len(set(all_ids)) != len(all_ids)  # ids collide: name cells by pair too
    new_ids: dict[tuple[str, str], str] = {}
    for sid, m, rows in zip(ids, manifests, rows_by_source, strict=True):
        pair = m.pair_name
        for cid in rows:
            new = f"{pair}__{cid}" if prefix else cid
            if new in new_ids.values():
                other = next(k[0] for k, v in new_ids.items() if v == new)
                raise MergeError(f"merge: cell {cid} of pair {pair} is in both {other} and {sid}")
            new_ids[(sid, cid)] = new

    merged = RunStore.create(out.parent, out.name, _manifest(out.name, ids, manifests))
    n_cells = n_failures = 0
    for sid, store, m, rows in zip(ids, stores, manifests, rows_by_source, strict=True):
        pair = m.pair_name
        for cid, row in rows.items():
            new = new_ids[(sid, cid)]
            _copy_cell(store, merged, cid, new)
            merged.append_row(merged.cells_path, row | _origin(sid, cid, new))
            n_cells += 1
        for f in store.failures():
            cid = f.cell_id
            new = f"{pair}__{cid}" if prefix else cid
            merged.append_row(merged.failures_path, f.to_row() | _origin(sid, cid, new))
            n_failures += 1
        _copy_source(store, merged.root / "sources" / sid)
    return MergeResult(merged, n_cells, n_failures, ids)


def _origin(source: str, cell_id: str, new_id: str) -> dict[str, str]:
    return {"cell_id": new_id, "source_run": source, "source_cell_id": cell_id}


def _manifest(run_id: str, ids: list[str], manifests: list[RunManifest]) -> MergedManifest:
    pairs = list(dict.fromkeys(m.pair_name for m in manifests))
    first = manifests[0]
    return MergedManifest(
        schema_version=SCHEMA_VERSION,
        run_id=run_id,
        status="merged",
        mode="merged",
        merged_from=ids,
        merged_at=utcnow(),
        pairs=pairs,
        # A single-pair merge keeps the pair (reports title by it); several pairs have none.
        pair=first.pair if len(pairs) == 1 else {"name": " + ".join(pairs)},
        sweep=first.sweep,
        arms=[
            MergedArmEntry.model_validate(
                a.model_dump(exclude_unset=True) | {"pair": m.pair.get("name")}
            )
            for m in manifests
            for a in m.arms
        ],
        versions=first.versions or Versions(),
        started_at=min((m.started_at or "" for m in manifests), default=None),
        ended_at=max((m.ended_at or "" for m in manifests), default=None),
        sources=dict(zip(ids, manifests, strict=True)),
    )


def _copy_cell(src: RunStore, dst: RunStore, cell_id: str, new_id: str) -> None:
    rec = src.requests_path(cell_id)
    if rec.exists():
        table = pq.read_table(rec)
        if "cell_id" in table.column_names:
            i = table.column_names.index("cell_id")
            table = table.set_column(i, "cell_id", pa.array([new_id] * len(table), pa.string()))
        target = dst.requests_path(new_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, target)
    for which in ("before", "after"):
        scrape = src.scrape_path(cell_id, which)
        if scrape.exists():
            target = dst.scrape_path(new_id, which)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(scrape, target)


def _copy_source(src: RunStore, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src.manifest_path, dst / "manifest.json")
    if src.failures_path.exists():
        shutil.copyfile(src.failures_path, dst / "failures.jsonl")
    arms = src.root / "arms"
    if arms.is_dir():
        shutil.copytree(arms, dst / "arms")
