"""Live capture files written by hand, in the plugin's formats, for tests of their readers."""

from __future__ import annotations

import json
from pathlib import Path


def write_refit_lines(path: Path, pid: int, times: list[float], start_index: int = 0) -> None:
    """Refit lines of one estimator as the plugin appends them (``refits.<pid>.jsonl``): one per
    time, slopes 0.5, 0.6, ... from ``start_index``."""
    with path.open("a") as fh:
        for i, t in enumerate(times):
            row = {"time": t, "pid": pid, "tp_rank": 0, "dp_rank": 0,
                   "refit_index": start_index + i, "step_count": 100 * (start_index + i + 1),
                   "slope": 0.5 + 0.1 * (start_index + i), "intercepts": [-0.2, -0.3 - i],
                   "label_counts": [10, 5], "capture_errors": 0}  # fmt: skip
            fh.write(json.dumps(row) + "\n")
