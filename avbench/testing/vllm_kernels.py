"""vLLM's acceptance-estimator module with its real Triton kernels, outside a vLLM server.

The CPU build of vLLM hands its modules a placeholder instead of Triton ("Triton is installed,
but doesn't include CPU backend"), and a GPU machine may have Triton without vLLM. Here vLLM's
own source files (from the installed package, or a directory holding a copy of its package
tree) are imported under their own module names inside stand-in parent packages whose
``vllm.triton_utils`` is the real Triton; no vLLM file is edited. On CPU, set
``TRITON_INTERPRET=1`` before Triton is first imported to run the kernels in Triton's
interpreter.

Use it in a process of its own (a test subprocess, a check script): the stand-in ``vllm``
package would shadow the real one for the rest of the process.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

from avbench.errors import AvbenchError
from avbench.vllm_plugin.runtime import ESTIMATOR_MODULE

# Every file the estimator module imports, relative to the vllm package directory (vLLM 0.32
# CPU and 0.33 GPU builds alike): copy these to run the kernels where vLLM is not installed.
SOURCE_FILES = (
    "v1/worker/gpu/spec_decode/acceptance_estimator.py",
    "v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
    "v1/worker/gpu/sample/gumbel.py",
    "v1/worker/gpu/sample/watermark.py",
    "v1/watermarking/prfs/base.py",
    "v1/watermarking/prfs/philox.py",
)

_STAND_IN = "__avbench_stand_in__"


class KernelSourceError(AvbenchError):
    """vLLM's estimator sources or Triton cannot be found."""


def installed_vllm_dir() -> Path | None:
    """The installed vllm package directory, found without importing vllm."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def load_estimator_module(source_dir: Path | None = None) -> types.ModuleType:
    """Import ``acceptance_estimator`` from ``source_dir`` (default: the installed vLLM)."""
    loaded = sys.modules.get(ESTIMATOR_MODULE)
    if loaded is not None and getattr(sys.modules["vllm"], _STAND_IN, False):
        return loaded
    if "vllm" in sys.modules:
        raise KernelSourceError(
            "vllm is already imported in this process; load the estimator in a fresh process"
        )
    root = source_dir if source_dir is not None else installed_vllm_dir()
    if root is None:
        raise KernelSourceError(
            "vllm is not installed; give a directory holding vLLM's package tree"
        )
    missing = [f for f in SOURCE_FILES if not (root / f).is_file()]
    if missing:
        raise KernelSourceError(f"{root}: missing vLLM source file(s) {', '.join(missing)}")
    try:
        import triton
        import triton.language as tl
        import triton.language.extra.libdevice as tldevice
    except ImportError as exc:
        raise KernelSourceError(f"triton is not importable ({exc})") from None

    def package(name: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        setattr(mod, _STAND_IN, True)
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)
        return mod

    for name in (
        "vllm",
        "vllm.v1",
        "vllm.v1.worker",
        "vllm.v1.worker.gpu",
        "vllm.v1.worker.gpu.spec_decode",
        "vllm.v1.worker.gpu.sample",
        "vllm.v1.watermarking",
        "vllm.v1.watermarking.prfs",
    ):
        package(name)
    utils = types.ModuleType("vllm.triton_utils")
    utils.HAS_TRITON = True
    utils.triton, utils.tl, utils.tldevice = triton, tl, tldevice
    sys.modules["vllm.triton_utils"] = utils
    sys.modules["vllm"].triton_utils = utils
    return importlib.import_module(ESTIMATOR_MODULE)
