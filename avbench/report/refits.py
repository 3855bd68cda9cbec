"""`avbench estimator show`: the online estimator's refits as a sweep captured them, per cell."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from avbench.serving.capture import NO_ESTIMATOR, read_refits
from avbench.store.run_store import RunStore


def _coef(slope: float, intercepts) -> str:
    return f"slope {slope:.4f}, intercepts [{', '.join(f'{b:.4f}' for b in intercepts)}]"


def render_estimator(run_dir: Path) -> str:
    """Each cell's refit range, coefficient trajectory and final coefficients, as text."""
    store = RunStore.open(run_dir)
    cells = [r for r in store.finished_cells().values() if "refits" in (r.get("capture") or [])]
    dirs = {store.root / r["capture_dir"] for r in cells if r.get("capture_dir")}
    refits = pd.concat(
        [read_refits(d) for d in sorted(dirs) if d.is_dir()] or [pd.DataFrame()],
        ignore_index=True,
    )
    if refits.empty or not cells:
        why = (
            "no cell captured refits" if not cells else "no refit lines in the capture directories"
        )
        return f"{store.root.name}: no estimator refits ({why}; only AV arms on Model Runner V2 refit)."
    lines = [f"{store.root.name}: online estimator per cell (slope ω, intercepts β1..βK)"]
    for r in cells:
        lines.append(f"{r['cell_id']}:")
        if r.get("estimator") == "none":
            lines.append(f"  {NO_ESTIMATOR}")
            continue
        if not r.get("refits"):
            lines.append(
                f"  no refit during the cell; in force: {_coef(r['slope_end'], r['intercepts_end'])}"
            )
            continue
        lines.append(
            f"  refits #{r['refit_first']}..#{r['refit_last']} ({r['refits']}), worker pid {r['refit_pid']}"
        )
        lines.append(f"  start: {_coef(r['slope_start'], r['intercepts_start'])}")
        sel = refits[
            (refits["pid"] == r["refit_pid"])
            & refits["refit_index"].between(r["refit_first"], r["refit_last"])
        ]
        for x in sel.sort_values("refit_index").itertuples():
            lines.append(
                f"  #{x.refit_index} (step {x.step_count}): {_coef(x.slope, x.intercepts)}"
            )
        lines.append(f"  end:   {_coef(r['slope_end'], r['intercepts_end'])}")
    return "\n".join(lines)
