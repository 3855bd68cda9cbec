"""`avbench predict RUN`: predicted cells of arms that were not measured, from one that was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from avbench.errors import AvbenchError


def register(app: typer.Typer) -> None:
    app.command("predict")(predict)


def _schedule(text: str | None):
    if text is None or text == "recommend":
        return "recommend"
    from avbench.schedule import validate_schedule

    try:
        return validate_schedule(json.loads(text))
    except (ValueError, TypeError) as exc:
        raise AvbenchError(
            f"--schedule {text!r}: expected 'recommend' or JSON [[first, last, K], ...] ({exc})"
        ) from None


def predict(
    run: Annotated[Path, typer.Argument(help="A run directory (results/<run-id>)")],
    arms: Annotated[
        str,
        typer.Option(
            help="Arms to predict, comma-separated: static-k<K>, static (every K below the "
            "source's), dyn (the --schedule), av (AV at the source's K)"
        ),
    ] = "static,dyn,av",
    source: Annotated[
        str | None,
        typer.Option("--from", help="The measured arm to replay (default: largest static K)"),
    ] = None,
    schedule: Annotated[
        str | None,
        typer.Option(
            help="The dyn arm's schedule: JSON \\[\\[first, last, K], ...] or 'recommend'"
        ),
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option(help="Also write the predicted-vs-measured table here")
    ] = None,
    transcription: Annotated[
        bool,
        typer.Option(help="Use avbench's transcription of vLLM's AV code even if vLLM imports"),
    ] = False,
) -> None:
    """Replay a measured arm's captures as other arms; store predicted cells beside it."""
    from avbench.predict.run import COMPARED_FILE, PREDICTED_FILE, PredictRequest, predict_run
    from avbench.report.tables import prediction_table

    targets = tuple(a.strip() for a in arms.split(",") if a.strip())
    req = PredictRequest(run, targets, source, _schedule(schedule), not transcription)
    res = predict_run(req)
    counts: dict[str, int] = {}
    for r in res.rows:
        counts[r["arm"]] = counts.get(r["arm"], 0) + 1
    typer.echo(
        f"{run.name}: predicted from {res.source} ({res.decision_code}): "
        + (", ".join(f"{a} {n} cells" for a, n in counts.items()) or "nothing")
        + f" -> {run / PREDICTED_FILE}"
    )
    for why in res.skipped:
        typer.echo(f"not predicted: {why}")
    if res.compared:
        misses = sum(not c.within for c in res.compared)
        text = prediction_table(
            res.compared,
            f"Predicted vs measured ({len(res.compared) - misses} of {len(res.compared)} within "
            f"tolerance; {run / COMPARED_FILE})",
        ).markdown()
    else:
        text = f"{run.name}: no predicted arm was also measured: nothing to compare\n"
    typer.echo(text)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text, encoding="utf-8")
