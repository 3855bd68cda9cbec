"""`avbench pairs`: the model pairs of the suite files."""

from __future__ import annotations

from typing import Annotated

import typer

from avbench.commands.listing import JsonOpt, print_json, print_table
from avbench.commands.request import Request, Suites, command


class PairsRequest(Request):
    suites: Suites = None
    as_json: Annotated[bool, JsonOpt] = False


def register(app: typer.Typer) -> None:
    app.command("pairs")(pairs)


@command(PairsRequest)
def pairs(req: PairsRequest) -> None:
    """List the model pairs defined in the suite files."""
    from avbench.inputs.suite import load_suite

    suite = load_suite(req.suites)
    if req.as_json:
        print_json([p.model_dump(mode="json") for p in suite.pairs.values()])
        return
    rows = [
        [
            p.name,
            p.target,
            p.drafter or "(in target)",
            p.method,
            str(p.max_k),
            str(p.gpus_per_server),
            p.description,
        ]
        for p in suite.pairs.values()
    ]
    print_table(
        f"pairs ({suite.root / 'pairs.toml'})",
        ("pair", "target", "drafter", "method", "max K", "GPUs", "description"),
        rows,
        ids=("pair", "target", "drafter"),
    )
