"""The GPU check's CPU path: vLLM 0.33's kernel files alone, run in Triton's interpreter.

``scripts/gpu_check.py prepare`` copies the few 0.33 files the checks import (what travels to
a GPU machine without vLLM); ``run --cpu`` runs every section on them here with small sizes.
On a GPU the same code runs on CUDA (with vLLM's sync checker armed, which polices CUDA only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from avbench.capture_protocol import LABEL_TRIMMED
from avbench.testing.vllm_kernels import GPU_CHECK_FILES, SYNC_CHECK_FILE

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "gpu_check.py"
ESTIMATOR_CHECK = REPO / "scripts" / "gpu_check_estimator.py"


@pytest.fixture(scope="module")
def carried(vllm_src: Path, tmp_path_factory) -> Path:
    """What `prepare` copies from the unpacked 0.33 wheel."""
    dest = tmp_path_factory.mktemp("carried") / "vllm"
    res = subprocess.run(
        [sys.executable, str(CHECK), "prepare", "--dest", str(dest)],
        capture_output=True,
        text=True,
        env=os.environ | {"AVBENCH_VLLM_SRC": str(vllm_src)},
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert files == sorted(GPU_CHECK_FILES)
    assert sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) < 1 << 20
    return dest


def _copy_without(src: Path, dest: Path, rel: str) -> Path:
    for f in GPU_CHECK_FILES:
        if f != rel:
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            (dest / f).write_bytes((src / f).read_bytes())
    return dest


def test_the_estimator_loads_from_033_files_alone_and_without_fly_says_so(carried, tmp_path):
    """B3: 0.33's rejection_sampler_utils imports v1/spec_decode/fly.py. With it the estimator
    module loads from the carried files alone; without it the check script exits 2 with one
    line naming the missing module, not a traceback."""
    code = (
        "import sys; from pathlib import Path;"
        "from avbench.testing.vllm_kernels import load_estimator_module;"
        "print(load_estimator_module(Path(sys.argv[1])).OnlineAcceptanceEstimator.REFIT_INTERVAL)"
    )
    env = os.environ | {"TRITON_INTERPRET": "1"}
    res = subprocess.run(
        [sys.executable, "-c", code, str(carried)], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0 and res.stdout.split() == ["100"], res.stderr[-2000:]
    broken = _copy_without(carried, tmp_path / "vllm", "v1/spec_decode/fly.py")
    res = subprocess.run(
        [sys.executable, str(ESTIMATOR_CHECK), "--cpu", "--vllm-src", str(broken)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "does not load from this tree" in line and "vllm.v1.spec_decode.fly" in line, line


def test_every_section_passes_in_the_interpreter(carried, tmp_path):
    out = tmp_path / "out"
    res = subprocess.run(
        [sys.executable, str(CHECK), "run", "--cpu", "--vllm-src", str(carried), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = json.loads((out / "gpu_check.json").read_text())
    assert res.returncode == 0, json.dumps(report, indent=1)[-4000:] + res.stderr[-2000:]
    assert report["passed"] and report["problems"] == []
    s = report["sections"]
    assert [s[n]["status"] for n in ("env", "estimator", "av_budget", "capture")] == ["passed"] * 4
    est = s["estimator"]
    assert est["refits"] == 1 and est["max_relative_diff_vs_numpy"] < 1e-4
    assert s["av_budget"]["cases"] >= 4 and s["av_budget"]["variants"] == ["eager"]
    cap = s["capture"]
    assert cap["checked_steps"] == 3 and cap["refit_lines"] == 1 and cap["health_errors"] == {}
    # AV admitted fewer drafts than scheduled on some requests: trimmed rows are labeled so.
    assert cap["draft_rows"] > 0 and cap["rows_per_label"].get(str(LABEL_TRIMMED), 0) > 0
    assert s["live"]["status"] == "skipped" and "not installed" in s["live"]["why"]


def test_the_shell_run_leaves_at_most_8_files_under_out_none_below_two_folders(carried, tmp_path):
    """What a lent GPU machine brings back: at most 8 files, no more than two folders below
    $OUT. `scripts/gpu_check.sh run` leaves the JSON and one bundle there; the sections' own
    files (the estimator check's output, the capture shards) are inside the bundle."""
    import tarfile

    out = tmp_path / "out"
    res = subprocess.run(
        [str(REPO / "scripts" / "gpu_check.sh"), "run", "--cpu", "--vllm-src", str(carried),
         "--only", "env,estimator,capture"],
        capture_output=True, text=True, timeout=900,
        env=os.environ | {"OUT": str(out), "PYTHON": sys.executable},
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    files = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 8, files
    assert all(len(p.parts) <= 3 for p in files), files  # <= two folders, then the file
    assert sorted(map(str, files)) == ["gpu_check-files.tar.gz", "gpu_check.json"]
    with tarfile.open(out / "gpu_check-files.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"env.json", "estimator.json", "capture.json", "estimator/summary.json"} <= names
    assert any(n.startswith("capture/") and n.endswith(".capture.parquet") for n in names)
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["passed"] and report["bundle_left_out"] == []


def test_a_broken_section_leaves_the_others_figures(carried, tmp_path):
    """A GPU machine gets one try: a section that cannot load its vLLM file is recorded as
    broken with the reason, the run goes on, and the JSON holds every section."""
    broken = _copy_without(carried, tmp_path / "vllm", SYNC_CHECK_FILE)
    out = tmp_path / "out"
    cmd = [sys.executable, str(CHECK), "run", "--cpu", "--vllm-src", str(broken)]
    res = subprocess.run(
        cmd + ["--out", str(out), "--only", "env,capture"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 1
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["sections"]["env"]["status"] == "passed"
    capture = report["sections"]["capture"]
    assert capture["status"] == "broken" and "gpu_sync_debug" in capture["why"], capture
    assert report["passed"] is False and report["problems"][0].startswith("capture: ")
    assert "FAIL: capture:" in res.stderr
