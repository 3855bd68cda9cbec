"""avbench command line. Thin: parse options, call one entry point, print errors as one line.

Heavy imports live inside the commands so ``--help`` stays fast.
"""

from __future__ import annotations

import importlib
import sys

import typer

from avbench.errors import AvbenchError

app = typer.Typer(
    name="avbench",
    help="Benchmark speculative decoding and Adaptive Verification in vLLM.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Command groups, one module each under avbench/commands/ (registered if present).
_COMMAND_MODULES = ("sweep", "workloads", "lab", "loadgen")

for _name in _COMMAND_MODULES:
    try:
        _mod = importlib.import_module(f"avbench.commands.{_name}")
    except ModuleNotFoundError as exc:  # a group not written yet
        if exc.name != f"avbench.commands.{_name}":
            raise
        continue
    _mod.register(app)


def main() -> None:
    try:
        app()
    except AvbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
