"""`avbench pairs | workloads | plan`: ids are never cut, piped or in a narrow terminal; --json."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from avbench.inputs.suite import load_suite

CMD = [sys.executable, "-m", "avbench.cli"]


def run(*args: str, env: dict | None = None) -> str:
    res = subprocess.run(
        [*CMD, *args], capture_output=True, text=True, timeout=120, env=os.environ | (env or {})
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_piped_output_holds_every_id_whole():
    out = run("pairs")
    ids = {line.split("\t")[0] for line in out.splitlines()[2:]}
    assert ids == set(load_suite().pairs)  # dsv4-dspark included, never "dsv4-dspa…"
    assert "…" not in out
    names = {line.split("\t")[0] for line in run("workloads").splitlines()[2:]}
    assert {"speed-bench-2k-low", "speed-bench-qualitative", "synthetic"} <= names
    plan = run("plan", "--pair", "tiny-cpu").splitlines()
    assert plan[2].split("\t")[1:3] == ["baseline", "gsm8k-tiny"]


@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux script (a pty)")
def test_narrow_terminal_falls_back_to_whole_lines():
    res = subprocess.run(
        ["script", "-q", "-c", " ".join([*CMD, "pairs"]), "/dev/null"],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"COLUMNS": "40"},
    )
    assert "dsv4-dspark-estimator\t" in res.stdout and "…" not in res.stdout


def test_json_for_scripts():
    pairs = json.loads(run("pairs", "--json"))
    assert {p["name"] for p in pairs} == set(load_suite().pairs)
    workloads = json.loads(run("workloads", "--json"))
    syn = next(w for w in workloads if w["name"] == "synthetic")
    assert syn["dataset"] == "synthetic" and syn["input_len"] == 1024
    plan = json.loads(run("plan", "--pair", "tiny-cpu", "--json"))
    assert plan["arms"] == ["baseline", "static-k1", "static-k3", "av-k3"]
    assert plan["cells"][0]["cell_id"] == "baseline__gsm8k-tiny__c1__rep0"
    assert plan["sampling"]["temperature"] == 1.0  # the demo samples as the study
