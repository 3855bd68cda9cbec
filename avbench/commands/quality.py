"""`avbench quality explain RUN`: the target's logit margin where outputs left the baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from avbench.commands.request import Request, command

quality_app = typer.Typer(help="Output-quality guard: identical outputs, GSM8K exact match.")


class ExplainRequest(Request):
    run: Annotated[Path, typer.Argument(help="Run directory (results/<run-id>)")]
    limit: Annotated[int, typer.Option(min=1, help="Differing outputs to explain")] = 50
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts")] = False


@quality_app.command("explain")
@command(ExplainRequest)
def explain(req: ExplainRequest) -> None:
    """For each temperature-0 output that differs from the baseline's: the target's top-1
    minus top-2 logit at the first differing position (offline, transformers), beside the
    margins at every other position of the same outputs."""
    from dataclasses import asdict

    from avbench.explain import explain_run
    from avbench.store.near_ties import write_near_ties

    run = req.run
    ex = explain_run(run, req.limit)
    summary = ex.summary()
    # Kept beside the run for the report's quality section.
    write_near_ties(run, {"summary": summary, "ties": [asdict(t) for t in ex.ties]})
    if req.as_json:
        typer.echo(json.dumps({"summary": summary, "ties": [asdict(t) for t in ex.ties]}))
        return
    if not ex.compared:
        typer.echo(f"{run}: nothing compared: {_not_compared(ex)}")
        return
    if not ex.ties:
        typer.echo(
            f"{run}: no output differs from its baseline ({len(ex.compared)} temperature-0 "
            f"cell(s) compared" + (f"; {_not_compared(ex)}" if ex.not_compared else "") + ")"
        )
        return
    typer.echo("cell\tconversation\tturn\tposition\tbaseline token\tarm token\tmargin\tpercentile")
    for t, pct in zip(ex.ties, summary["divergence_margin_percentile"], strict=True):
        typer.echo(
            f"{t.cell_id}\t{t.conversation_id}\t{t.turn}\t{t.position}\t{t.baseline_token}\t"
            f"{t.arm_token}\t{t.margin:.4f}\t{pct:.1f}"
        )
    typer.echo(
        f"{summary['differing_outputs']} differing outputs: median margin at the divergence "
        f"{summary['margin_median_at_divergence']:.4f} vs {summary['margin_median_elsewhere']:.4f} "
        f"at the other positions; the offline target picks the baseline's token at "
        f"{summary['baseline_is_top1']} of them. A near-tie (small margin) flipping under another "
        "batch shape is the expected cause; a large margin would mean a changed distribution."
    )
    if ex.not_compared:
        typer.echo(_not_compared(ex))


def _not_compared(ex) -> str:
    if not ex.not_compared:
        return "the run has no speculative cell sampled at temperature 0"
    shown = ", ".join(ex.not_compared[:6]) + (", ..." if len(ex.not_compared) > 6 else "")
    return (
        f"{len(ex.not_compared)} temperature-0 cell(s) not compared (no baseline cell of the "
        f"same workload, load and repeat): {shown}"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(quality_app, name="quality")
