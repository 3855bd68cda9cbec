"""``avbench workloads``: list known workloads, and ``show NAME`` to inspect one."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from pydantic import field_validator

from avbench.commands.listing import JsonOpt, print_json, print_table
from avbench.commands.request import Request, command, invalid
from avbench.errors import WorkloadError

workloads_app = typer.Typer(
    name="workloads",
    help="List workloads, or show what one sends (count, categories, lengths, a sample).",
    no_args_is_help=False,
)


def known_workloads() -> dict:
    """Name → WorkloadSpec for every workload the CLI can resolve."""
    from avbench.workloads.registry import all_workloads

    return all_workloads()


def resolve_workload(name: str):
    known = known_workloads()
    if name not in known:
        raise WorkloadError(f"unknown workload '{name}' (known: {', '.join(sorted(known))})")
    return known[name]


@workloads_app.callback(invoke_without_command=True)
def _default(ctx: typer.Context, as_json: Annotated[bool, JsonOpt] = False) -> None:
    if ctx.invoked_subcommand is None:
        _list(as_json)


class ListRequest(Request):
    as_json: Annotated[bool, JsonOpt] = False


@workloads_app.command("list")
@command(ListRequest)
def list_workloads(req: ListRequest) -> None:
    """List the workloads avbench knows by name."""
    _list(req.as_json)


def _list(as_json: bool) -> None:
    known = sorted(known_workloads().items())
    if as_json:
        print_json([spec.model_dump(mode="json") for _, spec in known])
        return
    rows = [
        [
            name,
            spec.dataset,
            spec.subset or "",
            spec.category or "",
            spec.api,
            str(spec.max_input_tokens),
            spec.description,
        ]
        for name, spec in known
    ]
    print_table(
        "workloads",
        ("name", "dataset", "subset", "category", "api", "max in", "description"),
        rows,
        ids=("name", "dataset", "subset", "category"),
    )


class ShowRequest(Request):
    name: Annotated[str, typer.Argument(help="workload name (see `avbench workloads`)")]
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="prepared data directory (SPEED-Bench)")
    ] = None
    tokenizer: Annotated[
        Path | None,
        typer.Option("--tokenizer", help="local tokenizer dir to count input tokens with"),
    ] = None
    seed: Annotated[int | None, typer.Option(help="shuffle seed (default: the workload's)")] = None
    limit: Annotated[int | None, typer.Option(min=1, help="keep the first N")] = None
    max_input_tokens: Annotated[
        int | None, typer.Option(min=1, help="input cap (default: the workload's)")
    ] = None
    sample_chars: Annotated[int, typer.Option(min=20, help="truncate the sample prompt")] = 600

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int | None) -> int | None:
        if v is not None and v < 0:
            raise ValueError(f"expected an integer >= 0, got {v}")
        return v

    def spec_update(self) -> dict[str, object]:
        """The workload fields this request sets."""
        given = {
            "data_dir": self.data_dir,
            "seed": self.seed,
            "limit": self.limit,
            "max_input_tokens": self.max_input_tokens,
        }
        return {k: v for k, v in given.items() if v is not None}


@workloads_app.command("show")
@command(ShowRequest)
def show(req: ShowRequest) -> None:
    """Load a workload and print count, categories, prompt lengths, turns, source, a sample."""
    from pydantic import ValidationError

    from avbench.workloads.registry import load_workload

    spec = resolve_workload(req.name)
    update = req.spec_update()
    if update:  # re-validated, so a bad override fails like a bad suite field
        try:
            spec = type(spec).model_validate(spec.model_copy(update=update).model_dump())
        except ValidationError as exc:
            raise invalid(exc, "option") from None
    loaded = load_workload(spec, tokenizer=req.tokenizer)
    _print(loaded, req.sample_chars)


def _print(loaded, sample_chars: int) -> None:
    import numpy as np
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    console = Console()
    spec, src, convs = loaded.spec, loaded.source, loaded.conversations
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column(overflow="fold")
    info.add_row("workload", spec.name)
    info.add_row("dataset", spec.dataset + (f" / {spec.subset}" if spec.subset else ""))
    if spec.category:
        info.add_row("category filter", spec.category)
    info.add_row("conversations", str(len(convs)))
    info.add_row(
        "dropped over cap",
        f"{loaded.truncated} (max_input_tokens={spec.max_input_tokens})",
    )
    turns = Counter(len(c.turns) for c in convs)
    info.add_row("turns", ", ".join(f"{k}-turn: {v}" for k, v in sorted(turns.items())))
    info.add_row("api", spec.api)
    info.add_row("source", src.origin)
    info.add_row("sha256", src.sha256 or "-")
    info.add_row("source rows", str(src.rows))
    for key in ("upstream", "license", "note", "hub_fallback_reason"):
        if key in src.extra:
            info.add_row(key.replace("_", " "), str(src.extra[key]))
    info.add_row("order", f"seed {spec.seed}" + (f", limit {spec.limit}" if spec.limit else ""))
    console.print(info)

    lengths = np.asarray(loaded.input_tokens)
    pct = Table(title=f"input length ({loaded.token_counter})")
    for col in ("p50", "p90", "p99", "max"):
        pct.add_column(col, justify="right")
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    pct.add_row(f"{p50:.0f}", f"{p90:.0f}", f"{p99:.0f}", str(int(lengths.max())))
    console.print(pct)

    cats = Counter(c.category or "(none)" for c in convs)
    cat_table = Table(title="categories")
    cat_table.add_column("category")
    cat_table.add_column("count", justify="right")
    for cat, n in sorted(cats.items()):
        cat_table.add_row(cat, str(n))
    console.print(cat_table)

    first = convs[0]
    text = first.turns[0]
    if len(text) > sample_chars:
        text = text[:sample_chars] + f"… [{len(first.turns[0]) - sample_chars} more chars]"
    title = f"sample: {first.id}"
    if len(first.turns) > 1:
        title += f" (turn 1 of {len(first.turns)})"
    # Text(), not a markup string: prompts contain brackets rich would read as style tags.
    console.print(Panel(Text(text), title=title, expand=False))


def register(app: typer.Typer) -> None:
    app.add_typer(workloads_app, name="workloads")
