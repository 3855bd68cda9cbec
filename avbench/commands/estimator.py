"""`avbench estimator show RUN`: the online estimator's refits as captured during a sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from avbench.commands.request import Request, command


class EstimatorShowRequest(Request):
    run: Annotated[Path, typer.Argument(help="A run directory (results/<run-id>).")]


@command(EstimatorShowRequest)
def show(req: EstimatorShowRequest) -> None:
    """Print each cell's refit range, coefficient trajectory and final coefficients."""
    from avbench.report.refits import render_estimator

    typer.echo(render_estimator(req.run))


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The online acceptance estimator as vLLM ran it (live captures).")
    group.command("show")(show)
    app.add_typer(group, name="estimator")
