"""A Hopper GPU stood in for, so vLLM's start-up checks answer on CPU as on the nightly's GPUs.

vLLM's AV checks read facts of the machine: whether the platform captures CUDA graphs, which
implementation of a model family the platform loads, the FlashAttention version (3 on Hopper,
where its decode graphs replay any batch; 2 elsewhere, where they do not) and whether DeepGEMM
lets the DeepSeek indexer take device query lengths (Hopper and Blackwell). On CPU each answer
is the CPU's. :func:`install` replaces exactly these answers, each named in :data:`STAND_INS`,
with an H100's (SM 9.0, FlashAttention 3, DeepGEMM): nothing else of vLLM changes, and every
check still runs vLLM's own code. A rehearsal interpreter gets it through ``sitecustomize``
(:func:`avbench.testing.vllm_source.rehearsal_python` with ``gpu_stand_in``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import re
import sys
from collections.abc import Callable
from types import ModuleType

# (what is stood in, where in vLLM 0.33.0, the answer given instead of the CPU's)
STAND_INS: tuple[tuple[str, str, str], ...] = (
    (
        "CUDA graphs",
        "vllm.platforms.cpu.CpuPlatform.support_static_graph_mode",
        "True: the cudagraph mode resolves as on a GPU (the CPU platform turns graphs off)",
    ),
    (
        "model implementation",
        "vllm.models.<family> imported with CpuPlatform.is_cpu() False",
        "the family's CUDA implementation (nvidia/), not its CPU one",
    ),
    (
        "FlashAttention version",
        "vllm.v1.attention.backends.flash_attn.FlashAttentionMetadataBuilder._cudagraph_support",
        "ALWAYS, FlashAttention 3's on Hopper (FlashAttention 2's is UNIFORM_BATCH)",
    ),
    (
        "DeepGEMM on Hopper",
        "vllm.v1.attention.backends.mla.indexer._supports_flattened_device_query_lens",
        "True: SM 9.0 with DeepGEMM flattens device query lengths",
    ),
)
# Model Runner V2, as vLLM picks it on a GPU (on CPU it falls back to V1: no Triton backend).
ENV = {"VLLM_USE_V2_MODEL_RUNNER": "1"}

_FAMILY = re.compile(r"^vllm\.models\.[A-Za-z0-9_]+$")


def _graphs(module: ModuleType) -> None:
    module.CpuPlatform.support_static_graph_mode = classmethod(lambda cls: True)


def _flash_attention(module: ModuleType) -> None:
    from vllm.v1.attention.backend import AttentionCGSupport

    module.FlashAttentionMetadataBuilder._cudagraph_support = AttentionCGSupport.ALWAYS


def _indexer(module: ModuleType) -> None:
    module._supports_flattened_device_query_lens = lambda: True  # type: ignore[attr-defined]


_AFTER: dict[str, Callable[[ModuleType], None]] = {
    "vllm.platforms.cpu": _graphs,
    "vllm.v1.attention.backends.flash_attn": _flash_attention,
    "vllm.v1.attention.backends.mla.indexer": _indexer,
}


_families_running: list[str] = []  # family packages being imported (one may import another)


def _as_cuda_family(exec_module: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    """A model family package run as on CUDA: its platform switch sees no CPU."""

    def run(module: ModuleType) -> None:
        from vllm.platforms.cpu import CpuPlatform

        if not _families_running:
            CpuPlatform.is_cpu = lambda self: False  # type: ignore[method-assign]
        _families_running.append(module.__name__)
        try:
            exec_module(module)
        finally:
            _families_running.pop()
            if not _families_running:
                del CpuPlatform.is_cpu  # back to Platform.is_cpu

    return run


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        after = _AFTER.get(name)
        if after is None and not _FAMILY.match(name):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module
        if after is None:
            spec.loader.exec_module = _as_cuda_family(exec_module)  # type: ignore[assignment]
        else:

            def run(module: ModuleType) -> None:
                exec_module(module)
                after(module)

            spec.loader.exec_module = run  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Stand the GPU in for every vLLM module imported from now on (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
