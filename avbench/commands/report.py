"""`avbench report RUN…`: the answer page of finished runs (HTML, Markdown, figures)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from avbench.commands.request import Request, command

RunsArg = typer.Argument(help="Run directories (results/<run-id>)")


class ReportRequest(Request):
    runs: Annotated[list[Path], RunsArg]
    out: Annotated[
        Path | None,
        typer.Option(help="Output directory (default: the run's own, or results/report-<hash>)"),
    ] = None
    static_figures: Annotated[
        bool, typer.Option("--figures/--no-figures", help="Also write PNG/SVG figures")
    ] = True


def register(app: typer.Typer) -> None:
    app.command("report")(report)


@command(ReportRequest)
def report(req: ReportRequest) -> None:
    """Write the answer page (HTML), its Markdown summary and static figures."""
    from avbench.report import write_report

    files = write_report(req.runs, req.out, static_figures=req.static_figures)
    typer.echo(f"report: {files.html}")
    typer.echo(f"summary: {files.markdown}")
    if files.images:
        typer.echo(f"figures: {len(files.images)} files in {files.images[0].parent}")
    elif files.images_skipped:
        typer.echo(f"figures skipped: {files.images_skipped}")
