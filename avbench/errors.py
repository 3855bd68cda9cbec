"""User-facing errors: each prints as one line naming the cause.

``exit_code`` is what the CLI exits with (README, "Exit codes"): 2 for bad input, 1 for a run
that stopped before every cell was measured.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from pathlib import Path


class AvbenchError(Exception):
    """Base for errors the CLI prints as a single line (no traceback)."""

    exit_code = 2


class SuiteError(AvbenchError):
    """A suite file is malformed or names something unknown."""


class WorkloadError(AvbenchError):
    """A workload cannot be loaded (missing data, placeholder rows, bad schema)."""


class ServerError(AvbenchError):
    """A vLLM server could not be started, became unready or was unsupported."""


class UnsupportedArm(ServerError):
    """The installed vLLM cannot run this arm (e.g. AV on the CPU build)."""


class AssetError(AvbenchError):
    """A model asset is missing, unreadable, or a derived one is not what its recipe says."""


class StoreError(AvbenchError):
    """A results directory cannot be created, opened or written (a file, read-only, corrupt)."""


class StoreFull(StoreError):
    """The disk filled up mid-run: what was stored is kept, the run resumes once space is free."""

    exit_code = 1


def save_traceback(exc: BaseException, directory: Path | None, secrets: list[str]) -> Path:
    """Write the full traceback of an unexpected error, secrets redacted; returns its path.

    Into ``directory`` (the run directory) when it is writable, else a fresh temp file."""
    text = "".join(traceback.format_exception(exc))
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    if directory is not None:
        path = Path(directory) / "traceback.txt"
        try:
            path.write_text(text)
            return path
        except OSError:
            pass
    fd, name = tempfile.mkstemp(prefix="avbench-traceback-", suffix=".txt")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return Path(name)
