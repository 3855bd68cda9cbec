"""`avbench estimator show RUN`: the online estimator's refits as captured during a sweep."""

from __future__ import annotations

from pathlib import Path

import typer


def show(run: Path = typer.Argument(..., help="A run directory (results/<run-id>).")) -> None:
    """Print each cell's refit range, coefficient trajectory and final coefficients."""
    from avbench.capture import render_estimator

    typer.echo(render_estimator(run))


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The online acceptance estimator as vLLM ran it (live captures).")
    group.command("show")(show)
    app.add_typer(group, name="estimator")
