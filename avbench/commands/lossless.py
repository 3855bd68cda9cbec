"""`avbench lossless`: the worked example of docs/losslessness.md and each feature's check."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import field_validator

from avbench.commands.request import Request, command


class LosslessRequest(Request):
    pairs: Annotated[int, typer.Option(help="Random (p, q) pairs per vocabulary size.")] = 500
    seed: Annotated[int, typer.Option()] = 0

    @field_validator("pairs")
    @classmethod
    def _some(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"expected an integer >= 1, got {v}")
        return v

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"expected an integer >= 0, got {v}")
        return v


def register(app: typer.Typer) -> None:
    app.command("lossless")(lossless)


@command(LosslessRequest)
def lossless(req: LosslessRequest) -> None:
    """Show the worked example of docs/losslessness.md and the exact lossless check of every feature."""
    from avbench.estimator.lossless import check_features, render_check, render_worked_example

    typer.echo(render_worked_example())
    typer.echo("")
    typer.echo(render_check(check_features(n=req.pairs, seed=req.seed)))
