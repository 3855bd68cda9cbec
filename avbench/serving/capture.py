"""Live captures in a sweep, the server's side: turn the vLLM plugin on per arm, and read what
it wrote.

A speculative arm with captures on gets ``AVBENCH_CAPTURE_DIR=<run>/arms/<arm>/capture`` in its
server's environment (see ``avbench.vllm_plugin``). This module reads that directory: captured
draft rows, refit lines, step lines, the writers' status and flush marks, and sums them up as
cell columns; the runner files them per cell (``avbench.run.cell_captures``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from avbench.capture_protocol import (
    CAPTURE_KINDS,
    CAPTURE_SUFFIX,
    FLUSH_REQUEST,
    FLUSHED_GLOB,
    LABEL_ACCEPTED,
    LABEL_TRIMMED,
    REFIT_COLUMNS,
    STATUS_GLOB,
    STEPS_GLOB,
    CaptureFileError,
    Status,
    capture_env_vars,
    capture_schema,
    estimators_since,
    json_lines,
    plugin_env,
    refit_lines,
)
from avbench.errors import AvbenchError

STEPS_SUFFIX = ".steps.parquet"
COLD_SLOPE, COLD_INTERCEPT = 0.5, -0.2  # vLLM's cold start (acceptance_estimator.py)
NO_ESTIMATOR = (
    "no estimator ran in this arm's server (no AV, or AV with a DSpark confidence head): "
    "no coefficients"
)


@dataclass(frozen=True)
class CaptureSettings:
    kinds: tuple[str, ...]
    draft_fraction: float = 1.0


def settings_for(pair, sweep) -> CaptureSettings | None:
    """The pair's capture settings when it sets them, else the sweep's; None when off."""
    kinds = pair.capture if pair.capture is not None else sweep.capture
    if not kinds:
        return None
    fraction = pair.draft_fraction if pair.draft_fraction is not None else sweep.draft_fraction
    return CaptureSettings(tuple(dict.fromkeys(kinds)), fraction)


def capture_dir(arm_dir: Path) -> Path:
    return arm_dir / "capture"


def capture_env(settings: CaptureSettings, directory: Path, env: dict[str, str]) -> dict[str, str]:
    """Environment that turns the plugin on for one server (merged over ``env``)."""
    return capture_env_vars(directory, settings.kinds, settings.draft_fraction) | plugin_env(env)


# ----------------------------------------------------------------------------- reading
class RefitCaptureError(AvbenchError):
    """A refit capture file cannot be read."""


def read_refits(root: Path) -> pd.DataFrame:
    """``refit_lines`` as a frame, one row per refit line."""
    try:
        lines = refit_lines(root)
    except CaptureFileError as exc:
        raise RefitCaptureError(str(exc)) from None
    return pd.DataFrame(lines, columns=[*REFIT_COLUMNS, "file"])


def read_status(directory: Path) -> list[Status]:
    out = []
    for p in sorted(directory.glob(STATUS_GLOB)):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def wait_flushed(directory: Path, t_end: float, since: float, timeout_s: float = 15.0) -> bool:
    """Ask every capture process of this server to flush and wait until each has written what
    it had at ``t_end`` (writers look every second). False on timeout: the cell keeps what is
    on disk."""
    request = directory / FLUSH_REQUEST
    tmp = request.with_name(f".{request.name}.tmp")
    tmp.write_text(repr(t_end))
    os.replace(tmp, request)
    start = time.monotonic()
    while True:
        # A live writer rewrites its status every second; older ones belong to dead processes.
        recent = max(since, t_end - 10.0)
        live = [
            s for s in read_status(directory) if s.get("time", 0) >= recent and not s.get("closed")
        ]
        if live and all(s.get("flushed_at", 0) >= t_end for s in live):
            return True
        waited = time.monotonic() - start
        if not live and waited > 2.5:  # no writer ever started: nothing was captured
            return True
        if waited >= timeout_s:
            return False
        time.sleep(0.2)


def read_captured(directory: Path, request_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """Captured draft rows (``capture_schema()``) of the given client request ids (all if None).

    Only complete shards carry the final name, so a crash leaves nothing half-written to read.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    schema = capture_schema()
    ids = None if request_ids is None else pa.array(sorted(set(request_ids)), pa.string())
    tables = []
    for p in sorted(directory.glob(f"*{CAPTURE_SUFFIX}")):
        try:
            t = pq.read_table(p, schema=schema)
        except (OSError, pa.ArrowInvalid) as exc:
            raise AvbenchError(f"{p}: unreadable capture shard ({exc})") from None
        if ids is not None:
            t = t.filter(pc.is_in(t["request_id"], value_set=ids))
        tables.append(t)
    if not tables:
        return schema.empty_table().to_pandas()
    return pa.concat_tables(tables).to_pandas()


def verified_summary(captured: pd.DataFrame) -> dict:
    """Cell columns from captured draft rows (every label): how many scheduled drafts the target
    verified (AV trims the rest before verification, ``LABEL_TRIMMED``) and how many of those it
    accepted. vLLM's counters see only the scheduled drafts, so under AV this is the only
    acceptance per verified draft there is."""
    if captured.empty:
        return {}
    label = captured["label"].to_numpy()
    scheduled = len(captured)
    verified = int((label != LABEL_TRIMMED).sum())
    accepted = int((label == LABEL_ACCEPTED).sum())
    drafts = len(captured.drop_duplicates(["pid", "engine_request_id", "step"]))
    return {
        "captured_drafts": drafts,
        "captured_scheduled_tokens": scheduled,
        "captured_verified_tokens": verified,
        "captured_accepted_tokens": accepted,
        "trimmed_share": (scheduled - verified) / scheduled,
        "verified_acceptance_rate": accepted / verified if verified else None,
        "verified_tokens_per_draft": verified / drafts,
    }


def _first_rank(refits: pd.DataFrame) -> pd.DataFrame:
    # Tensor-parallel ranks refit identically; each data-parallel rank has its own estimator.
    if refits.empty:
        return refits
    tp0 = refits[refits["tp_rank"].fillna(0) == 0]
    return tp0[tp0["dp_rank"].fillna(0) == tp0["dp_rank"].fillna(0).min()]


def refit_summary(refits: pd.DataFrame, since: float, t0: float, t1: float, k: int) -> dict:
    """Cell columns: refits in [t0, t1] and the coefficients at t0 and at t1, for the
    estimator of the server started at ``since`` (one that ran: see ``estimator_ran``)."""
    r = _first_rank(refits.sort_values(["time", "refit_index"], kind="stable"))
    r = r[r["time"] >= since] if not r.empty else r
    before = r[r["time"] < t0] if not r.empty else r
    during = r[(r["time"] >= t0) & (r["time"] <= t1)] if not r.empty else r
    cold: dict[str, Any] = {"slope": COLD_SLOPE, "intercepts": [COLD_INTERCEPT] * k}
    start: dict[str, Any] = before.iloc[-1].to_dict() if len(before) else cold
    end: dict[str, Any] = during.iloc[-1].to_dict() if len(during) else start
    pid = end.get("pid")
    return {
        "refits": len(during),
        "refit_pid": None if pid is None else int(pid),
        "refit_first": int(during["refit_index"].iloc[0]) if len(during) else None,
        "refit_last": int(during["refit_index"].iloc[-1]) if len(during) else None,
        "slope_start": float(start["slope"]),
        "intercepts_start": [float(x) for x in start["intercepts"]],
        "slope_end": float(end["slope"]),
        "intercepts_end": [float(x) for x in end["intercepts"]],
    }


def estimator_ran(ac: ArmCapture, refits: pd.DataFrame) -> bool:
    """Whether vLLM's online estimator ran in this arm's server: only AV arms create one, and
    not when a DSpark confidence head decides instead. The plugin marks the first step() of
    each estimator; refit lines are proof too."""
    from avbench.plan.cells import Arm

    if Arm.parse(ac.arm).kind != "av":
        return False
    if estimators_since(ac.directory, ac.server_started):
        return True
    return not refits.empty and bool((refits["time"] >= ac.server_started).any())


# ----------------------------------------------------------------------------- per cell
@dataclass(frozen=True)
class ArmCapture:
    """One launched server of a speculative arm with captures on."""

    directory: Path
    settings: CaptureSettings
    run_id: str
    pair: str
    arm: str
    k: int
    server_started: float  # unix time the server was launched


def arm_capture(store, opts, arm) -> ArmCapture | None:
    """Captures for this arm's next server, None when off or for the baseline.

    A launched server writes to ``<run>/arms/<arm>/capture`` (created here: the plugin stays
    inert unless the directory exists); an attached one (``--endpoint``) to the ``capture_dir``
    it was started with, if given, with every capture kind unless the suite names some."""
    settings = settings_for(opts.pair, opts.sweep)
    if arm.kind == "baseline":
        # Only step timings mean something without a drafter (the verify cost of few tokens).
        if settings is None or "steps" not in settings.kinds:
            return None
        settings = CaptureSettings(("steps",), settings.draft_fraction)
    if opts.endpoint:
        if opts.capture_dir is None:
            return None
        settings = settings or CaptureSettings(CAPTURE_KINDS)
        directory, started = Path(opts.capture_dir), 0.0
    else:
        if settings is None:
            return None
        directory, started = capture_dir(store.arm_dir(arm.name)), time.time()
        directory.mkdir(parents=True, exist_ok=True)
    return ArmCapture(
        directory, settings, store.root.name, opts.pair.name, arm.name, arm.k, started
    )


# ----------------------------------------------------------------------------- steps
def steps_path(run_dir: Path, cell_id: str) -> Path:
    return run_dir / "steps" / f"{cell_id}{STEPS_SUFFIX}"


def wait_steps_flushed(
    directory: Path, t_end: float, since: float, timeout_s: float = 10.0
) -> bool:
    """Wait until every live step writer (its ``steps.*.flushed`` rewritten since the server
    started, four times a second) has written the steps that began before ``t_end``."""
    start = time.monotonic()
    while True:
        values = []
        for p in directory.glob(FLUSHED_GLOB):
            try:
                if p.stat().st_mtime >= max(since, t_end - 5.0):
                    values.append(float(p.read_text()))
            except (OSError, ValueError):
                continue
        waited = time.monotonic() - start
        done = all(v >= t_end for v in values) and (values or waited > 1.0)  # a writer may start
        if done or waited >= timeout_s:
            return bool(done)
        time.sleep(0.1)


def read_steps(directory: Path) -> pd.DataFrame:
    """Every step line of a capture directory, with ``request_ids`` (client ids) in place of
    the request codes. A torn last line (a process killed mid-write) is skipped."""
    steps, names = [], {}
    for path in sorted(directory.glob(STEPS_GLOB)):
        try:
            rows = list(json_lines(path))
        except ValueError as exc:
            where, why = exc.args
            raise AvbenchError(f"{where}: not a step line ({why})") from None
        for _, row in rows:
            if row.get("kind") == "request":
                names[(path.name, row["code"])] = row["request_id"]
            else:
                steps.append(row | {"writer": path.name})
    for row in steps:
        row["request_ids"] = [names.get((row["writer"], c), "") for c in row.pop("reqs")]
    return pd.DataFrame(steps)
