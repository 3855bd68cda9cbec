"""Runs under vLLM 0.33.0's source on CPU (``rehearsal_env``): avbench's server command lines
through vLLM's own startup path, and checkpoint ids through vLLM's own config loader.

Reads one JSON from stdin: ``{"arms": [{"key", "env", "argv"}...], "models": [{"key", "model"}...]}``
and prints one line ``RESULT <json>``. Per arm, the stage it reached (parse, validate,
from_cli_args, create_engine_config, done), the error there, and facts of the built config;
per model, what ``file_or_path_exists`` and ``get_config`` say.

The model registry inspects each architecture's class in a fresh subprocess so that CUDA is
never initialised in the engine process; on CPU there is no CUDA to protect, so here the same
inspection runs in this process (one import of vLLM instead of one per architecture).
"""

import json
import os
import sys


def engine_stages(argv: list[str]) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    out: dict = {"stage": "parse"}
    try:
        ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        out["stage"] = "validate"
        validate_parsed_serve_args(ns)
        out["stage"] = "from_cli_args"
        engine_args = AsyncEngineArgs.from_cli_args(ns)
        out["stage"] = "create_engine_config"
        config = engine_args.create_engine_config()
    except BaseException as exc:  # SystemExit from argparse included
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]
        return out
    out["stage"] = "done"
    spec = config.speculative_config
    out["facts"] = {
        "architecture": config.model_config.architecture,
        "tensor_parallel": config.parallel_config.tensor_parallel_size,
        "pipeline_parallel": config.parallel_config.pipeline_parallel_size,
        "lora": config.lora_config is not None,
        "v2_model_runner": bool(config.use_v2_model_runner),
        "cudagraph_mode": str(config.compilation_config.cudagraph_mode),
        "method": getattr(spec, "method", None),
        "num_speculative_tokens": getattr(spec, "num_speculative_tokens", None),
        "draft_model": getattr(getattr(spec, "draft_model_config", None), "model", None),
        "draft_architecture": getattr(
            getattr(spec, "draft_model_config", None), "architecture", None
        ),
        "draft_sample_method": getattr(spec, "draft_sample_method", None),
        "adaptive_verification": getattr(spec, "enable_adaptive_verification", None),
    }
    return out


def model_check(model: str) -> dict:
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.repo_utils import file_or_path_exists

    out: dict = {}
    try:
        out["config_json"] = file_or_path_exists(model, "config.json", revision=None)
    except Exception as exc:
        out["config_json"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
    try:
        out["model_type"] = get_config(model, trust_remote_code=False).model_type
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:1000]
    return out


def main() -> None:
    import vllm.model_executor.models.registry as registry

    registry._run_in_subprocess = lambda fn: fn()
    job = json.load(sys.stdin)
    base = dict(os.environ)
    arms = {}
    for arm in job["arms"]:
        os.environ.clear()
        os.environ.update(base | arm["env"])  # vLLM reads its settings when asked
        arms[arm["key"]] = engine_stages(arm["argv"])
    os.environ.clear()
    os.environ.update(base)
    models = {m["key"]: model_check(m["model"]) for m in job["models"]}
    import vllm

    where = {"version": vllm.__version__, "file": vllm.__file__}
    print("RESULT " + json.dumps({"vllm": where, "arms": arms, "models": models}))


if __name__ == "__main__":
    main()
