"""What the rehearsal tier runs through vLLM 0.33: the seed pairs' arms as a sweep builds them."""

from __future__ import annotations

from pathlib import Path

from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm, arms_for
from avbench.serving.server import build_command, build_env

HERE = Path(__file__).resolve().parent
SEED_PAIRS = ("dsv4-dspark", "dsv4-dspark-estimator", "mimo-dflash", "inkling-mtp", "muse-dflash2")
# The GPU check's pair (scripts/gpu_check.py serves it where vLLM's GPU build is installed).
GPU_PAIRS = (*SEED_PAIRS, "tiny-gpu")
RAW_MIMO_DRAFTER = "XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash/dflash"


def seed_arms() -> list[tuple[str, str, str]]:
    """(pair, sweep, arm) of every arm of the GPU pairs under their default sweep and every
    sweep that lists them (the nightly)."""
    suite = load_suite()
    out = []
    for name in GPU_PAIRS:
        pair = suite.pair(name)
        sweeps = {pair.default_sweep} | {s.name for s in suite.sweeps.values() if name in s.pairs}
        for sweep in sorted(sweeps):
            out += [(name, sweep, a.name) for a in arms_for(pair, suite.sweep(sweep))]
    return out


def arm_job(key: tuple[str, str, str]) -> dict:
    """The arm's server command line (past interpreter and module) and environment, exactly as
    a sweep builds them; Model Runner V2 forced as a GPU would choose it (vLLM 0.33's default:
    on CPU it falls back to V1 because Triton has no CPU backend there)."""
    suite = load_suite()
    pair, sweep, arm = suite.pair(key[0]), suite.sweep(key[1]), Arm.parse(key[2])
    argv = build_command(pair, arm, port=8000, sweep=sweep)[3:]
    env = build_env(pair, arm, None) | {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    return {"key": "/".join(key), "env": env, "argv": argv}
