"""Result store: one directory per run; finished cells are appended once and never rewritten.

results/<run-id>/
  manifest.json            run description (pair, sweep, arms, commands, versions, host, times)
  cells.jsonl              one row per finished cell, appended + fsynced as each finishes
  failures.jsonl           one row per failed cell/arm with its reason (resume reruns them)
  requests/<cell>.parquet  per-request records of the cell (written before its cells.jsonl row)
  requests/failed/<cell>.<attempt>.parquet   what a failed cell measured (never read by reports)
  scrapes/<cell>.{before,after}.prom   raw /metrics around the measured window
  arms/<arm>/server.log    the server's output, secrets redacted

A crash can leave a torn last line in a .jsonl file: it is moved to <file>.torn (with a warning)
before the next append, so a new row never lands on a fragment. A full disk (ENOSPC) stops the
run with one line; nothing is half-written (the row is appended whole or cut back).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from avbench import __version__
from avbench.errors import StoreError, StoreFull
from avbench.loadgen.records import RequestRecord
from avbench.store.artefacts import (
    ADAPTIVE,
    MANIFEST,
    AdaptiveRecord,
    CpuLayoutEntry,
    Host,
    PlacementEntry,
    RunManifest,
    SweepManifest,
    Versions,
    WorkloadSource,
    dump_manifest,
    manifest_problem,
)
from avbench.store.failures import CellFailure, failure_problem


def utcnow(timespec: str = "seconds") -> str:
    return datetime.now(UTC).isoformat(timespec=timespec)


def new_run_id(pair: str) -> str:
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{pair}-{uuid.uuid4().hex[:6]}"


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def check_run_id(run_id: str) -> str:
    """A run id names one directory inside the results directory: no separators, no '..'."""
    if not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise StoreError(
            f"--run-id {run_id!r}: expected letters, digits, '.', '_' or '-' (no path "
            "separators or '..'), starting with a letter or digit"
        )
    return run_id


_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EROFS, errno.EACCES, errno.EPERM)


def _store_error(exc: OSError, path: Path, run_dir: Path | None = None) -> OSError | StoreError:
    """The one-line error for a failed write, or the OSError itself when it is unexpected."""
    if exc.errno in _FULL:
        resume = f"; free space, then avbench sweep --resume {run_dir}" if run_dir else ""
        return StoreFull(
            f"{path}: no space left on device (results kept so far are intact{resume})"
        )
    if exc.errno in _DENIED:
        return StoreError(f"{path}: not writable ({exc.strerror})")
    if isinstance(exc, (NotADirectoryError, FileExistsError)):
        return StoreError(f"{path}: a file is in the way where a directory is expected")
    return exc


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


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


def read_adaptive(root: Path) -> AdaptiveRecord | None:
    """An adaptive run's ``adaptive.json``; None for a run that is not adaptive. An unreadable
    one is a one-line StoreError naming the file."""
    path = Path(root) / ADAPTIVE
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path}: not an adaptive state file (not JSON: {exc})") from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return AdaptiveRecord.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "file"
        raise StoreError(f"{path}: not an adaptive state file ({where}: {err['msg']})") from None


def write_adaptive(root: Path, record: AdaptiveRecord) -> None:
    """``adaptive.json``, written whole (a crash leaves the previous one)."""
    data = record.model_dump_json(indent=2, exclude_unset=True) + "\n"
    try:
        _atomic_write(Path(root) / ADAPTIVE, data.encode())
    except OSError as exc:
        raise _store_error(exc, Path(root) / ADAPTIVE) from None


def write_together(root: Path, files: dict[str, bytes | Path]) -> None:
    """Write several files under ``root`` all or nothing (a report: its page, summary and
    figures). Each is staged whole and fsynced in a hidden folder of ``root``, then renamed
    into place; a failed write (a full disk) removes the staging folder and leaves ``root`` as
    it was. A value is the file's bytes, or a file elsewhere to copy."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=root, prefix=".staging-"))
    except OSError as exc:
        raise _store_error(exc, root) from None
    try:
        staged = []
        for name, content in files.items():
            data = content if isinstance(content, bytes) else Path(content).read_bytes()
            _atomic_write(stage / name, data)
            staged.append((stage / name, root / name))
        for tmp, final in staged:
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
    except OSError as exc:
        raise _store_error(exc, root) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _repair_torn_tail(path: Path, on_warning: Callable[[str], None]) -> None:
    """Move a last line without its newline (a crash mid-append) to ``<path>.torn``."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            if size == 0:
                return
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return
            fh.seek(max(0, size - (1 << 20)))
            tail = fh.read()
    except FileNotFoundError:
        return
    cut = tail.rfind(b"\n") + 1
    keep = size - (len(tail) - cut)
    torn = path.with_name(path.name + ".torn")
    with torn.open("ab") as fh:
        fh.write(tail[cut:] + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.truncate(path, keep)
    on_warning(
        f"{path}: last line was torn (a crash mid-write); moved its {size - keep} bytes to "
        f"{torn.name}; {_TORN_LOSS.get(path.name, 'that line is lost')}"
    )


# What a torn last line loses, per file: a cell row means a cell to measure again; a failure
# record only says why a cell failed, and that cell has no row, so --resume tries it anyway.
_TORN_LOSS = {
    "cells.jsonl": "that cell will be measured again",
    "failures.jsonl": "it was a failure record: only the reason a cell failed is lost (the cell "
    "is tried again on --resume as before)",
}


def _append_jsonl(
    path: Path, row: dict[str, Any], on_warning: Callable[[str], None] = warn
) -> None:
    """Append one whole line, or nothing: a failed write is cut back to where it began."""
    _repair_torn_tail(path, on_warning)
    line = (json.dumps(row, sort_keys=True, default=str) + "\n").encode()
    with path.open("ab") as fh:
        start = fh.tell()
        try:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        except OSError:
            os.truncate(path, start)
            raise


def _read_jsonl(
    path: Path, problem: Callable[[dict[str, Any]], str | None], on_warning: Callable[[str], None]
) -> list[dict[str, Any]]:
    """The rows of a .jsonl file; a line that is not one (not a JSON object, or ``problem``
    says why) is skipped with a one-line warning naming file:line, so one bad line never stops
    a reader."""
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if number == len(lines):
            # No newline after it: torn even when it parses; moved aside before the next append.
            on_warning(f"{path}:{number}: last line is torn (a crash mid-write); skipped")
            continue
        why: str | None
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            why = "not JSON"
        else:
            kind = _JSON_KINDS.get(type(row), "object")
            why = problem(row) if kind == "object" else f"a JSON {kind}, not a row (an object)"
        if why is None:
            rows.append(row)
        else:
            on_warning(f"{path}:{number}: {why}; line skipped")
    return rows


_JSON_KINDS = {
    list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"
}  # fmt: skip


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
        ("response_id", pa.string()),
        ("error", pa.string()),
        ("error_kind", pa.string()),
        ("prompt_text", pa.string()),
        ("prompt_messages", pa.string()),
        ("output_text", pa.string()),
        ("output_token_ids", pa.list_(pa.int64())),
        ("spec_per_step_accepted", pa.list_(pa.int32())),
        ("spec_per_step_drafted", pa.list_(pa.int32())),
        ("spec_acceptance_histogram", pa.list_(pa.int64())),
    ]
)


class RunStore:
    def __init__(self, root: Path, on_warning: Callable[[str], None] = warn):
        self.root = Path(root)
        self.on_warning = on_warning
        self._warned: set[str] = set()

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

    def failed_requests_path(self, cell_id: str, attempt: int) -> Path:
        return self.root / "requests" / "failed" / f"{cell_id}.{attempt}.parquet"

    def scrape_path(self, cell_id: str, which: str) -> Path:
        return self.root / "scrapes" / f"{cell_id}.{which}.prom"

    # -- creation / opening
    @classmethod
    def create(
        cls, results_dir: Path, run_id: str, manifest: RunManifest | Mapping[str, Any]
    ) -> RunStore:
        """A new run directory with its manifest (a mapping is validated into the model)."""
        check_results_dir(results_dir)
        store = cls(Path(results_dir) / check_run_id(run_id))
        if store.root.exists() and any(store.root.iterdir()):
            raise StoreError(
                f"{store.root}: run directory already exists; use --resume {store.root}"
            )
        existed = store.root.exists()
        try:
            store.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _store_error(exc, store.root) from None
        try:
            store.write_manifest(store._validated(manifest))
        except StoreError as exc:
            # Without its manifest the directory is no run --resume could open: leave none.
            if not existed:
                with contextlib.suppress(OSError):
                    store.root.rmdir()
            if isinstance(exc, StoreFull):
                raise StoreFull(
                    f"{store.root}: no space left on device; no run was created (free space, "
                    "then start the sweep again)"
                ) from None
            raise
        return store

    @classmethod
    def open(cls, path: Path) -> RunStore:
        store = cls(Path(path))
        if not store.manifest_path.is_file():
            raise StoreError(f"{store.root}: not a run directory (no manifest.json)")
        return store

    def require_writable(self) -> None:
        """Resuming appends rows: refuse a read-only run directory up front, and repair tails."""
        if not os.access(self.root, os.W_OK):
            raise StoreError(
                f"{self.root}: run directory is not writable (read-only?); copy it somewhere "
                "writable to resume it"
            )
        for path in (self.cells_path, self.failures_path):
            try:
                _repair_torn_tail(path, self.on_warning)
            except OSError as exc:
                raise _store_error(exc, path, self.root) from None

    def read_manifest(self) -> RunManifest:
        try:
            raw = json.loads(self.manifest_path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(f"{self.manifest_path}: corrupt manifest (not JSON: {exc})") from None
        except OSError as exc:
            raise StoreError(f"{self.manifest_path}: cannot read ({exc.strerror})") from None
        if not isinstance(raw, dict):
            raise StoreError(
                f"{self.manifest_path}: corrupt manifest (a JSON {type(raw).__name__}, expected "
                "an object)"
            )
        return self._validated(raw)

    def _validated(self, manifest: RunManifest | Mapping[str, Any]) -> RunManifest:
        """The one way a manifest becomes the model: a bad field is one line naming the file."""
        raw = manifest if isinstance(manifest, Mapping) else dump_manifest(manifest)
        try:
            return MANIFEST.validate_python(dict(raw))
        except ValidationError as exc:
            raise StoreError(f"{self.manifest_path}: {manifest_problem(exc)}") from None

    def write_manifest(self, manifest: RunManifest) -> None:
        data = json.dumps(dump_manifest(manifest), indent=2, sort_keys=True).encode()
        try:
            _atomic_write(self.manifest_path, data)
        except OSError as exc:
            raise _store_error(exc, self.manifest_path, self.root) from None

    @contextlib.contextmanager
    def _writer(self) -> Iterator[None]:
        """One writer of the run directory at a time: arms running side by side (each in its
        own process, or a Ray task) append rows and update the manifest, which is read, changed
        and written back whole. An advisory lock on the directory itself (no file added)."""
        fd = os.open(self.root, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def update_manifest(self, **fields: Any) -> RunManifest:
        """Replace top-level fields; the result is validated before it is written, atomically."""
        with self._writer():
            m = self._validated(dump_manifest(self.read_manifest()) | fields)
            self.write_manifest(m)
        return m

    def _sweep_manifest(self) -> SweepManifest:
        m = self.read_manifest()
        if not isinstance(m, SweepManifest):
            raise StoreError(f"{self.manifest_path}: a merged run, not a sweep")
        return m

    def _change_sweep_manifest(self, change: Callable[[SweepManifest], None]) -> SweepManifest:
        """Read, change and write back the sweep manifest, as its one writer at the time."""
        with self._writer():
            m = self._sweep_manifest()
            change(m)
            self.write_manifest(m)
        return m

    def record_cpu_layout(self, arm: str, layout: CpuLayoutEntry) -> None:
        """Where the arm's server processes were pinned, into its manifest entry."""

        def change(m: SweepManifest) -> None:
            for a in m.arms:
                if a.name == arm:
                    a.cpu_layout = layout

        self._change_sweep_manifest(change)

    def record_engine(self, arm: str, choices: dict[str, str | None]) -> SweepManifest:
        """What the arm's server chose (server_log.engine_choices), into its manifest entry."""

        def change(m: SweepManifest) -> None:
            for a in m.arms:
                if a.name == arm:
                    a.engine = choices

        return self._change_sweep_manifest(change)

    def record_workload_source(self, name: str, source: dict[str, Any]) -> None:
        """What a workload's prompts were (LoadedWorkload.manifest), once it is loaded."""

        def change(m: SweepManifest) -> None:
            m.workload_sources[name] = WorkloadSource.model_validate(source)
            m.workload_sources = m.workload_sources  # marks the field as set: it is written

        self._change_sweep_manifest(change)

    def record_placement(self, entry: PlacementEntry) -> None:
        """An arm session's host, GPUs and span: added when it starts, replaced (same arm,
        repeat and start) when it ends."""

        def change(m: SweepManifest) -> None:
            key = (entry.arm, entry.repeat, entry.started_at)
            kept = [p for p in m.placements if (p.arm, p.repeat, p.started_at) != key]
            m.placements = [*kept, entry]

        self._change_sweep_manifest(change)

    def end_placements(self, arm: str | None = None, repeat: int | None = None) -> None:
        """End, now, the placements left open by sessions that were lost (of ``arm`` and
        ``repeat``, or all): a lost session must not count as running beside later ones."""

        def change(m: SweepManifest) -> None:
            now = utcnow("microseconds")
            m.placements = [
                p.model_copy(update={"ended_at": now})
                if p.ended_at is None and arm in (None, p.arm) and repeat in (None, p.repeat)
                else p
                for p in m.placements
            ]

        self._change_sweep_manifest(change)

    # -- cells
    def finished_cells(self) -> dict[str, dict[str, Any]]:
        from avbench.store.cellrow import row_problem

        return {r["cell_id"]: r for r in _read_jsonl(self.cells_path, row_problem, self._warn)}

    def failures(self) -> list[CellFailure]:
        rows = _read_jsonl(self.failures_path, failure_problem, self._warn)
        return [CellFailure.model_validate(r) for r in rows]

    def _warn(self, message: str) -> None:
        """Each reader of a run reads its rows again: say each bad line once per command."""
        if message not in self._warned:
            self._warned.add(message)
            self.on_warning(message)

    def write_cell(
        self, row: dict[str, Any], records: Iterable[RequestRecord], scrapes: dict[str, str | None]
    ) -> None:
        """Persist one finished cell: records and scrapes first, the summary row last.

        A crash before the row is appended leaves the cell unfinished, so --resume reruns it.
        """
        from avbench.store.cellrow import validate_row

        cell_id = row["cell_id"]
        undefined = validate_row(row)
        if undefined:
            self.on_warning(
                f"cell {cell_id}: column(s) {', '.join(undefined)} have no definition "
                "(add them to avbench/store/cellrow.py)"
            )
        self._write_records(self.requests_path(cell_id), cell_id, records)
        for which, text in scrapes.items():
            if text is not None:
                path = self.scrape_path(cell_id, which)
                try:
                    _atomic_write(path, text.encode())
                except OSError as exc:
                    raise _store_error(exc, path, self.root) from None
        self._append(self.cells_path, row | {"finished_at": utcnow()})

    def write_failure(self, failure: CellFailure) -> None:
        self._append(self.failures_path, failure.to_row() | {"failed_at": utcnow()})

    def write_failed_cell(self, failure: CellFailure, records: Iterable[RequestRecord]) -> Path:
        """A cell judged failed: its records go aside (one file per attempt), its row to
        failures.jsonl. Returns the records' path."""
        cell_id = failure.cell_id
        attempt = 1 + sum(f.cell_id == cell_id for f in self.failures())
        path = self.failed_requests_path(cell_id, attempt)
        self._write_records(path, cell_id, records)
        rel = str(path.relative_to(self.root))
        self.write_failure(failure.model_copy(update={"attempt": attempt, "requests_file": rel}))
        return path

    def write_records(self, cell_id: str, records: Iterable[RequestRecord]) -> None:
        self._write_records(self.requests_path(cell_id), cell_id, records)

    def _write_records(self, path: Path, cell_id: str, records: Iterable[RequestRecord]) -> None:
        rows = [r.to_row() | {"cell_id": cell_id} for r in records]
        table = pa.Table.from_pylist(rows, schema=_RECORD_SCHEMA)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, tmp)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)  # frees what the partial file took
            raise _store_error(exc, path, self.root) from None

    def append_row(self, path: Path, row: dict[str, Any]) -> None:
        """Append a row that is already complete (merge copies other runs' rows) to one of
        this run's .jsonl files: whole and fsynced, or not at all."""
        self._append(path, row)

    def _append(self, path: Path, row: dict[str, Any]) -> None:
        try:
            with self._writer():
                _append_jsonl(path, row, self.on_warning)
        except OSError as exc:
            raise _store_error(exc, path, self.root) from None

    def cells_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.finished_cells().values()))

    def read_records(self, cell_id: str) -> list[RequestRecord]:
        """A finished cell's request records, as the load driver made them."""
        fields = set(RequestRecord.__dataclass_fields__)
        rows = pq.read_table(self.requests_path(cell_id)).to_pylist()
        # None (a column older files lack) falls back to the field's default.
        return [
            RequestRecord(**{k: v for k, v in r.items() if k in fields and v is not None})
            for r in rows
        ]

    def records_frame(self, cell_id: str | None = None) -> pd.DataFrame:
        if cell_id is not None:
            return pd.read_parquet(self.requests_path(cell_id))
        files = sorted((self.root / "requests").glob("*.parquet"))
        if not files:
            return pd.DataFrame(columns=_RECORD_SCHEMA.names)
        return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def check_results_dir(results_dir: Path) -> None:
    """--results must be (or become) a writable directory: one line naming it otherwise."""
    path = Path(results_dir)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise StoreError(f"--results {path}: {existing} is a file, expected a directory")
    if existing is not None and not os.access(existing, os.W_OK):
        raise StoreError(f"--results {path}: {existing} is not writable (read-only?)")


# ----------------------------------------------------------------------------- environment facts
def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def host_info() -> Host:
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
    return Host(
        hostname=socket.gethostname(),
        platform=platform.platform(),
        cpu=cpu,
        cpu_count=os.cpu_count(),
        gpus=gpus.splitlines() if gpus else [],
        python=sys.version.split()[0],
    )


def git_commit() -> str | None:
    repo = Path(__file__).resolve().parents[2]
    commit = _run(["git", "-C", str(repo), "rev-parse", "HEAD"])
    if commit and _run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"]):
        commit += "-dirty"
    return commit


def versions(vllm_distribution: str | None, vllm_version: str | None) -> Versions:
    return Versions(
        avbench=__version__,
        vllm=f"{vllm_distribution} {vllm_version}" if vllm_distribution else None,
        python=sys.version.split()[0],
    )
