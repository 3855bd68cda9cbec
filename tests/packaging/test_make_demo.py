"""`make demo` names one run id in all its commands, whatever the clock does meanwhile. Run by
make for real, with stand-ins for the venv's avbench (logs its arguments) and for `date` (a new
second at each call, as a recipe expanded across a second's turn sees)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_command_of_the_demo_names_the_same_run(tmp_path):
    calls, ticks = tmp_path / "calls", tmp_path / "ticks"
    avbench = tmp_path / "avbench"
    avbench.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\n')
    date = tmp_path / "date"
    date.write_text(
        f'#!/bin/sh\necho x >> "{ticks}"\nprintf "20261207-1030%02d\\n" $(wc -l < "{ticks}")\n'
    )
    for f in (avbench, date):
        f.chmod(0o755)
    res = subprocess.run(
        ["make", "-s", "-C", str(REPO), "-o", "setup", "demo", f"BIN={tmp_path}"],
        capture_output=True, text=True, check=False,
        env=os.environ | {"PATH": f"{tmp_path}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = calls.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["sweep"] * 3 + ["report", "recommend"]
    runs = set(re.findall(r"demo-\d{8}-\d{6}", " ".join(lines)))
    assert runs == {"demo-20261207-103001"}, lines
