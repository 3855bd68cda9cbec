"""`make test` runs both tiers whatever the first gives, and fails when either fails; `make
test-fast` runs the first alone (docs/testing.md). Run by make and the shell for real, with a
stand-in for the venv's pytest that logs its arguments and exits as told."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAST = "-q -n auto -m not vllm tests"
VLLM = "-q -m vllm --durations=25 tests"


def make(target: str, bin_dir: Path, fail: str = "") -> tuple[int, list[str]]:
    """``make target`` with ``bin_dir`` as the venv's bin; the stand-in pytest exits 1 when its
    arguments contain ``fail``. Returns make's status and the pytest calls, one per line."""
    pytest_ = bin_dir / "pytest"
    pytest_.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{bin_dir}/calls"\n'
        f'case "$*" in *"{fail}"*) [ -n "{fail}" ] && exit 1 ;; esac\n'
        "exit 0\n"
    )
    pytest_.chmod(0o755)
    (bin_dir / "calls").unlink(missing_ok=True)
    # -o: setup and the vLLM source are taken as made (they would install and download).
    res = subprocess.run(
        ["make", "-s", "-C", str(REPO), "-o", "setup", "-o", "vllm-src", target,
         f"BIN={bin_dir}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return res.returncode, (bin_dir / "calls").read_text().splitlines()


@pytest.mark.parametrize(
    ("fail", "status"), [("", 0), ("not vllm", 2), ("-m vllm", 2)], ids=["pass", "fast", "vllm"]
)
def test_make_test_runs_both_tiers_and_fails_when_either_fails(tmp_path, fail, status):
    code, calls = make("test", tmp_path, fail)
    assert calls == [FAST, VLLM]
    assert code == status  # make's own status for a failed recipe


def test_make_test_fast_runs_the_tests_that_start_no_vllm(tmp_path):
    assert make("test-fast", tmp_path) == (0, [FAST])
