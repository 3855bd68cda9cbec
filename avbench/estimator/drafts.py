"""The labeled-draft dataset: one parquet row per *labeled* draft token.

Label 1 = accepted by the target, 0 = the first rejected draft of its step. Drafts after the
first rejection (and drafts trimmed by AV) carry no label and are not stored. ``position`` is
1-based (position 1 is the first draft of a step). Files are named ``*.drafts.parquet``;
estimator logs (one row per refit and position) ``*.estimator.parquet``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from avbench.capture_protocol import DRAFT_COLUMNS, arrow_fields
from avbench.errors import AvbenchError


class DraftsError(AvbenchError):
    """A labeled-draft file or table does not follow the schema."""


DRAFTS_SUFFIX = ".drafts.parquet"
ESTIMATOR_SUFFIX = ".estimator.parquet"

_STREAM_KEYS = ("run_id", "pair_id", "workload_id")
# A live capture's draft columns (avbench.capture_protocol) under the stream ids, then:
DRAFT_SCHEMA = pa.schema(
    [pa.field(k, pa.string(), nullable=False) for k in _STREAM_KEYS]
    + arrow_fields(DRAFT_COLUMNS)
    + [
        # Exact probability that this draft is accepted, sum_x min(p(x), q(x)) over the target's
        # p and the drafter's q at this position: known offline (`avbench trace`), null in live
        # captures (vLLM does not compute it) and in files written before the column existed.
        pa.field("expected_accept", pa.float64(), nullable=True),
    ]
)
# Columns a reader fills with nulls when a file lacks them (added after files were written).
_LATER_COLUMNS = ("expected_accept",)

ESTIMATOR_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("workload_id", pa.string(), nullable=False),
        pa.field("round", pa.int32(), nullable=False),
        pa.field("end_step", pa.int64(), nullable=False),
        pa.field("position", pa.int16(), nullable=False),  # 1-based
        pa.field("omega", pa.float64(), nullable=False),
        pa.field("beta", pa.float64(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),  # labels at this position in the round
        pa.field("moved", pa.bool_(), nullable=False),  # the refit changed some parameter
        # Why vLLM's guard masked the slope step ("nan", "negative-slope"), else null; the
        # intercepts move either way.
        pa.field("slope_masked", pa.string(), nullable=True),
    ]
)

_KEYS = (*_STREAM_KEYS, "request_id", "step")


def _fail(source: str, field: str, what: str) -> DraftsError:
    return DraftsError(f"{source}: field '{field}': {what}")


def validate_drafts(
    df: pd.DataFrame, source: str = "drafts", structure: bool = True
) -> pd.DataFrame:
    """Check columns, types and value ranges; return the frame cast to the schema's dtypes.

    With ``structure`` also check that every (request, step) holds positions 1..n with label 0
    only at its last position (the labeled-prefix rule).
    """
    missing = [c for c in _LATER_COLUMNS if c not in df.columns]
    if missing:
        df = df.assign(**{c: np.nan for c in missing})
    for fld in DRAFT_SCHEMA:
        if fld.name not in df.columns:
            raise _fail(source, fld.name, "missing column")
        if not fld.nullable and df[fld.name].isna().any():
            raise _fail(source, fld.name, "null values in a required column")
    out = df[[f.name for f in DRAFT_SCHEMA]]  # copy-on-write: columns are copied only if cast
    for name in ("step", "position", "label"):
        col = out[name].to_numpy()
        if not np.issubdtype(col.dtype, np.integer):
            raise _fail(source, name, f"expected integers, got {col.dtype}")
    for name in (
        "q_max",
        "logit_q_max",
        "q_sampled",
        "entropy",
        "estimator_pred",
        "head_score",
        "temperature",
        "expected_accept",
    ):
        if out[name].dtype == np.float64:
            continue
        try:
            out[name] = out[name].astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise _fail(source, name, f"expected numbers ({exc})") from None
    lab = out["label"].to_numpy()
    if not np.isin(lab, (0, 1)).all():
        raise _fail(source, "label", "expected 0 or 1 (unlabeled drafts must not be stored)")
    pos = out["position"].to_numpy()
    if (pos < 1).any():
        raise _fail(source, "position", "expected 1-based positions >= 1")
    for name in ("q_max", "q_sampled"):
        v = out[name].to_numpy()
        if not ((v > 0) & (v <= 1)).all():
            raise _fail(source, name, "expected probabilities in (0, 1]")
    if (out["entropy"].to_numpy() < -1e-9).any():
        raise _fail(source, "entropy", "expected non-negative entropy (nats)")
    for name in ("estimator_pred", "head_score", "expected_accept"):
        v = out[name].to_numpy()
        v = v[~np.isnan(v)]
        if ((v < 0) | (v > 1)).any():
            raise _fail(source, name, "expected probabilities in [0, 1] or null")
    if (out["temperature"].to_numpy() < 0).any():
        raise _fail(source, "temperature", "expected temperature >= 0")
    if structure and len(out):
        _check_prefix_structure(out, source)
    for name, dt in (("step", np.int64), ("position", np.int16), ("label", np.int8)):
        if out[name].dtype != dt:
            out[name] = out[name].astype(dt)
    return out


def _check_prefix_structure(df: pd.DataFrame, source: str) -> None:
    keys = df[list(_KEYS)]
    gid = keys.groupby(list(_KEYS), sort=False, observed=True).ngroup().to_numpy()
    pos = df["position"].to_numpy().astype(np.int64)
    lab = df["label"].to_numpy()
    order = np.lexsort((pos, gid))
    g, p, y = gid[order], pos[order], lab[order]
    start = np.ones(len(g), dtype=bool)
    start[1:] = g[1:] != g[:-1]
    idx = np.arange(len(g))
    first = np.maximum.accumulate(np.where(start, idx, 0))
    if not np.array_equal(p, idx - first + 1):
        raise _fail(
            source, "position", "each (request, step) must hold positions 1..n without gaps"
        )
    end = np.ones(len(g), dtype=bool)
    end[:-1] = start[1:]
    if ((y == 0) & ~end).any():
        raise _fail(
            source, "label", "a rejected draft (0) must be the last labeled draft of its step"
        )


def drafts_path(run_dir: Path, cell_id: str) -> Path:
    """Where a sweep files one cell's captured drafts."""
    return run_dir / "drafts" / f"{cell_id}{DRAFTS_SUFFIX}"


def captured_to_drafts(captured: pd.DataFrame, ids: dict[str, str]) -> pd.DataFrame:
    """The labeled rows of a live capture as a DRAFT_SCHEMA frame of one stream (``ids`` gives
    run_id, pair_id and workload_id)."""
    lab = captured[captured["label"].isin((0, 1))]
    out = lab.assign(**{k: ids[k] for k in _STREAM_KEYS}, expected_accept=np.nan)
    return out[[f.name for f in DRAFT_SCHEMA]].reset_index(drop=True)


def to_table(df: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(
        df[[f.name for f in DRAFT_SCHEMA]], schema=DRAFT_SCHEMA, preserve_index=False
    )


def write_drafts(df: pd.DataFrame, path: Path) -> Path:
    """Validate and write atomically (a partial file never carries the final name)."""
    df = validate_drafts(df, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(to_table(df), tmp)
    tmp.replace(path)
    return path


def read_drafts(path: Path, structure: bool = False) -> pd.DataFrame:
    try:
        table = pq.read_table(path)
        df = table.to_pandas(strings_to_categorical=True)  # ids repeat: categories save memory
    except (OSError, pa.ArrowInvalid) as exc:
        raise DraftsError(f"{path}: not a readable parquet file ({exc})") from None
    return validate_drafts(df, str(path), structure=structure)


def write_estimator_log(df: pd.DataFrame, path: Path) -> Path:
    for fld in ESTIMATOR_SCHEMA:
        if fld.name not in df.columns:
            raise _fail(str(path), fld.name, "missing column in estimator log")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    table = pa.Table.from_pandas(
        df[[f.name for f in ESTIMATOR_SCHEMA]], schema=ESTIMATOR_SCHEMA, preserve_index=False
    )
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def read_estimator_log(path: Path) -> pd.DataFrame:
    try:
        df = pq.read_table(path).to_pandas()
    except (OSError, pa.ArrowInvalid) as exc:
        raise DraftsError(f"{path}: not a readable parquet file ({exc})") from None
    for fld in ESTIMATOR_SCHEMA:
        if fld.name not in df.columns:
            raise _fail(str(path), fld.name, "missing column in estimator log")
    return df


def find_files(sources: Iterable[Path], suffix: str) -> list[Path]:
    """Files with ``suffix`` given directly or found anywhere under the given directories."""
    found: list[Path] = []
    for src in sources:
        src = Path(src)
        if src.is_file():
            if src.name.endswith(suffix):
                found.append(src)
        elif src.is_dir():
            found.extend(sorted(p for p in src.rglob(f"*{suffix}") if p.is_file()))
        else:
            raise DraftsError(
                f"{src}: no such file or directory (expected a run directory or {suffix} file)"
            )
    return found
