"""`avbench sanity --pair P`: does this vLLM build accept every draft of a target drafting for
itself? (avbench/sanity.py; exit 1 when it does not.)"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("sanity")(sanity)


def sanity(
    pair: Annotated[str, typer.Option("--pair", help="Pair whose target drafts for itself")],
    stock: Annotated[
        bool,
        typer.Option("--stock", help="Without avbench's CPU sampler fix (the stock build)"),
    ] = False,
    requests: Annotated[int, typer.Option("--requests", help="Requests per profile")] = 8,
    port: Annotated[
        int | None, typer.Option("--port", help="Port for the server (default: a free one)")
    ] = None,
    suites: Annotated[
        Path | None,
        typer.Option("--suites", help="Suite directory (default: $AVBENCH_SUITES, else ./suites, else the suites shipped with avbench)"),
    ] = None,
    vllm_python: Annotated[
        str | None, typer.Option(help="Python interpreter that has vLLM (default: this one)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON")] = False,
) -> None:
    """Serve the pair's target as its own drafter (K = max_k, probabilistic drafting) and check
    that every draft position accepts exactly 1.000 at T=1 (top-p 1.0) and at T=0."""
    from avbench.sanity import SanityOptions, run_sanity, table

    python = vllm_python or os.environ.get("AVBENCH_VLLM_PYTHON") or sys.executable
    opts = SanityOptions(
        pair=pair, stock=stock, requests=requests, port=port, suites=suites, python=python
    )
    result = run_sanity(opts, progress=lambda line: print(f"sanity: {line}", file=sys.stderr))
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        for counts in result.profiles:
            print("\n".join(table(counts)))
        fix = "off (--stock or cpu_sampler_fix = false)" if not result.fix_asked else "on"
        print(f"cpu sampler fix: {fix}; server patched: {result.server_patched or 'no'}")
        print(f"{'ok' if result.verdict.ok else 'FAIL'}: {result.verdict.line}")
    raise typer.Exit(result.exit_code)
