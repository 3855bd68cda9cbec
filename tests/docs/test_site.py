"""The documentation site builds with `mkdocs build --strict`: a broken link or anchor fails."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_site_builds_strict(tmp_path):
    # The venv's mkdocs, through the interpreter running the tests.
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, f"mkdocs build --strict failed:\n{res.stdout}{res.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "getting-started" / "index.html").is_file()
