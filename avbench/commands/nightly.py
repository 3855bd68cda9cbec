"""`avbench preflight | compare | merge`: the checks and verdicts a nightly job runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from avbench.commands.sweep import SuitesOpt
from avbench.errors import AvbenchError


def register(app: typer.Typer) -> None:
    app.command("preflight")(preflight)
    app.command("compare")(compare)
    app.command("merge")(merge)


def preflight(
    pair: Annotated[
        list[str] | None, typer.Option("--pair", help="Pair id; repeat for several (default: all)")
    ] = None,
    sweep: Annotated[
        str | None, typer.Option("--sweep", help="Sweep id (default: each pair's)")
    ] = None,
    suites: SuitesOpt = None,
    vllm_python: Annotated[
        str | None, typer.Option(help="Python interpreter that has vLLM (default: this one)")
    ] = None,
) -> None:
    """Parse every arm's vLLM command line with the installed vLLM; no model is loaded."""
    from avbench.plan import arms_for
    from avbench.preflight import Target
    from avbench.preflight import preflight as run_preflight
    from avbench.suite import load_suite

    suite = load_suite(suites)
    pairs = [suite.pair(p) for p in pair] if pair else list(suite.pairs.values())
    targets = []
    for p in pairs:
        s = suite.sweep(sweep or p.default_sweep)
        targets += [Target(p, a, suite.root / "pairs.toml", s) for a in arms_for(p, s)]
    python = vllm_python or os.environ.get("AVBENCH_VLLM_PYTHON") or sys.executable
    report = run_preflight(targets, python)
    for p in report.problems:
        typer.echo(p.line(), err=True)
    for p in report.notes:
        typer.echo(f"note (arm unsupported here, never started): {p.line()}", err=True)
    version = f"{report.install.distribution} {report.install.version}"
    if report.problems:
        typer.echo(f"pre-flight: {len(report.problems)} problem(s) with {version}", err=True)
        raise typer.Exit(2)
    typer.echo(
        f"pre-flight ok: {len(report.checked)} arm command lines of {len(pairs)} pair(s) parse "
        f"with {version}'s {report.parser} ({len(report.unsupported)} arm(s) unsupported here, "
        "not started)"
    )


def compare(
    baseline: Annotated[Path, typer.Argument(help="Baseline run directory (e.g. last night)")],
    new: Annotated[Path, typer.Argument(help="New run directory")],
    tolerance: Annotated[
        float,
        typer.Option(
            help="Noise floor: relative differences up to this are 'same' (also the noise of "
            "a single-repeat cell)"
        ),
    ] = 0.05,
    ignore: Annotated[
        list[str] | None,
        typer.Option(
            "--ignore",
            help="A setting whose difference does not block the comparison (e.g. "
            "server_command); repeatable",
        ),
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Also write the comparison as markdown")
    ] = None,
) -> None:
    """Per matching cell: throughput, TPOT, TTFT, acceptance deltas vs noise, and a verdict.

    Exit 0: no cell worse beyond noise; 1: a cell worse; 2: usage error; 3: nothing comparable.
    """
    from avbench.analysis.compare import compare_cells, to_markdown

    if not 0 <= tolerance < 1:
        raise AvbenchError(f"--tolerance: expected a fraction in [0, 1), got {tolerance}")
    result = compare_cells(
        _run_cells(baseline), _run_cells(new), tolerance=tolerance, ignore=frozenset(ignore or [])
    )
    text = to_markdown(result, baseline.name, new.name)
    typer.echo(text)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text + "\n", encoding="utf-8")
    raise typer.Exit(result.exit_code)


def _run_cells(path: Path):
    """A run's cell rows with, per row, the settings a comparison must find equal and the
    per-request latencies behind its medians."""
    import pandas as pd

    from avbench.analysis.compare import RunCells, cell_settings
    from avbench.artefacts import source_manifest
    from avbench.metrics.data import request_latencies_ms
    from avbench.store import RunStore

    store = RunStore.open(path)
    manifest = store.read_manifest()
    rows = list(store.finished_cells().values())
    settings = [cell_settings(r, source_manifest(manifest, r.get("run_id"))) for r in rows]
    requests = [
        request_latencies_ms(store.read_records(r["cell_id"]))
        if store.requests_path(r["cell_id"]).exists()
        else {}
        for r in rows
    ]
    return RunCells(pd.DataFrame(rows), settings, requests)


def merge(
    runs: Annotated[list[Path], typer.Argument(help="Run directories to combine")],
    out: Annotated[Path, typer.Option("--out", help="New run directory to write")],
) -> None:
    """Combine several runs (one per pair or machine) into one run directory for reports."""
    from avbench.merge import merge_runs

    res = merge_runs(runs, out)
    typer.echo(
        f"merged {len(res.sources)} run(s) into {res.store.root}: {res.cells} cells, "
        f"{res.failures} failure rows"
    )
