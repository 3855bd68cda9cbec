"""The README's offline commands run as written (docs that run)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()

# Commands a newcomer can type without a server; placeholders filled as the README suggests.
OFFLINE = [
    "avbench pairs",
    "avbench workloads",
    "avbench workloads show gsm8k",
    "avbench plan --pair tiny-cpu",
    "avbench lossless",
]


@pytest.mark.parametrize("command", OFFLINE)
def test_readme_command_runs(command):
    # Each command's first words must be documented in the README's table.
    head = " ".join(command.split()[:2])
    assert re.search(rf"`{re.escape(head)}", README), f"{head} missing from README"
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", *command.split()[1:]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip()


def test_readme_starts_with_setup_then_test():
    first_block = README.split("```")[1]
    assert first_block.index("make setup") < first_block.index("make test")
