"""Write docs/cli.md: every avbench command's and subcommand's --help, from the Typer app.

    python scripts/cli_reference.py           # rewrite docs/cli.md
    python scripts/cli_reference.py --check   # exit 1 if docs/cli.md differs from the help now

The help is rendered as `avbench <cmd> --help` prints it to a pipe, at a fixed width and
without colour, so the file is the same on every machine.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
WIDTH = 100

# Typer reads these when it is imported: fixed width, never a terminal, no colour. CI runners
# set GITHUB_ACTIONS / FORCE_COLOR, which would turn the colours on.
HELP_ENV = {
    "TERMINAL_WIDTH": str(WIDTH),
    "COLUMNS": str(WIDTH),
    "_TYPER_FORCE_DISABLE_TERMINAL": "1",
    "NO_COLOR": "1",
}
UNSET_ENV = ("GITHUB_ACTIONS", "FORCE_COLOR", "PY_COLORS")

HEADER = """\
# CLI reference

Every command's `--help`, as `avbench <command> --help` prints it. This page is generated from
the Typer app (`avbench.cli.app`) by `python scripts/cli_reference.py`; do not edit it by hand:
change the command's help in `avbench/commands/` and run the script again (a test fails while
this page and the help disagree).
"""


def command_paths() -> list[tuple[str, ...]]:
    """Every visible command, depth first, in the order `--help` lists them."""
    import typer
    from typer.main import get_command

    from avbench.cli import app

    paths: list[tuple[str, ...]] = []

    def walk(cmd, path: tuple[str, ...]) -> None:
        paths.append(path)
        if not hasattr(cmd, "list_commands"):
            return
        ctx = typer.Context(cmd, info_name=path[-1] if path else "avbench")
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                walk(sub, (*path, name))

    walk(get_command(app), ())
    return paths


def render() -> str:
    """The whole page, from the help the app prints now."""
    from typer.testing import CliRunner

    from avbench.cli import app

    runner = CliRunner()
    sections = [HEADER]
    for path in command_paths():
        result = runner.invoke(app, [*path, "--help"], prog_name="avbench")
        if result.exit_code != 0:
            raise SystemExit(f"avbench {' '.join(path)} --help exited {result.exit_code}")
        text = "\n".join(line.rstrip() for line in result.output.splitlines()).strip("\n")
        level = "#" * max(len(path) + 1, 2)
        sections.append(f"{level} `{' '.join(('avbench', *path))}`\n\n```text\n{text}\n```\n")
    return "\n".join(sections)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    # Before the first import of typer (every import of it here is inside a function).
    os.environ.update(HELP_ENV)
    for key in UNSET_ENV:
        os.environ.pop(key, None)
    page = render()
    if not args.check:
        DOC.write_text(page, encoding="utf-8")
        print(DOC)
        return 0
    committed = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    if committed == page:
        return 0
    diff = difflib.unified_diff(
        committed.splitlines(), page.splitlines(), "docs/cli.md", "avbench --help now", lineterm=""
    )
    print("\n".join(diff))
    print(
        "docs/cli.md differs from the CLI's help: run `python scripts/cli_reference.py`",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
