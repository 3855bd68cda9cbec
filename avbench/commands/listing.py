"""Tables of ids for people and scripts: never cut an id, plain text when piped, JSON on ask.

A rich table in a narrow terminal ellipsizes cells (``dsv4-dspark`` became ``dsv4-dspa…``):
id columns here never wrap and are as wide as their longest id, other columns fold. When stdout
is not a terminal the table is printed as tab-separated text, whole; ``--json`` prints JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import typer

JsonOpt = typer.Option("--json", help="Print JSON (for scripts) instead of a table")


def print_json(data) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def print_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], ids: Sequence[str] = ()
) -> None:
    """``ids``: the columns holding identifiers (never cut)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=title)
    need = 1  # the table's left border; each column adds its padding and right border
    for i, col in enumerate(columns):
        if col in ids:
            width = max([len(col), *(len(r[i]) for r in rows)])
            t.add_column(col, no_wrap=True, min_width=width)
            need += width + 3
        else:
            t.add_column(col, overflow="fold")
            need += 4
    for r in rows:
        t.add_row(*r)
    # Piped, or a terminal too narrow for the ids: tab-separated lines, nothing cut.
    if not sys.stdout.isatty() or need > console.width:
        typer.echo(f"# {title}")
        for line in [columns, *rows]:
            typer.echo("\t".join(line))
        return
    console.print(t)
