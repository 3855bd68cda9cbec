"""`avbench preflight`: every arm's vLLM command line parsed by the installed vLLM."""

from __future__ import annotations

from typing import Annotated

import typer

from avbench.commands.request import Request, Suites, VllmPython, command


class PreflightRequest(Request):
    pair: Annotated[
        list[str] | None, typer.Option("--pair", help="Pair id; repeat for several (default: all)")
    ] = None
    sweep: Annotated[
        str | None, typer.Option("--sweep", help="Sweep id (default: each pair's)")
    ] = None
    suites: Suites = None
    vllm_python: VllmPython = None  # type: ignore[assignment]


def register(app: typer.Typer) -> None:
    app.command("preflight")(preflight)


@command(PreflightRequest)
def preflight(req: PreflightRequest) -> None:
    """Parse every arm's vLLM command line with the installed vLLM, and run its adaptive
    verification start-up checks on AV arms; no model is loaded. Each arm: startable, or
    unsupported with the reason."""
    from avbench.checks.preflight import Target
    from avbench.checks.preflight import preflight as run_preflight
    from avbench.inputs.suite import load_suite
    from avbench.plan.cells import arms_for

    suite = load_suite(req.suites)
    pairs = [suite.pair(p) for p in req.pair] if req.pair else list(suite.pairs.values())
    targets = []
    for p in pairs:
        s = suite.sweep(req.sweep or p.default_sweep)
        targets += [Target(p, a, suite.root / "pairs.toml", s) for a in arms_for(p, s)]
    report = run_preflight(targets, req.vllm_python)
    for pair, arm, verdict in report.verdicts():
        typer.echo(f"pair {pair}, arm {arm}: {verdict}")
    for res in report.av_start:
        for what in res.unchecked:
            typer.echo(f"note (pair {res.pair}, arm {res.arm}, not checked before start): {what}")
    for problem in report.problems:
        typer.echo(problem.line(), err=True)
    for note in report.notes:
        typer.echo(f"note (arm unsupported here, never started): {note.line()}", err=True)
    version = f"{report.install.distribution} {report.install.version}"
    if report.problems:
        typer.echo(f"pre-flight: {len(report.problems)} problem(s) with {version}", err=True)
        raise typer.Exit(2)
    typer.echo(
        f"pre-flight ok: {len(report.checked)} arm command lines of {len(pairs)} pair(s) parse "
        f"with {version}'s {report.parser} ({len(report.unsupported)} arm(s) unsupported here, "
        "not started)"
    )
