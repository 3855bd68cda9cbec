"""`avbench recommend RUN…`: the best static K per concurrency and what to deploy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from avbench.commands.report import RunsArg
from avbench.commands.request import Request, command


class RecommendRequest(Request):
    runs: Annotated[list[Path], RunsArg]
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON")] = False


def register(app: typer.Typer) -> None:
    app.command("recommend")(recommend)


@command(RecommendRequest)
def recommend(req: RecommendRequest) -> None:
    """Best static K per concurrency, the schedule and config to deploy, AV or not."""
    from dataclasses import asdict

    from avbench.report import tables
    from avbench.report.answer import answers
    from avbench.report.runs import load_runs

    rs = load_runs(req.runs)
    void = rs.void_note()
    if void is not None:
        typer.echo(f"warning: {void}", err=True)
    found = answers(rs)
    if req.as_json:
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
