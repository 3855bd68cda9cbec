"""`avbench sanity --pair P`: does this vLLM build accept every draft of a target drafting for
itself? (avbench/checks/sanity.py; exit 1 when it does not.)"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from avbench.commands.request import Request, Suites, VllmPython, command


class SanityRequest(Request):
    pair: Annotated[str, typer.Option("--pair", help="Pair whose target drafts for itself")]
    stock: Annotated[
        bool,
        typer.Option("--stock", help="Without avbench's CPU sampler fix (the stock build)"),
    ] = False
    requests: Annotated[int, typer.Option("--requests", help="Requests per profile")] = 8
    port: Annotated[
        int | None, typer.Option("--port", help="Port for the server (default: a free one)")
    ] = None
    suites: Suites = None
    vllm_python: VllmPython = None  # type: ignore[assignment]
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON")] = False


def register(app: typer.Typer) -> None:
    app.command("sanity")(sanity)


@command(SanityRequest)
def sanity(req: SanityRequest) -> None:
    """Serve the pair's target as its own drafter (K = max_k, probabilistic drafting) and check
    that every draft position accepts exactly 1.000 at T=1 (top-p 1.0) and at T=0."""
    from avbench.checks.sanity import SanityOptions, run_sanity, table

    opts = SanityOptions(
        pair=req.pair,
        stock=req.stock,
        requests=req.requests,
        port=req.port,
        suites=req.suites,
        python=req.vllm_python,
    )
    result = run_sanity(opts, progress=lambda line: print(f"sanity: {line}", file=sys.stderr))
    if req.as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        for counts in result.profiles:
            print("\n".join(table(counts)))
        fix = "off (--stock or cpu_sampler_fix = false)" if not result.fix_asked else "on"
        print(f"cpu sampler fix: {fix}; server patched: {result.server_patched or 'no'}")
        print(f"{'ok' if result.verdict.ok else 'FAIL'}: {result.verdict.line}")
    raise typer.Exit(result.exit_code)
