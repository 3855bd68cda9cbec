"""`avbench compare BASELINE NEW`: per matching cell, the deltas against noise and a verdict."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import field_validator

from avbench.commands.request import Request, command

if TYPE_CHECKING:
    from avbench.analysis.compare import RunCells


class CompareRequest(Request):
    baseline: Annotated[Path, typer.Argument(help="Baseline run directory (e.g. last night)")]
    new: Annotated[Path, typer.Argument(help="New run directory")]
    tolerance: Annotated[
        float,
        typer.Option(
            help="Noise floor: relative differences up to this are 'same' (also the noise of "
            "a single-repeat cell)"
        ),
    ] = 0.05
    ignore: Annotated[
        list[str] | None,
        typer.Option(
            "--ignore",
            help="A setting whose difference does not block the comparison (e.g. "
            "server_command); repeatable",
        ),
    ] = None
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Also write the comparison as markdown")
    ] = None

    @field_validator("tolerance")
    @classmethod
    def _fraction(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError(f"expected a fraction in [0, 1), got {v}")
        return v


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)


@command(CompareRequest)
def compare(req: CompareRequest) -> None:
    """Per matching cell: throughput, TPOT, TTFT, acceptance deltas vs noise, and a verdict.

    Exit 0: no cell worse beyond noise; 1: a cell worse; 2: usage error; 3: nothing comparable.
    """
    from avbench.analysis.compare import compare_cells, to_markdown

    result = compare_cells(
        _run_cells(req.baseline),
        _run_cells(req.new),
        tolerance=req.tolerance,
        ignore=frozenset(req.ignore or []),
    )
    text = to_markdown(result, req.baseline.name, req.new.name)
    notes = [_co_tenancy(req.baseline), _co_tenancy(req.new)]
    text = "\n\n".join([text, *(n for n in notes if n)])
    typer.echo(text)
    if req.markdown is not None:
        req.markdown.parent.mkdir(parents=True, exist_ok=True)
        req.markdown.write_text(text + "\n", encoding="utf-8")
    raise typer.Exit(result.exit_code)


def _co_tenancy(path: Path) -> str | None:
    """Which of a run's cells were measured beside other arms on their host (--gpus, Ray):
    compared with a run that measured them alone, the deltas are what co-tenancy did."""
    from avbench.store.artefacts import SweepManifest
    from avbench.store.run_store import RunStore

    m = RunStore.open(path).read_manifest()
    shared = m.co_tenants() if isinstance(m, SweepManifest) else {}
    cells = sorted(c for c, others in shared.items() if others)
    if not cells:
        return None
    return (
        f"Co-tenant cells in {path.name} ({len(cells)}, measured beside other arms on their "
        f"host; against a run that measured them alone the deltas are co-tenancy's): "
        + ", ".join(cells)
    )


def _run_cells(path: Path) -> RunCells:
    """A run's cell rows with, per row, the settings a comparison must find equal and the
    per-request latencies behind its medians."""
    import pandas as pd

    from avbench.analysis.compare import RunCells, cell_settings
    from avbench.metrics.data import request_latencies_ms
    from avbench.store.artefacts import source_manifest
    from avbench.store.run_store import RunStore

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
