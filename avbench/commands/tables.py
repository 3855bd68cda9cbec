"""`avbench tables RUN…`: every table of the study as markdown and CSV."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from pydantic import field_validator, model_validator

from avbench.commands.request import CliType, Request, command


class TablesRequest(Request):
    runs: Annotated[list[Path], typer.Argument(help="Run directories or *.drafts.parquet files.")]
    out: Annotated[Path, typer.Option(help="Where tables.md and the CSVs go.")] = Path(
        "results/tables"
    )
    bins: Annotated[int, typer.Option(help="ECE bins (equal width).")] = 10
    boot: Annotated[int, typer.Option(help="Bootstrap replicates for predictor comparisons.")] = 200
    feature_mode: Annotated[
        Literal["exact", "vllm"],
        CliType(str),
        typer.Option(
            "--feature-mode",
            help="logit(q_max) as stored ('exact') or rounded as vLLM's float32 kernel does "
            "('vllm').",
        ),
    ] = "exact"

    @field_validator("feature_mode", mode="before")
    @classmethod
    def _mode(cls, v: object) -> object:
        if v not in ("exact", "vllm"):
            raise ValueError(f"expected 'exact' or 'vllm', got {v!r}")
        return v

    @model_validator(mode="after")
    def _ranges(self) -> TablesRequest:
        if self.bins < 1 or self.boot < 0:
            raise ValueError(f"--bins must be >= 1 and --boot >= 0 (got {self.bins}, {self.boot})")
        return self


def register(app: typer.Typer) -> None:
    app.command("tables")(tables)


@command(TablesRequest)
def tables(req: TablesRequest) -> None:
    """Regenerate every table of the study as markdown and CSV."""
    from avbench.estimator.tables import all_tables, load_inputs, write_tables

    inputs = load_inputs(req.runs)
    found = all_tables(inputs, n_bins=req.bins, n_boot=req.boot, feature_mode=req.feature_mode)
    md = write_tables(found, req.out, req.runs)
    typer.echo(md.read_text())
    typer.echo(f"wrote {md} and CSVs in {req.out}")
