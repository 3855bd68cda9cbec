"""`make test` runs every test: the `vllm` ones and, beside them, the others; it fails when
either fails, and an interrupt stops both. `make test-fast` runs what is neither `vllm` nor
`slow` (docs/testing.md). Run by make and the shell for real, with a stand-in for the venv's
pytest that logs its arguments and exits as told."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAST = "-q -n auto -m not vllm and not slow tests"
REST = "-q -n auto --dist worksteal -m not vllm tests"
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
    assert sorted(calls) == sorted([REST, VLLM])  # side by side: either may log first
    assert code == status  # make's own status for a failed recipe


def test_make_test_fast_runs_the_tests_that_start_no_vllm(tmp_path):
    assert make("test-fast", tmp_path) == (0, [FAST])


def test_an_interrupted_make_test_stops_the_tests_beside_the_vllm_ones(tmp_path):
    """SIGINT to make's process group, as Ctrl-C sends it: the stand-ins (each sleeping, its pid
    logged) are gone soon after, the backgrounded one too, though its shell started it ignoring
    SIGINT."""
    pytest_ = tmp_path / "pytest"
    pytest_.write_text(f'#!/bin/sh\necho $$ >> "{tmp_path}/pids"\nexec sleep 120\n')
    pytest_.chmod(0o755)
    make_ = subprocess.Popen(
        ["make", "-s", "-C", str(REPO), "-o", "setup", "-o", "vllm-src", "test",
         f"BIN={tmp_path}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        # As from a terminal: this test may itself run in `make test`'s background half,
        # where SIGINT is ignored and every child would inherit that.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    pids = tmp_path / "pids"
    deadline = time.monotonic() + 30
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the two stand-ins never started"
        time.sleep(0.05)
    os.killpg(make_.pid, signal.SIGINT)
    assert make_.wait(timeout=30) != 0
    stand_ins = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while any(_running(p) for p in stand_ins):
        assert time.monotonic() < deadline, f"left running: {stand_ins}"
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_the_tests_beside_the_vllm_ones_hold_the_lock_the_quiet_ones_wait_for(tmp_path):
    """The stand-in for the `vllm` half finds the file named by AVBENCH_TESTS_BESIDE locked
    while the other half (a stand-in sleeping a second) runs, and free once it has ended."""
    pytest_ = tmp_path / "pytest"
    pytest_.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f'  *"-m vllm"*) flock -n "$AVBENCH_TESTS_BESIDE" true || echo held >> "{tmp_path}/log"\n'
        f'    flock "$AVBENCH_TESTS_BESIDE" true && echo free >> "{tmp_path}/log" ;;\n'
        f'  *) sleep 1; echo ended >> "{tmp_path}/log" ;;\n'
        "esac\n"
    )
    pytest_.chmod(0o755)
    res = subprocess.run(
        ["make", "-s", "-C", str(REPO), "-o", "setup", "-o", "vllm-src", "test",
         f"BIN={tmp_path}"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "log").read_text().split() == ["held", "ended", "free"]
