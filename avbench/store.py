"""Result store: one directory per run; finished cells are appended once and never rewritten.

results/<run-id>/
  manifest.json            run description (pair, sweep, arms, commands, versions, host, times)
  cells.jsonl              one row per finished cell, appended + fsynced as each finishes
  failures.jsonl           one row per failed cell/arm with its reason (resume reruns them)
  requests/<cell>.parquet  per-request records of the cell (written before its cells.jsonl row)
  scrapes/<cell>.{before,after}.prom   raw /metrics around the measured window
  arms/<arm>/server.log    the server's output, secrets redacted
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from avbench import __version__
from avbench.errors import AvbenchError
from avbench.records import RequestRecord


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def new_run_id(pair: str) -> str:
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{pair}-{uuid.uuid4().hex[:6]}"


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _append_jsonl(path: Path, row: dict) -> None:
    line = json.dumps(row, sort_keys=True, default=str) + "\n"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a crash mid-write: ignore it, the cell reruns
    return rows


_RECORD_SCHEMA = pa.schema(
    [
        ("cell_id", pa.string()),
        ("conversation_id", pa.string()),
        ("turn", pa.int32()),
        ("warmup", pa.bool_()),
        ("queued_at", pa.float64()),
        ("sent_at", pa.float64()),
        ("ttft", pa.float64()),
        ("e2e", pa.float64()),
        ("chunk_times", pa.list_(pa.float64())),
        ("chunk_tokens", pa.list_(pa.int32())),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("status", pa.int32()),
        ("finish_reason", pa.string()),
        ("error", pa.string()),
        ("error_kind", pa.string()),
        ("prompt_text", pa.string()),
        ("prompt_messages", pa.string()),
        ("output_text", pa.string()),
    ]
)


class RunStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    # -- layout
    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    @property
    def cells_path(self) -> Path:
        return self.root / "cells.jsonl"

    @property
    def failures_path(self) -> Path:
        return self.root / "failures.jsonl"

    def arm_dir(self, arm: str) -> Path:
        return self.root / "arms" / arm

    def requests_path(self, cell_id: str) -> Path:
        return self.root / "requests" / f"{cell_id}.parquet"

    def scrape_path(self, cell_id: str, which: str) -> Path:
        return self.root / "scrapes" / f"{cell_id}.{which}.prom"

    # -- creation / opening
    @classmethod
    def create(cls, results_dir: Path, run_id: str, manifest: dict) -> RunStore:
        store = cls(Path(results_dir) / run_id)
        if store.root.exists() and any(store.root.iterdir()):
            raise AvbenchError(f"{store.root}: run directory already exists; use --resume {run_id}")
        store.root.mkdir(parents=True, exist_ok=True)
        store.write_manifest(manifest)
        return store

    @classmethod
    def open(cls, path: Path) -> RunStore:
        store = cls(Path(path))
        if not store.manifest_path.exists():
            raise AvbenchError(f"{store.root}: not a run directory (no manifest.json)")
        return store

    def read_manifest(self) -> dict:
        try:
            return json.loads(self.manifest_path.read_text())
        except json.JSONDecodeError as exc:
            raise AvbenchError(f"{self.manifest_path}: corrupt manifest: {exc}") from None

    def write_manifest(self, manifest: dict) -> None:
        _atomic_write(
            self.manifest_path, json.dumps(manifest, indent=2, sort_keys=True, default=str).encode()
        )

    def update_manifest(self, **fields) -> dict:
        m = self.read_manifest() | fields
        self.write_manifest(m)
        return m

    # -- cells
    def finished_cells(self) -> dict[str, dict]:
        return {r["cell_id"]: r for r in _read_jsonl(self.cells_path)}

    def failures(self) -> list[dict]:
        return _read_jsonl(self.failures_path)

    def write_cell(self, row: dict, records: Iterable[RequestRecord], scrapes: dict) -> None:
        """Persist one finished cell: records and scrapes first, the summary row last.

        A crash before the row is appended leaves the cell unfinished, so --resume reruns it.
        """
        cell_id = row["cell_id"]
        self.write_records(cell_id, records)
        for which, text in scrapes.items():
            if text is not None:
                _atomic_write(self.scrape_path(cell_id, which), text.encode())
        _append_jsonl(self.cells_path, row | {"finished_at": utcnow()})

    def write_failure(self, row: dict) -> None:
        _append_jsonl(self.failures_path, row | {"failed_at": utcnow()})

    def write_records(self, cell_id: str, records: Iterable[RequestRecord]) -> None:
        rows = [r.to_row() | {"cell_id": cell_id} for r in records]
        table = pa.Table.from_pylist(rows, schema=_RECORD_SCHEMA)
        path = self.requests_path(cell_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)

    def cells_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.finished_cells().values()))

    def records_frame(self, cell_id: str | None = None) -> pd.DataFrame:
        if cell_id is not None:
            return pd.read_parquet(self.requests_path(cell_id))
        files = sorted((self.root / "requests").glob("*.parquet"))
        if not files:
            return pd.DataFrame(columns=_RECORD_SCHEMA.names)
        return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


# ----------------------------------------------------------------------------- environment facts
def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def host_info() -> dict:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpus = _run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    )
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "gpus": gpus.splitlines() if gpus else [],
        "python": sys.version.split()[0],
    }


def git_commit() -> str | None:
    repo = Path(__file__).resolve().parent.parent
    commit = _run(["git", "-C", str(repo), "rev-parse", "HEAD"])
    if commit and _run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"]):
        commit += "-dirty"
    return commit


def versions(vllm_distribution: str | None, vllm_version: str | None) -> dict:
    return {
        "avbench": __version__,
        "vllm": f"{vllm_distribution} {vllm_version}" if vllm_distribution else None,
        "python": sys.version.split()[0],
    }
