"""`avbench estimator show`'s text (a run with refits: tests/run/cell_captures)."""

import pandas as pd

from avbench.report.refits import render_estimator
from avbench.store.run_store import RunStore


def test_estimator_show_says_so_in_one_line_without_refits(tmp_path):
    store = RunStore.create(tmp_path, "run", {"run_id": "run"})
    pd.DataFrame().to_csv(store.root / "unrelated.csv")
    out = render_estimator(store.root)
    assert out.count("\n") == 0 and "no estimator refits" in out
