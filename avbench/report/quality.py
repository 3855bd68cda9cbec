"""The report's output-quality section and its closing note on definitions.

Quality: per speculative cell, the share of temperature-0 outputs identical to the baseline's,
the first differing positions, the target's logit margin there when `avbench quality explain`
has measured it (``<run>/near_ties.json``), and GSM8K exact match; arms that differ beyond
noise are flagged (docs/fair-comparisons.md).
"""

from __future__ import annotations

import pandas as pd

from avbench.metrics.quality import (
    IDENTICAL_FLOOR,
    NOT_COMPARED,
    identity_applies,
    identity_text,
    quality_flags,
)
from avbench.report import tables
from avbench.store.cellrow import PEER_DIFFERENCES
from avbench.store.near_ties import read_near_ties


def _rows(cells: pd.DataFrame) -> list[dict]:
    return cells.astype(object).where(cells.notna(), None).to_dict("records")


def _margins(rs) -> dict[tuple[str, str], list[float]]:
    """(run id, cell id) -> margins at the first differing positions, where measured."""
    out: dict[tuple[str, str], list[float]] = {}
    for run in rs.runs:
        for t in read_near_ties(run.store.root):
            out.setdefault((run.run_id, t["cell_id"]), []).append(t["margin"])
    return out


def quality_section(page, rs) -> None:
    columns = ("identical_to_baseline_share", "gsm8k_exact_match")
    if rs.cells.empty:
        return
    # A temperature-0 speculative cell is listed even when nothing was compared: saying so
    # is the point (a "-" would read as "no difference").
    rows = [
        r
        for r in _rows(rs.cells)
        if identity_applies(r) or any(r.get(c) is not None for c in columns)
    ]
    if not rows:
        return
    margins = _margins(rs)
    page.section("Output quality")
    body = []
    for r in rows:
        em = r.get("gsm8k_exact_match")
        m = margins.get((str(r.get("run_id")), r["cell_id"]), [])
        body.append(
            (
                # Runs side by side (the demo's two samplings) share cell ids: name the run.
                f"{r['cell_id']} ({r.get('run_id')})" if len(rs.runs) > 1 else r["cell_id"],
                identity_text(r),
                ", ".join(map(str, (r.get("first_diff_positions") or [])[:10])) or "-",
                ", ".join(f"{x:.3f}" for x in m[:10]) or "-",
                "-" if em is None else f"{em:.3f} ± {r.get('gsm8k_exact_match_se') or 0:.3f}",
            )
        )
    page.table(
        tables.Table(
            (
                "cell",
                "identical to baseline (temp 0)",
                "first differing positions",
                "target logit margin there",
                "GSM8K exact match ± SE",
            ),
            tuple(body),
            caption=f"An arm under {IDENTICAL_FLOOR:.0%} identical is flagged below. Margins: "
            "`avbench quality explain RUN` (top-1 minus top-2 logit of the target).",
        )
    )
    flags = quality_flags(rows)
    for flag in flags:
        page.text(flag, "warn")
    missing = [r["cell_id"] for r in rows if identity_text(r) == NOT_COMPARED]
    if missing:
        page.text(
            f"{len(missing)} temperature-0 cell(s) were not compared with the baseline: no "
            f"baseline cell of the same workload, load and repeat was measured "
            f"({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''}).",
            "warn",
        )
    if any("identical" in f for f in flags):
        page.text(
            "Verification runs the target on another batch shape than plain decoding, so its "
            "floating-point sums run in another order; where the target's two best tokens are "
            "nearly tied (a margin near 0) they can swap, and greedy output follows another "
            "valid path from there. That is the expected cause of a differing output; a flip at "
            "a large margin is not."
        )


def definitions_note(page) -> None:
    page.section("Definitions that differ from vLLM's benchmark client")
    for text in PEER_DIFFERENCES:
        page.text(text)
    page.text("Every column's definition: docs/metrics.md in the avbench repository.")
