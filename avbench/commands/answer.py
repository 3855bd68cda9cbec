"""`avbench report RUN…` and `avbench recommend RUN…`: the answer of finished runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

RunsArg = Annotated[list[Path], typer.Argument(help="Run directories (results/<run-id>)")]


def register(app: typer.Typer) -> None:
    app.command("report")(report)
    app.command("recommend")(recommend)


def report(
    runs: RunsArg,
    out: Annotated[
        Path | None,
        typer.Option(help="Output directory (default: the run's own, or results/report-<hash>)"),
    ] = None,
    static_figures: Annotated[
        bool, typer.Option("--figures/--no-figures", help="Also write PNG/SVG figures")
    ] = True,
) -> None:
    """Write the answer page (HTML), its Markdown summary and static figures."""
    from avbench.report import write_report

    files = write_report(runs, out, static_figures=static_figures)
    typer.echo(f"report: {files.html}")
    typer.echo(f"summary: {files.markdown}")
    if files.images:
        typer.echo(f"figures: {len(files.images)} files in {files.images[0].parent}")
    elif files.images_skipped:
        typer.echo(f"figures skipped: {files.images_skipped}")


def recommend(
    runs: RunsArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON")] = False,
) -> None:
    """Best static K per concurrency, the schedule and config to deploy, AV or not."""
    from dataclasses import asdict

    from avbench.report import tables
    from avbench.report.answer import answers
    from avbench.report.runs import load_runs

    found = answers(load_runs(runs))
    if as_json:
        typer.echo(
            json.dumps(
                [
                    asdict(a.pooled)
                    | {"verdicts": [asdict(r) for r in a.pooled.ranges], "deploy": a.deploy}
                    for a in found
                ],
                default=str,
            )
        )
        return
    if not found:
        typer.echo("no finished cells: nothing to recommend", err=True)
        raise typer.Exit(1)
    for a in found:
        for rec in (*a.per_workload, a.pooled) if len(a.per_workload) > 1 else (a.pooled,):
            typer.echo(tables.decisions_table(rec).markdown())
        typer.echo(tables.recommendation_text(a.pooled, a.deploy))
