"""`avbench merge RUN… --out DIR`: several runs as one run directory for reports."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from avbench.commands.request import Request, command


class MergeRequest(Request):
    runs: Annotated[list[Path], typer.Argument(help="Run directories to combine")]
    out: Annotated[Path, typer.Option("--out", help="New run directory to write")]


def register(app: typer.Typer) -> None:
    app.command("merge")(merge)


@command(MergeRequest)
def merge(req: MergeRequest) -> None:
    """Combine several runs (one per pair or machine) into one run directory for reports."""
    from avbench.store.merge import merge_runs

    res = merge_runs(req.runs, req.out)
    typer.echo(
        f"merged {len(res.sources)} run(s) into {res.store.root}: {res.cells} cells, "
        f"{res.failures} failure rows"
    )
