"""`avbench predict RUN`: predicted cells of arms that were not measured, from one that was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from avbench.commands.request import Request, command
from avbench.errors import AvbenchError


class PredictRequest(Request):
    run: Annotated[Path, typer.Argument(help="A run directory (results/<run-id>)")]
    arms: Annotated[
        str,
        typer.Option(
            help="Arms to predict, comma-separated: static-k<K>, static (every K below the "
            "source's), dyn (the --schedule), av (AV at the source's K)"
        ),
    ] = "static,dyn,av"
    source: Annotated[
        str | None,
        typer.Option("--from", help="The measured arm to replay (default: largest static K)"),
    ] = None
    schedule: Annotated[
        str | None,
        typer.Option(
            help="The dyn arm's schedule: JSON \\[\\[first, last, K], ...] or 'recommend'"
        ),
    ] = None
    markdown: Annotated[
        Path | None, typer.Option(help="Also write the predicted-vs-measured table here")
    ] = None
    transcription: Annotated[
        bool,
        typer.Option(help="Use avbench's transcription of vLLM's AV code even if vLLM imports"),
    ] = False

    def targets(self) -> tuple[str, ...]:
        return tuple(a.strip() for a in self.arms.split(",") if a.strip())


def register(app: typer.Typer) -> None:
    app.command("predict")(predict)


def _schedule(text: str | None) -> Any:
    if text is None or text == "recommend":
        return "recommend"
    from avbench.inputs.schedule import validate_schedule

    try:
        return validate_schedule(json.loads(text))
    except (ValueError, TypeError) as exc:
        raise AvbenchError(
            f"--schedule {text!r}: expected 'recommend' or JSON [[first, last, K], ...] ({exc})"
        ) from None


@command(PredictRequest)
def predict(req: PredictRequest) -> None:
    """Replay a measured arm's captures as other arms; store predicted cells beside it."""
    from avbench.predict.predicted import PREDICTED_FILE, predict_run
    from avbench.predict.predicted import PredictRequest as Replay

    run = req.run
    res = predict_run(
        Replay(run, req.targets(), req.source, _schedule(req.schedule), not req.transcription)
    )
    counts: dict[str, int] = {}
    for r in res.rows:
        counts[r["arm"]] = counts.get(r["arm"], 0) + 1
    typer.echo(
        f"{run.name}: predicted from {res.source} ({res.decision_code}): "
        + (", ".join(f"{a} {n} cells" for a, n in counts.items()) or "nothing")
        + f" -> {run / PREDICTED_FILE}"
    )
    for arm, cov in res.coverage.items():
        typer.echo(f"{arm}: {cov.line()}")
    if res.coverage:
        from avbench.predict.vllm_av import AV_DIFFERENCES

        typer.echo("AV predicted unlike vLLM's own in: " + "; ".join(AV_DIFFERENCES))
    for why in res.skipped:
        typer.echo(f"not predicted: {why}")
    if not res.rows and res.skipped:  # nothing asked for could be predicted: refused
        raise AvbenchError(f"{run.name}: nothing predicted: " + "; ".join(res.skipped))
    text = _compared_text(run, res.compared)
    typer.echo(text)
    if req.markdown is not None:
        req.markdown.parent.mkdir(parents=True, exist_ok=True)
        req.markdown.write_text(text, encoding="utf-8")


def _compared_text(run: Path, compared: list) -> str:
    from avbench.predict.predicted import COMPARED_FILE
    from avbench.report.tables import prediction_table

    if not compared:
        return f"{run.name}: no predicted arm was also measured: nothing to compare\n"
    misses = sum(not c.within for c in compared)
    return prediction_table(
        compared,
        f"Predicted vs measured ({len(compared) - misses} of {len(compared)} within "
        f"tolerance; {run / COMPARED_FILE})",
    ).markdown()
