"""The sequential-cell setting from the sweep file and the command line: validated in one line,
merged field by field, refused where it cannot apply (commands run in this process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avbench.errors import AvbenchError
from avbench.inputs.suite import merge_sequential
from avbench.testing.cli import run_cli


def _error(*args: str) -> str:
    res = run_cli(*args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (("--cell-max-requests", "10"), "give --target-half-width too"),
        (("--target-half-width", "0.03", "--requests", "5"), "--cell-min-requests/--cell-max"),
        (("--target-half-width", "1.5"), "sequential.target: Input should be less than 1"),
        (("--target-half-width", "0.03", "--cell-max-requests", "8"), "above max_requests 8"),
        (("--target-half-width", "0.03", "--rates", "2"), "need a closed loop"),
    ],
)
def test_bad_sequential_options_fail_in_one_line(tmp_path, options, expected):
    err = _error("sweep", "--pair", "tiny-cpu", "--results", str(tmp_path), *options)
    assert expected in err


def test_resume_refuses_a_new_sequential_setting(tmp_path):
    err = _error("sweep", "--resume", str(tmp_path), "--target-half-width", "0.03")
    assert "refusing --target-half-width" in err


def test_a_sweep_file_sets_it_and_the_plan_sends_up_to_the_ceiling(suites_copy: Path):
    with (suites_copy / "sweeps.toml").open("a") as fh:
        fh.write(
            '\n[sweeps.seq]\nworkloads = ["gsm8k-tiny"]\nconcurrencies = [1, 4]\n'
            "sequential = { target = 0.05, max_requests = 300, max_time_s = 120 }\n"
        )
    res = run_cli(
        "plan", "--pair", "tiny-cpu", "--sweep", "seq", "--suites", str(suites_copy), "--json"
    )
    assert res.returncode == 0, res.stderr
    cells = json.loads(res.stdout)["cells"]
    assert cells and {c["num_requests"] for c in cells} == {300}
    res = run_cli("plan", "--pair", "tiny-cpu", "--sweep", "seq", "--suites", str(suites_copy))
    assert "within ±5.0%, or 300 requests, or 120 s" in " ".join(res.stdout.split())
    with (suites_copy / "sweeps.toml").open("a") as fh:
        fh.write(
            '\n[sweeps.bad]\nworkloads = ["gsm8k-tiny"]\nsequential = { target = 0.05, min_time_s = 900 }\n'
        )
    err = _error("plan", "--pair", "tiny-cpu", "--sweep", "bad", "--suites", str(suites_copy))
    assert "sweeps.toml" in err and "sweeps.bad.sequential" in err and "max_time_s 600" in err


def test_command_line_fields_go_over_the_files():
    stored = {"target": 0.05, "max_requests": 300}
    assert merge_sequential(stored, {"max_requests": 50}) == {"target": 0.05, "max_requests": 50}
    assert merge_sequential(stored, None) == stored
    assert merge_sequential(None, {"target": 0.02}) == {"target": 0.02}
    with pytest.raises(AvbenchError, match="--target-half-width"):
        merge_sequential(None, {"max_time_s": 10.0})
