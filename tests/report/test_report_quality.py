"""The report's output-quality section flags an arm that left the baseline's outputs."""

import json

from avbench.plan import Cell
from avbench.report.quality import NEAR_TIES, definitions_note, quality_section
from avbench.report.runs import load_runs
from avbench.store import RunStore


class _Page:
    def __init__(self):
        self.md: list[str] = []

    def section(self, title, level=2):
        self.md.append(f"## {title}")

    def text(self, s, css=""):
        self.md.append(s)

    def table(self, t):
        self.md.append(t.markdown())


def test_flag_margins_and_definitions(tmp_path):
    store = RunStore.create(tmp_path, "r", {"run_id": "r", "pair": {}, "sweep": {}})
    base = Cell("baseline", "w", 4, None, 0, 20, 0)
    arm = Cell("static-k3", "w", 4, None, 0, 20, 0)
    common = {"run_id": "r", "pair": "p", "concurrency": 4, "output_tok_s": 1.0}
    store.write_cell(base.to_dict() | common | {"arm_kind": "baseline", "k": 0}, [], {})
    store.write_cell(
        arm.to_dict() | common | {"arm_kind": "static", "k": 3, "baseline_cell_id": base.id,
                                  "identical_compared": 20, "identical_to_baseline_share": 0.9,
                                  "first_diff_positions": [17, 40]},
        [], {},
    )  # fmt: skip
    ties = [{"cell_id": arm.id, "margin": 0.0123}, {"cell_id": arm.id, "margin": 0.2}]
    (store.root / NEAR_TIES).write_text(json.dumps({"summary": {}, "ties": ties}))
    page = _Page()
    quality_section(page, load_runs([store.root]))
    definitions_note(page)
    md = "\n".join(page.md)
    assert f"| {arm.id} | 90.0% of 20 | 17, 40 | 0.012, 0.200 | - |" in md
    assert "90.0% of 20 outputs identical" in md and "near-tie" in md
    assert "chunk_latency_ms" in md and "percent" in md
