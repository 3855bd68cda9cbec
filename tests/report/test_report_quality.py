"""The report's output-quality section flags an arm that left the baseline's outputs."""

import io
import json

from rich.console import Console

from avbench.loadgen.records import RequestRecord
from avbench.plan.cells import Cell
from avbench.report.quality import definitions_note, quality_section
from avbench.report.runs import load_runs
from avbench.store.near_ties import NEAR_TIES
from avbench.store.run_store import RunStore


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


def _outputs(texts: list[str], warmup: int = 0) -> list[RequestRecord]:
    return [
        RequestRecord(f"q/{i}", 0, prompt_text=f"p{i}", output_token_ids=[int(c) for c in t],
                      completion_tokens=len(t), warmup=i < warmup)
        for i, t in enumerate(texts)
    ]  # fmt: skip


def test_a_cell_measured_before_its_baseline_is_compared_at_report_time(tmp_path):
    """What a resume leaves: static cells stored while the baseline arm had failed (their
    identity columns empty, as the runner stores them), the baseline measured afterwards."""
    from avbench.metrics.quality import quality_columns
    from avbench.run.progress import summary_table

    store = RunStore.create(tmp_path, "r", {"run_id": "r", "pair": {}, "sweep": {}})
    common = {"run_id": "r", "pair": "p", "temperature": 0.0, "arm_kind": "static", "k": 3}
    arm_c1, arm_c4 = (Cell("static-k3", "w", c, None, 0, 4, 0) for c in (1, 4))
    arm_out = _outputs(["1234", "1234", "1299", "12"])
    alone = quality_columns(arm_out, baseline=None, baseline_cell_id=None, temperature=0,
                            references=None)  # fmt: skip
    for cell in (arm_c1, arm_c4):
        store.write_cell(cell.to_dict() | common | alone, arm_out, {})
    base = Cell("baseline", "w", 1, None, 0, 4, 0)  # the resume measured c=1 only
    store.write_cell(base.to_dict() | common | {"arm_kind": "baseline", "k": 0},
                     _outputs(["1234", "1234", "1234", "1234"]), {})  # fmt: skip

    rs = load_runs([store.root])
    page = _Page()
    quality_section(page, rs)
    md = "\n".join(page.md)
    # 2 of 4 identical: one differs at position 2, one stopped early at 2.
    assert f"| {arm_c1.id} | 50.0% of 4 | 2, 2 | - | - |" in md
    assert "50.0% of 4 outputs identical to the baseline" in md
    not_compared = "not compared (no baseline cell of this workload, load and repeat)"
    assert f"| {arm_c4.id} | {not_compared} | - | - | - |" in md
    assert "1 temperature-0 cell(s) were not compared with the baseline" in md

    # The end-of-sweep table (what --resume prints) reads the same way.
    from avbench.metrics.quality import fill_identity

    rows = fill_identity(list(store.finished_cells().values()), store.read_records)
    console = Console(width=400, record=True, file=io.StringIO())
    console.print(summary_table(rows))
    text = console.export_text()
    assert "50%" in text and "not compared" in text
