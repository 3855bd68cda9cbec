"""``near_ties.json`` beside a run: what `avbench quality explain` measured, the target's logit
margin at each temperature-0 output's first difference from the baseline's, kept for the
report's quality section."""

from __future__ import annotations

import json
from pathlib import Path

from avbench.store.run_store import write_together

NEAR_TIES = "near_ties.json"


def write_near_ties(run: Path, found: dict) -> None:
    """``found`` (summary and ties) beside the run: whole, or the previous file stays as it was
    (a full disk is one line, not a truncated file)."""
    write_together(run, {NEAR_TIES: json.dumps(found, indent=1).encode()})


def read_near_ties(run: Path) -> list[dict]:
    """The ties a run's explain found (cell_id, margin, ...); none when it was not explained."""
    path = run / NEAR_TIES
    return json.loads(path.read_text())["ties"] if path.is_file() else []
