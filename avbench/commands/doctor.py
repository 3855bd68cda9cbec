"""`avbench doctor`: one line per readiness check; exit 1 when a sweep would fail."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def doctor(
    pair: Annotated[
        str | None, typer.Option("--pair", help="Also pre-flight this pair's arms")
    ] = None,
    sweep: Annotated[
        str | None, typer.Option("--sweep", help="Sweep to check (default: the pair's)")
    ] = None,
    suites: Annotated[
        Path | None,
        typer.Option("--suites", help="Suite directory (default: $AVBENCH_SUITES, else ./suites, else the suites shipped with avbench)"),
    ] = None,
    results: Annotated[
        Path, typer.Option("--results", help="Results directory (its free disk is checked)")
    ] = Path("results"),
    vllm_python: Annotated[
        str | None, typer.Option(help="Python interpreter that has vLLM (default: this one)")
    ] = None,
    sanity: Annotated[
        bool,
        typer.Option(
            "--sanity",
            help="With --pair: serve its target drafting for itself and check that every "
            "draft is accepted (avbench sanity; starts a server, about a minute)",
        ),
    ] = False,
) -> None:
    """Check this machine for a sweep: Python, vLLM, GPUs, AV, plugin, workloads, disk."""
    from rich.console import Console
    from rich.markup import escape

    from avbench.doctor import DoctorOptions, exit_code, run_doctor

    python = vllm_python or os.environ.get("AVBENCH_VLLM_PYTHON") or sys.executable
    checks = run_doctor(
        DoctorOptions(
            python=python,
            suites=suites,
            pair=pair,
            sweep=sweep,
            results=results,
            sanity=sanity,
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
