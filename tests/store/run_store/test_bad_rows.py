"""Lines of cells.jsonl / failures.jsonl that are valid JSON but not rows: every reader skips
them with one warning line naming file:line, and --resume measures on without marking the run
failed. The run is measured for real against the project's scripted streaming server (standing
in for vLLM: what is under test is how avbench reads its own results)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from avbench.testing.cli import run_cli
from avbench.testing.fake_server import ServerConfig, serve_in_thread

# Valid JSON, not a row; the last cell row has a column of the wrong type.
BAD_CELLS = ["{}", "[1, 2]", '"hello"', "17", '{"arm": "baseline"}', '{"cell_id": 5}']
BAD_FAILURES = ["{}", "[1, 2]", "null", '{"cell_id": ["a"]}', '{"cell_id": "x", "reason": 3}']


@pytest.fixture(scope="module")
def server():
    with serve_in_thread(ServerConfig(model="tiny-target", inter_chunk_delay_s=0.002)) as srv:
        yield srv


@pytest.fixture(scope="module")
def measured(server, tmp_path_factory) -> Path:
    """A finished attached run of two cells, as the sweep stored it."""
    results = tmp_path_factory.mktemp("results")
    res = run_cli(
        "sweep", "--pair", "tiny-cpu", "--endpoint", server.base_url, "--arm", "static-k3",
        "--workloads", "gsm8k-tiny", "--concurrencies", "1,2", "--warmup", "0", "--requests",
        "3", "--max-tokens", "8", "--results", str(results), "--run-id", "good", "--no-report",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return results / "good"


def _corrupt(run: Path, extra_cells: list[str] = ()) -> tuple[list[str], list[str]]:
    """Insert the bad lines among the good ones; returns the file:line each one sits at."""
    cells = run / "cells.jsonl"
    good = cells.read_text().splitlines()
    lines = [good[0], *BAD_CELLS, *extra_cells, *good[1:]]
    cells.write_text("\n".join(lines) + "\n")
    failures = run / "failures.jsonl"
    failures.write_text("\n".join(BAD_FAILURES) + "\n")
    bad_cells = [f"{cells}:{i}:" for i in range(2, 2 + len(BAD_CELLS) + len(extra_cells))]
    return bad_cells, [f"{failures}:{i}:" for i in range(1, 1 + len(BAD_FAILURES))]


def _warned(stderr: str, where: list[str]) -> None:
    warnings = [line for line in stderr.splitlines() if line.startswith("warning: ")]
    for place in where:
        (line,) = [w for w in warnings if place in w]  # once, on one line
        assert line.endswith("; line skipped"), line
    assert "Traceback" not in stderr


@pytest.fixture
def corrupt_run(measured, tmp_path) -> tuple[Path, list[str]]:
    run = tmp_path / "bad"
    shutil.copytree(measured, run)
    bad_cells, bad_failures = _corrupt(run)
    return run, bad_cells + bad_failures


@pytest.mark.parametrize(
    "command",
    [
        ("report", "{run}", "--no-figures"),
        ("recommend", "{run}"),
        ("compare", "{clean}", "{run}"),
        ("merge", "{run}", "--out", "{tmp}/merged"),
        ("estimator", "show", "{run}"),
        ("quality", "explain", "{run}"),
        ("plan", "--pair", "tiny-cpu", "--from", "{run}"),  # prices the work as nightly does
    ],
    ids=lambda c: c[0],
)
def test_every_reader_skips_lines_that_are_not_rows(corrupt_run, measured, tmp_path, command):
    run, where = corrupt_run
    args = [a.format(run=run, tmp=tmp_path, clean=measured) for a in command]
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    # Only the report and merge read failures.jsonl.
    cells_only = command[0] not in ("report", "merge")
    _warned(res.stderr, [w for w in where if not cells_only or "cells.jsonl" in w])
    if command[0] == "merge":
        merged = [
            json.loads(x) for x in (tmp_path / "merged" / "cells.jsonl").read_text().splitlines()
        ]
        assert len(merged) == 2 and all(isinstance(r, dict) for r in merged)
    if command[0] == "report":
        assert "static-k3__gsm8k-tiny__c2__rep0" in (run / "report.md").read_text()


def test_resume_skips_bad_rows_and_remeasures_a_cell_whose_row_is_unreadable(
    measured, server, tmp_path
):
    run = tmp_path / "bad"
    shutil.copytree(measured, run)
    first = json.loads((run / "cells.jsonl").read_text().splitlines()[0])
    wrong = json.dumps(first | {"concurrency": "two"})  # its cell id, a column of the wrong type
    (run / "cells.jsonl").write_text(
        "\n".join((run / "cells.jsonl").read_text().splitlines()[1:]) + "\n"
    )
    bad_cells, _ = _corrupt(run, [wrong])
    res = run_cli("sweep", "--resume", str(run), "--no-report")
    assert res.returncode == 0, res.stderr
    _warned(res.stderr, bad_cells)
    assert "1 cells measured, 1 already done, 0 failed" in res.stderr
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "finished" and "error" not in manifest
    res = run_cli("report", str(run), "--no-figures")
    assert res.returncode == 0, res.stderr
