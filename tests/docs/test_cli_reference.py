"""docs/cli.md is every command's --help as the CLI prints it now."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from avbench.testing.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cli_reference.py"
# The script's settings (width, no colour); loading it imports nothing of typer or avbench.
cli_reference = load_script("cli_reference")
FIX = "docs/cli.md is out of date: run `python scripts/cli_reference.py` and commit docs/cli.md"


def test_cli_reference_is_current():
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, f"{FIX}\n{res.stdout[-6000:]}{res.stderr[-2000:]}"


@pytest.mark.parametrize("command", [[], ["sweep"], ["workloads", "show"]])
def test_reference_matches_the_entry_point(command):
    """The script renders in-process; the real entry point (`avbench`) prints the same."""
    env = {k: v for k, v in os.environ.items() if k not in cli_reference.UNSET_ENV}
    env.update(cli_reference.HELP_ENV)
    run_as_avbench = "import sys; from avbench.cli import main; sys.argv[0] = 'avbench'; main()"
    res = subprocess.run(
        [sys.executable, "-c", run_as_avbench, *command, "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    printed = "\n".join(line.rstrip() for line in res.stdout.splitlines()).strip("\n")
    heading = "`" + " ".join(["avbench", *command]) + "`"
    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert f"{heading}\n\n```text\n{printed}\n```\n" in page, FIX
