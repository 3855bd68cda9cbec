"""The rehearsal tier: avbench's GPU-only paths against vLLM 0.33.0's real Python code, on CPU.

``make test`` fetches the 0.33.0 wheel's Python files first (``make vllm-src``); tests import
them only in subprocesses (``avbench.testing.vllm_source``). The seed pairs' checkpoints are
config-only snapshots in a temporary Hugging Face cache (``seed_hf_home``), so vLLM resolves
their ids offline exactly as after a download.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from seed_arms import GPU_PAIRS, HERE, RAW_MIMO_DRAFTER, arm_job, seed_arms

from avbench.inputs.suite import load_suite


@pytest.fixture(scope="session")
def engine_rehearsal(vllm_src: Path, seed_hf_home: Path, tmp_path_factory) -> dict:
    """Every seed arm through vLLM 0.33's startup path and every seed checkpoint id through its
    config loader, in one subprocess (one import of vLLM)."""
    from huggingface_hub import constants

    from avbench.inputs.suite import Pair
    from avbench.testing.vllm_source import rehearsal_env

    with pytest.MonkeyPatch.context() as mp:  # avbench resolves ids in the seed cache too
        mp.setenv("HF_HOME", str(seed_hf_home))
        mp.setattr(constants, "HF_HUB_CACHE", str(seed_hf_home / "hub"))
        arms = [arm_job(k) for k in seed_arms()]
        suite = load_suite()
        models = []
        for name in GPU_PAIRS:
            pair: Pair = suite.pair(name)
            for role, ref in (("target", pair.target), ("drafter", pair.drafter)):
                if ref:
                    models.append({"key": f"{name}/{role}", "model": pair.resolve(ref)})
    models.append({"key": "raw-mimo-drafter", "model": RAW_MIMO_DRAFTER})
    env = rehearsal_env(vllm_src) | {
        "HF_HOME": str(seed_hf_home),
        "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache")),
    }
    res = subprocess.run(
        [sys.executable, str(HERE / "vllm033_engine.py")],
        input=json.dumps({"arms": arms, "models": models}),
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, f"exit {res.returncode}: {res.stderr[-4000:]}"
    return json.loads(line[len("RESULT ") :]) | {"jobs": {a["key"]: a for a in arms}}
