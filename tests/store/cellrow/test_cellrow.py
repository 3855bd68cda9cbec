"""The typed cell row: every column defined, rows of a real sweep validate, docs current."""

from pathlib import Path

import pytest

from avbench.inputs.suite import SweepUpdate
from avbench.metrics import all_definitions
from avbench.plan.cells import Arm
from avbench.run.runner import SweepOptions, start_sweep
from avbench.serving.attach import AttachedServer, Lengths, attached_setup
from avbench.store.cellrow import (
    CellRow,
    CellRowError,
    definition_of,
    definitions,
    definitions_markdown,
    validate_row,
)
from avbench.store.run_store import RunStore
from avbench.testing.fake_server import ServerConfig, serve_in_thread
from avbench.workloads.registry import builtin_workloads

REPO = Path(__file__).resolve().parents[3]


def test_every_metric_column_has_a_definition():
    for column in all_definitions():
        d = definition_of(column.replace("<key>", "3"))
        assert d is not None and d.definition and d.unit is not None, column
    assert definition_of("turn2_ttft_ms_median").definition.startswith("turn k of multi-turn")
    assert definition_of("errors_http_5xx").unit == "requests"
    assert definition_of("no_such_column") is None
    assert all(d.definition.strip() for d in definitions().values())


def test_rows_of_a_real_sweep_validate_with_every_column_defined(tmp_path):
    """Two-turn MT-Bench through the scripted server: per-turn columns included."""
    with serve_in_thread(ServerConfig(model="m")) as srv:
        pair, sweep, specs = attached_setup(
            AttachedServer(srv.base_url, arm="static-k2"),
            update=SweepUpdate(workloads=["mt-bench"], concurrencies=[2], warmup=0,
                               min_requests=3, requests_per_concurrency=1,
                               sampling={"max_tokens": 8, "temperature": 0.0}),
            workloads=builtin_workloads(),
            lengths=Lengths(),
        )  # fmt: skip
        opts = SweepOptions(
            pair=pair,
            sweep=sweep,
            workloads=specs,
            results_dir=tmp_path,
            run_id="r",
            endpoint=srv.base_url,
            attach_arm=Arm("static", 2),
        )
        outcome = start_sweep(opts)
    (row,) = RunStore.open(tmp_path / "r").finished_cells().values()
    assert outcome.finished and row["turn2_ttft_ms_median"] is not None
    assert validate_row(row) == []  # no undefined column
    typed = CellRow.model_validate(row)
    assert typed.k == 2 and typed.arm_kind == "static" and typed.output_tok_s > 0


def test_a_wrong_type_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(CellRowError, match="column k"):
        validate_row({"cell_id": "c", "k": "three"})
    with pytest.raises(CellRowError, match="accept_pos_1: expected a number"):
        validate_row({"cell_id": "c", "accept_pos_1": "high"})
    store = RunStore.create(tmp_path, "r", {"run_id": "r"})
    with pytest.raises(CellRowError):
        store.write_cell({"cell_id": "c", "output_tok_s": "fast"}, [], {})
    assert store.finished_cells() == {} and not (store.root / "requests").exists()


def test_an_undefined_column_is_stored_with_a_warning(tmp_path):
    warnings: list[str] = []
    store = RunStore.create(tmp_path, "r", {"run_id": "r"})
    store.on_warning = warnings.append
    store.write_cell({"cell_id": "c", "brand_new": 1.0}, [], {})
    assert list(store.finished_cells()) == ["c"]
    assert len(warnings) == 1 and "brand_new" in warnings[0] and "cellrow.py" in warnings[0]


def test_metrics_doc_is_generated_from_the_definitions():
    assert (REPO / "docs" / "metrics.md").read_text() == definitions_markdown(), (
        "docs/metrics.md is stale: run scripts/write_metrics_doc.py"
    )


def test_docs_are_linked_and_nothing_points_outside_the_repo():
    readme = (REPO / "README.md").read_text()
    assert "(docs/README.md)" in readme
    index = (REPO / "docs" / "README.md").read_text()
    for page in ("adaptive-verification", "losslessness", "measurement", "fair-comparisons",
                 "metrics", "published-numbers"):  # fmt: skip
        assert f"({page}.md)" in index and (REPO / "docs" / f"{page}.md").is_file()
    sources = [*REPO.glob("avbench/**/*.py"), *REPO.glob("tests/**/*.py"), *REPO.glob("docs/*.md")]
    outside = ("DESIGN" + ".md", "DESIGN" + " §", ".." + "/shared")  # split: this file is scanned
    for path in sources:
        text = path.read_text()
        assert not [ref for ref in outside if ref in text], path


def test_rows_of_the_tiny_demo_validate():
    """cells.jsonl of a real `avbench sweep --pair tiny-cpu --sweep demo` run (temperature 0),
    kept as a fixture (the drafter's path shortened to its @assets form)."""
    import json

    lines = (Path(__file__).parent / "fixtures" / "demo_cells.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert {r["arm"] for r in rows} >= {"baseline", "static-k1"}
    for row in rows:
        assert validate_row(row) == [], row["cell_id"]
        typed = CellRow.model_validate(row)
        assert typed.temperature == 0.0 and typed.event_loop.startswith("uvloop")
        if typed.arm_kind == "static":
            assert typed.baseline_cell_id == row["cell_id"].replace(row["arm"], "baseline", 1)
            assert typed.identical_to_baseline_share is not None


def test_every_field_of_the_rows_typed_parts_is_a_defined_column():
    from dataclasses import fields

    from avbench.store.cellrow import COLUMNS, ROW_PARTS, ArmPart

    defined = {c.name for c in COLUMNS}
    for part in ROW_PARTS:
        for f in fields(part):
            assert f.name in defined, (part.__name__, f.name)
    notes = ArmPart("r", "p", "av", 3, None, 1).columns().keys() - {f.name for f in fields(ArmPart)}
    assert notes and notes <= defined
