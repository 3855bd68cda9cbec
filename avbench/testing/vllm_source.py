"""The GPU build of vLLM as Python source, imported on CPU in a subprocess (rehearsals).

``make vllm-src`` (``scripts/fetch_vllm_source.py``) unpacks the text files of the ``vllm``
wheel avbench's GPU extra pins into a cache directory. A subprocess started with
``rehearsal_env`` imports that tree ahead of the installed CPU build (``PYTHONPATH`` precedes
site-packages, and the tree carries its own ``vllm-<version>.dist-info``, so version probes see
the GPU build). ``VLLM_TARGET_DEVICE=cpu`` lets its config classes build without a GPU.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

GPU_VLLM_VERSION = "0.33.0"
ENV_SOURCE = "AVBENCH_VLLM_SRC"


class MissingSource(RuntimeError):
    """The unpacked GPU vLLM source is not where it should be."""


def source_tree() -> Path:
    """``$AVBENCH_VLLM_SRC``, else ``~/.cache/avbench/vllm-<version>``; it must hold the tree."""
    default = Path.home() / ".cache" / "avbench" / f"vllm-{GPU_VLLM_VERSION}"
    tree = Path(os.environ.get(ENV_SOURCE) or default).expanduser()
    if not (tree / "vllm" / "__init__.py").exists():
        raise MissingSource(
            f"{tree}: no vLLM {GPU_VLLM_VERSION} source here; run `make vllm-src` "
            f"(or set {ENV_SOURCE} to an unpacked vllm wheel)"
        )
    return tree


def rehearsal_env(tree: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a subprocess that must import vLLM from ``tree`` on CPU, offline."""
    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{tree}{os.pathsep}{path}" if path else str(tree)
    env |= {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return env


def rehearsal_python(tree: Path, directory: Path, *, gpu_stand_in: bool = False) -> Path:
    """An executable that runs this interpreter with ``tree`` first on its path: what
    ``--vllm-python`` takes, so avbench's own probes and pre-flight see the GPU build.

    ``gpu_stand_in``: the interpreter also answers vLLM's questions about the machine as an H100
    would (``avbench.testing.gpu_standin``, installed by a ``sitecustomize`` of its own)."""
    path = str(tree)
    extra_env = ""
    if gpu_stand_in:
        from avbench.testing.gpu_standin import ENV

        site = directory / "gpu-stand-in"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(
            "from avbench.testing.gpu_standin import install\n\ninstall()\n"
        )
        path = f"{site}{os.pathsep}{tree}"
        extra_env = "".join(f"{k}={v} " for k, v in ENV.items())
    name = "python-vllm-gpu-stand-in" if gpu_stand_in else f"python-vllm-{GPU_VLLM_VERSION}"
    script = directory / name
    script.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{path}${{PYTHONPATH:+:$PYTHONPATH}}" VLLM_TARGET_DEVICE=cpu {extra_env}'
        f'HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 exec "{sys.executable}" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script
