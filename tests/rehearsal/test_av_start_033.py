"""vLLM 0.33.0's own adaptive-verification start-up checks for every seed pair's AV arm, on CPU.

``avbench.checks.av_start`` runs, in vLLM's interpreter and without loading a model: the engine
config (``create_engine_config``), the speculator ``init_speculator`` picks, and
``maybe_create_adaptive_verification_manager`` over the attention backends the target's
implementation hard-wires (``get_query_lens_mismatch_unsupported_backend``,
``get_varlen_cudagraph_unsupported_backend``). On CPU those checks read the CPU's answers, so
the GPU is stood in for: ``gpu_standin_python`` (``avbench.testing.gpu_standin.STAND_INS``)
replaces exactly these answers with an H100's, and nothing else of vLLM:

- CUDA graphs: ``CpuPlatform.support_static_graph_mode`` answers True (the platform check);
- model implementation: each model family package imports its CUDA implementation (nvidia/);
- FlashAttention version: its metadata builder's CUDA-graph support is FlashAttention 3's;
- DeepGEMM on Hopper: the DeepSeek indexer may take device query lengths;
- Model Runner V2, as vLLM picks it on a GPU.

Without the stand-in the same checks stop every AV arm at the CPU platform (the last test).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from seed_arms import SEED_PAIRS

from avbench.checks.av_start import av_start_checks
from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm
from avbench.testing.gpu_standin import STAND_INS

pytestmark = pytest.mark.slow

INKLING_REFUSAL = (
    "Adaptive verification replays decode cudagraphs whose per-request query lengths vary up "
    "to 4, but InklingSconvBackend allows none."
)


def _seed_av_jobs() -> list[tuple]:
    """Every seed pair's AV arm in the sweep that runs it: the nightly's for its three pairs,
    the pair's own otherwise."""
    suite = load_suite()
    nightly = suite.sweep("nightly")
    jobs = []
    for name in SEED_PAIRS:
        pair = suite.pair(name)
        sweep = nightly if name in nightly.pairs else suite.sweep(pair.default_sweep)
        jobs.append((pair, Arm("av", pair.max_k), sweep))
    return jobs


@pytest.fixture(scope="module")
def av_start(gpu_standin_python, seed_hf_home) -> dict:
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as mp:  # avbench resolves the mimo drafter there too
        mp.setenv("HF_HOME", str(seed_hf_home))
        mp.setattr(constants, "HF_HUB_CACHE", str(seed_hf_home / "hub"))
        jobs = [j for j in _seed_av_jobs() if j[0].confidence_head != "off"]
        return {r.pair: r for r in av_start_checks(jobs, str(gpu_standin_python))}


def test_the_stand_in_is_the_named_platform_answers_and_nothing_else():
    assert [s[0] for s in STAND_INS] == [
        "CUDA graphs", "model implementation", "FlashAttention version", "DeepGEMM on Hopper",
    ]  # fmt: skip
    assert STAND_INS[0][1] == "vllm.platforms.cpu.CpuPlatform.support_static_graph_mode"


def test_inkling_mtp_av_is_refused_by_vllm_033s_own_backend_check(av_start):
    """Item 1 of issue 30: Inkling's short-conv state (InklingSconvBackend, UNIFORM_BATCH with
    no variable-length bound) cannot replay the decode graphs AV trims, and 0.33's
    maybe_create_adaptive_verification_manager says so: the arm is unsupported before any
    server starts, in vLLM's words."""
    res = av_start["inkling-mtp"]
    assert res.refused is not None and res.refused.startswith(INKLING_REFUSAL), res
    assert "InklingSconvBackend" in res.backends
    assert res.cudagraph_mode == "FULL_AND_PIECEWISE"  # the config stage passed: graphs on
    assert res.speculator == "MultiModuleMTPSpeculator"  # a draft-model speculator: AV's
    assert res.reason("vllm 0.33.0").startswith(
        "av-k3: vllm 0.33.0 refuses adaptive verification at start: Adaptive verification"
    )


def test_the_other_seed_pairs_pass_every_check_vllm_033_runs_before_load(av_start):
    assert set(av_start) == {"dsv4-dspark", "mimo-dflash", "inkling-mtp", "muse-dflash2"}
    mimo, dsv4, muse = av_start["mimo-dflash"], av_start["dsv4-dspark"], av_start["muse-dflash2"]
    for res in (mimo, dsv4, muse):
        assert res.refused is None, res
        assert res.cudagraph_mode in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"), res
    # MiMo's generic attention layers take the backend the nightly pins (FLASH_ATTN).
    assert mimo.backends == ("FlashAttentionBackend",) and not mimo.unchecked
    assert mimo.speculator == "DFlashSpeculator"
    # DeepSeek-V4 hard-wires its sparse-MLA, indexer, compressor and SWA backends.
    assert {"DeepseekV4IndexerBackend", "DeepseekV4FlashMLABackend", "CompressorBackend",
            "DeepseekSparseSWAFlashMLABackend"} <= set(dsv4.backends)  # fmt: skip
    assert dsv4.speculator == "DSparkSpeculator"
    # Muse's layers take theirs from vLLM's selector at start: said, not guessed.
    assert muse.backends == () and any("selector" in u for u in muse.unchecked), muse


def test_cli_preflight_of_the_nightly_reports_every_arm_startable_or_unsupported(
    gpu_standin_python, seed_checkpoints
):
    """`avbench preflight --sweep nightly` as a user runs it against 0.33.0 on a GPU machine:
    one line per arm of every pair, startable or unsupported with the reason, exit 0."""
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "preflight", "--sweep", "nightly",
         "--vllm-python", str(gpu_standin_python)],
        capture_output=True, text=True, env=os.environ | {"COLUMNS": "300"}, timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    verdicts = {}
    for line in res.stdout.splitlines():
        if line.startswith("pair ") and ": " in line:
            where, verdict = line.split(": ", 1)
            verdicts[where] = verdict
    suite = load_suite()
    assert {w.split(",")[0].removeprefix("pair ") for w in verdicts} == set(suite.pairs)
    for where, verdict in verdicts.items():
        assert verdict == "startable" or verdict.startswith("unsupported: "), (where, verdict)
    assert verdicts["pair inkling-mtp, arm av-k3"].startswith(
        "unsupported: av-k3: vllm 0.33.0 refuses adaptive verification at start: " + INKLING_REFUSAL
    )
    assert verdicts["pair inkling-mtp, arm static-k3"] == "startable"
    for pair in ("mimo-dflash", "dsv4-dspark"):
        assert all(v == "startable" for w, v in verdicts.items() if w.startswith(f"pair {pair},"))
    assert "--enforce-eager" in verdicts["pair tiny-cpu, arm av-k3"]
    assert "no switch" in verdicts["pair dsv4-dspark-estimator, arm av-k5"]


def test_without_the_stand_in_vllms_cpu_platform_refuses_every_av_arm(
    gpu_vllm_python, seed_checkpoints, monkeypatch
):
    """The platform check itself: with Model Runner V2 asked for as above but the CPU's own
    answers, vLLM turns CUDA graphs off and its config validation refuses every AV arm."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    jobs = [j for j in _seed_av_jobs() if j[0].confidence_head != "off"]
    for res in av_start_checks(jobs, str(gpu_vllm_python)):
        assert res.refused is not None and "requires full CUDA graphs" in res.refused, res
        assert res.speculator is None  # stopped at the config stage


def test_doctor_warns_of_the_av_arm_vllm_would_refuse(
    gpu_standin_python, seed_checkpoints, tmp_path
):
    from avbench.checks.doctor import DoctorOptions, run_doctor

    checks = run_doctor(
        DoctorOptions(python=str(gpu_standin_python), pair="inkling-mtp", sweep="nightly",
                      results=tmp_path)
    )  # fmt: skip
    av = [c for c in checks if c.name == "adaptive verification" and "refuses" in c.detail]
    assert len(av) == 1 and av[0].status == "warn", [c.line() for c in checks]
    assert av[0].detail.startswith("pair inkling-mtp: av-k3: vllm 0.33.0 refuses adaptive")
    assert INKLING_REFUSAL in av[0].detail
