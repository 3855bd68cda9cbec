"""Every arm of every seed pair, and of the nightly sweep, through vLLM 0.33.0's own startup path.

Each arm's command line, built by avbench's ``build_command`` exactly as a sweep launches it,
goes through 0.33's ``make_arg_parser`` (``vllm.entrypoints.common.cli_args``),
``validate_parsed_serve_args``, ``AsyncEngineArgs.from_cli_args`` and
``create_engine_config()``, against config-only snapshots of the real checkpoints (the real
architectures and model types; the shipped tiny tokenizer). Where it stops on CPU:

- baseline and static arms: ``create_engine_config()`` completes. The ModelConfig of the target,
  the SpeculativeConfig with the drafter's own ModelConfig (DFlash from the repository
  sub-folder, DSpark and MTP from the target), the parallel, cache, scheduler and compilation
  configs, and VllmConfig's checks, Model Runner V2's included, are all built. What follows it
  (engine processes, weights, CUDA) cannot run on CPU.
- AV arms: in ``VllmConfig._validate_adaptive_verification``, at "requires full CUDA graphs".
  The CPU platform turns CUDA graphs off (cudagraph mode NONE) whatever the flags say. Every
  earlier check passed, the LoRA one of the same validator included, and the remaining one
  (no pipeline parallelism) holds by the static twin's config, asserted here.

Model Runner V2 is forced (``VLLM_USE_V2_MODEL_RUNNER=1``) as a GPU picks it by default.
On CPU vLLM would pick V1, because Triton has no CPU backend there, and reject every AV and DSpark arm
for that reason, which says nothing about a GPU.
"""

from __future__ import annotations

import pytest
from seed_arms import RAW_MIMO_DRAFTER, SEED_PAIRS, seed_arms

pytestmark = pytest.mark.slow

CUDA_GRAPHS = "Adaptive verification requires full CUDA graphs"


def test_the_rehearsal_ran_vllm_033_from_the_unpacked_source(engine_rehearsal, vllm_src):
    assert engine_rehearsal["vllm"]["version"] == "0.33.0"
    assert engine_rehearsal["vllm"]["file"].startswith(str(vllm_src))
    keys = {k.split("/")[0] for k in engine_rehearsal["arms"]}
    assert set(SEED_PAIRS) <= keys  # every seed pair, the nightly's three among them
    assert {s for _, s, _ in seed_arms()} >= {"nightly", "default", "av-only"}


def test_static_and_baseline_arms_build_a_complete_engine_config(engine_rehearsal):
    jobs = engine_rehearsal["jobs"]
    checked = 0
    for key, res in engine_rehearsal["arms"].items():
        if "/av-k" in key:
            continue
        assert res["stage"] == "done", f"{key}: stopped at {res['stage']}: {res.get('error')}"
        facts, argv = res["facts"], jobs[key]["argv"]
        assert facts["v2_model_runner"] and not facts["lora"]
        assert facts["pipeline_parallel"] == 1
        if "/static-k" in key:
            k = int(key.rsplit("static-k", 1)[1])
            assert facts["num_speculative_tokens"] == k
            assert facts["adaptive_verification"] is False
            # the OFF twin of AV drafts like AV does: probabilistic
            assert facts["draft_sample_method"] == "probabilistic"
            assert facts["method"] in ("dspark", "dflash", "mtp", "draft_model"), key
        if "--tensor-parallel-size" in argv:
            tp = int(argv[argv.index("--tensor-parallel-size") + 1])
            assert facts["tensor_parallel"] == tp
        checked += 1
    assert checked >= 15


def test_av_arms_reach_the_cuda_graph_check_and_nothing_earlier_fails(engine_rehearsal):
    arms = engine_rehearsal["arms"]
    av = {k: r for k, r in arms.items() if "/av-k" in k}
    assert {k.split("/")[0] for k in av} == {*SEED_PAIRS, "tiny-gpu"}
    for key, res in av.items():
        assert res["stage"] == "create_engine_config", key
        assert CUDA_GRAPHS in res["error"], f"{key}: {res['error']}"
        # The same pair's static arm at the same K: no pipeline parallelism, no LoRA, the
        # V2 runner: the rest of AV's validation holds.
        pair, sweep, arm = key.split("/")
        twin = arms.get(f"{pair}/{sweep}/static-{arm.split('-', 1)[1]}")
        if twin is not None:
            assert twin["facts"]["pipeline_parallel"] == 1 and not twin["facts"]["lora"]


def test_drafters_are_what_vllm_033_loads_and_the_raw_subfolder_id_is_not(engine_rehearsal):
    """B2: the mimo drafter is a folder of the target's repository. avbench hands vLLM the
    folder of the local snapshot, which 0.33's config loader reads; the id as written in the
    pair file is what 0.33 rejects (the first GPU run's failure, if resolution is undone)."""
    models = engine_rehearsal["models"]
    mimo = models["mimo-dflash/drafter"]
    assert mimo == {"config_json": True, "model_type": "qwen3"}
    for key, res in models.items():
        if key != "raw-mimo-drafter":
            assert "error" not in res and res["config_json"], f"{key}: {res}"
    assert models["muse-dflash2/drafter"]["model_type"] == "muse_glimmer_assistant"
    raw = models["raw-mimo-drafter"]
    assert "HFValidationError" in raw["config_json"], raw  # not even a valid repository id
    assert "Invalid repository ID" in raw["error"], raw
    assert RAW_MIMO_DRAFTER in raw["error"]
    # ... and the launched command line carries the snapshot folder, which 0.33 built as the
    # DFlash drafter's ModelConfig.
    for key, res in engine_rehearsal["arms"].items():
        if key.startswith("mimo-dflash/") and "/static-k" in key:
            assert res["facts"]["draft_model"].endswith("/snapshots/" + "0" * 40 + "/dflash")
            assert res["facts"]["draft_architecture"] == "DFlashDraftModel"
