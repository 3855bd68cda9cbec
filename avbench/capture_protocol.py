"""What the avbench vLLM plugin and the sweep agree on: the capture protocol, in one place.

The sweep starts a server with these environment variables (``capture_env_vars``), the plugin
in each vLLM process writes these files into the capture directory, and the sweep reads them
back per cell (``avbench.serving.capture``). Standard library only: every vLLM process imports this at
plugin registration, so it costs nothing there (pyarrow is imported only to build the schema).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    import pyarrow as pa

# ----------------------------------------------------------------------------- environment
ENV_DIR = "AVBENCH_CAPTURE_DIR"  # an existing directory: captures on
ENV_WHAT = "AVBENCH_CAPTURE"  # comma-separated CAPTURE_KINDS (default: all)
ENV_FRACTION = "AVBENCH_CAPTURE_DRAFT_FRACTION"  # share of requests whose drafts are captured
ENV_CPU_FIX = "AVBENCH_CPU_EXPAND_FIX"  # "1": the CPU build's expand kernel fix
ENV_CPU_SEED_FIX = "AVBENCH_CPU_SEED_FIX"  # "1": the CPU build's seeded prefill rewind fix
# The server log line each applied fix writes, read back into the cell rows' server_patched
# (avbench.serving.server_log): "<mark> <what> (<how>)".
PATCH_LOG_MARK = "avbench: server patched:"
PLUGIN_NAME = "avbench"  # the vllm.general_plugins entry point
# Each launched server gets this ASGI middleware (vLLM's --middleware): POST PREFIX_RESET_PATH
# empties its prefix cache, so a cell does not start on the prefixes of earlier cells' prompts.
PREFIX_RESET_MIDDLEWARE = "avbench.vllm_plugin.prefix_reset.prefix_reset_route"
PREFIX_RESET_PATH = "/avbench/reset_prefix_cache"
CAPTURE_KINDS = ("drafts", "refits", "steps")


def capture_env_vars(directory: Path, kinds: tuple[str, ...], draft_fraction: float) -> dict:
    """The variables that turn captures on in one server."""
    return {
        ENV_DIR: str(directory),
        ENV_WHAT: ",".join(kinds),
        ENV_FRACTION: repr(draft_fraction),
    }


def plugin_env(env: dict[str, str]) -> dict[str, str]:
    """What to add to a server's ``env`` so vLLM loads the plugin: nothing, unless
    ``VLLM_PLUGINS`` selects plugins explicitly and leaves it out."""
    plugins = env.get("VLLM_PLUGINS")
    if plugins is None or PLUGIN_NAME in plugins.split(","):
        return {}
    return {"VLLM_PLUGINS": f"{plugins},{PLUGIN_NAME}" if plugins else PLUGIN_NAME}


# ----------------------------------------------------------------------------- files
STATUS_GLOB = "status-*.json"  # one per process: ``status_name(pid)``
FLUSH_REQUEST = "flush-request"  # written by the sweep at the end of each cell: a unix time
CAPTURE_SUFFIX = ".capture.parquet"  # draft shards, ``drafts-<pid>-<token>-<n>`` + suffix
STEPS_GLOB = "steps.*.jsonl"  # step lines, ``steps.<pid>.<token>.jsonl``
FLUSHED_GLOB = "steps.*.flushed"  # the time up to which a step writer's lines are on disk
REFITS_GLOB = "refits.*.jsonl"  # refit lines, ``refits.<pid>.jsonl``
# Written once per process, on the first step() of an estimator: proof that one ran (AV arms
# with a confidence head, and arms without AV, have none).
ESTIMATOR_GLOB = "estimator.*.json"


def status_name(pid: int) -> str:
    return f"status-{pid}.json"


def refits_name(pid: int) -> str:
    return f"refits.{pid}.jsonl"


def estimator_name(pid: int) -> str:
    return f"estimator.{pid}.json"


class Status(TypedDict, total=False):
    """A process's ``status-<pid>.json``, rewritten atomically with each flush and at exit."""

    pid: int
    time: float  # unix time of the write; a live writer rewrites it every second
    vllm: str
    errors: dict[str, int]  # exceptions caught per hook
    first_error: dict[str, str]
    inert: list[str]  # why a capture stayed off
    installed: list[str]  # the hooks in place
    flushed_at: float  # drafts verified up to this time are in shards
    closed: bool  # the writer has exited
    rows_written: int
    shards: int
    shard_prefix: str
    labeler: dict[str, int]  # the labeler's counters


# A refit line's fields (refits.<pid>.jsonl).
REFIT_COLUMNS = (
    "time",
    "pid",
    "tp_rank",
    "dp_rank",
    "refit_index",
    "step_count",
    "slope",
    "intercepts",
    "label_counts",
    "capture_errors",
)


class CaptureFileError(ValueError):
    """A capture file holds a line that is not what the file holds."""


def json_lines(
    path: Path, check: Callable[[dict], None] = lambda row: None
) -> Iterator[tuple[int, dict]]:
    """(line number, row) of each JSON line of a capture file; ``check`` raises ValueError on
    a row that is not what the file holds. A torn last line (no newline after it: a process
    killed mid-write) is skipped; any other bad line raises ValueError("file:line", why)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            check(row)
        except (json.JSONDecodeError, ValueError) as exc:
            if i == len(lines) - 1:
                continue
            raise ValueError(f"{path}:{i + 1}", str(exc)) from None
        yield i + 1, row


def estimators_since(root: Path, since: float) -> list[dict]:
    """The estimator markers under ``root`` written at or after ``since`` (unix time)."""
    out = []
    for path in sorted(Path(root).glob(ESTIMATOR_GLOB)):
        try:
            marker = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if marker.get("time", 0) >= since:
            out.append(marker)
    return out


def refit_lines(root: Path) -> list[dict[str, Any]]:
    """Every refit line under ``root`` (searched recursively) as a dict of ``REFIT_COLUMNS``
    plus ``file`` (relative to ``root``), by file then refit index. A torn last line (a process
    killed mid-write) is skipped; any other unreadable line is a ``CaptureFileError`` naming
    the file and line. Standard library only (the GPU check runs where pandas may be absent)."""
    root = Path(root)
    if not root.is_dir():
        raise CaptureFileError(f"{root}: not a directory (expected a capture directory)")

    def check(row: dict) -> None:
        missing = [c for c in REFIT_COLUMNS if c not in row]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")

    rows = []
    for path in sorted(root.rglob(REFITS_GLOB)):
        try:
            for _, row in json_lines(path, check):
                rows.append(
                    {c: row[c] for c in REFIT_COLUMNS} | {"file": str(path.relative_to(root))}
                )
        except ValueError as exc:
            where, why = exc.args
            raise CaptureFileError(f"{where}: not a refit line ({why})") from None
    return sorted(rows, key=lambda r: (r["file"], r["refit_index"]))


# ----------------------------------------------------------------------------- draft shards
# Every drafted token the target verified or AV trimmed, one row each. Labels 1 and 0 are the
# labeled-draft dataset's (accepted; the first rejected draft of its step):
LABEL_ACCEPTED, LABEL_REJECTED = 1, 0
LABEL_AFTER_REJECTION = -1  # verified after the first rejection of its step (no label)
LABEL_TRIMMED = -2  # scheduled but trimmed by AV before verification (no label)

# (name, pyarrow type, nullable). A draft's columns, shared with the labeled-draft dataset
# (``avbench.estimator.drafts.DRAFT_SCHEMA`` adds the stream ids a server does not know).
DRAFT_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("request_id", "string", False),  # the id the client sees in the response
    # Engine decode step; every draft verified in the same batch step shares it.
    ("step", "int64", False),
    ("position", "int16", False),  # 1-based: position 1 is the first draft of a step
    ("label", "int8", False),
    # Drafter distribution after temperature scaling (before top-p), docs/adaptive-verification.md.
    ("q_max", "float64", False),
    # f = logit(q_max) computed stably from the logits and clamped to ±40; null = derive
    # from q_max (less precise when q_max rounds to 1).
    ("logit_q_max", "float64", True),
    # Probability of the drafted token under the distribution it was sampled from.
    ("q_sampled", "float64", False),
    ("entropy", "float64", False),  # nats, same distribution as q_max
    ("estimator_pred", "float64", True),
    ("head_score", "float64", True),
    ("temperature", "float64", False),
)
# Where a captured row came from.
CAPTURE_ONLY_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    # The id inside the engine (the client's id plus vLLM's suffixes).
    ("engine_request_id", "string", False),
    ("pid", "int32", False),
    ("dp_rank", "int16", False),
    ("time", "float64", False),  # unix seconds when the verdict was read
)


def arrow_fields(columns: tuple[tuple[str, str, bool], ...]) -> list[pa.Field]:
    import pyarrow as pa

    return [pa.field(name, getattr(pa, kind)(), nullable=null) for name, kind, null in columns]


@functools.cache
def capture_schema() -> pa.Schema:
    """The schema of a draft shard."""
    import pyarrow as pa

    return pa.schema(arrow_fields(DRAFT_COLUMNS + CAPTURE_ONLY_COLUMNS))
