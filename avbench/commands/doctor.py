"""`avbench doctor`: one line per readiness check; exit 1 when a sweep would fail."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from avbench.commands.request import Request, Suites, VllmPython, command


class DoctorRequest(Request):
    pair: Annotated[str | None, typer.Option("--pair", help="Also pre-flight this pair's arms")] = (
        None
    )
    sweep: Annotated[
        str | None, typer.Option("--sweep", help="Sweep to check (default: the pair's)")
    ] = None
    suites: Suites = None
    results: Annotated[
        Path, typer.Option("--results", help="Results directory (its free disk is checked)")
    ] = Path("results")
    vllm_python: VllmPython = None  # type: ignore[assignment]
    sanity: Annotated[
        bool,
        typer.Option(
            "--sanity",
            help="With --pair: serve its target drafting for itself and check that every "
            "draft is accepted (avbench sanity; starts a server, about a minute)",
        ),
    ] = False


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


@command(DoctorRequest)
def doctor(req: DoctorRequest) -> None:
    """Check this machine for a sweep: Python, vLLM, GPUs, AV, plugin, workloads, disk."""
    from rich.console import Console
    from rich.markup import escape

    from avbench.checks.doctor import DoctorOptions, exit_code, run_doctor

    checks = run_doctor(
        DoctorOptions(
            python=req.vllm_python,
            suites=req.suites,
            pair=req.pair,
            sweep=req.sweep,
            results=req.results,
            sanity=req.sanity,
            progress=lambda line: print(f"doctor: sanity: {line}", file=sys.stderr),
        )
    )
    console = Console(highlight=False, soft_wrap=True)
    style = {"ok": "green", "warn": "yellow", "problem": "red"}
    for c in checks:
        console.print(f"[{style[c.status]}]{escape(c.line())}[/]")
    code = exit_code(checks)
    if code:
        console.print("[red]doctor: a sweep would fail here (see the problem lines)[/]")
    raise typer.Exit(code)
