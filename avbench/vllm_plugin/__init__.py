"""avbench's vLLM general plugin: fixes vLLM-CPU's sampler at T > 0; captures drafts and refits.

vLLM loads every ``vllm.general_plugins`` entry point in each process it starts (API server,
engine core, workers) and calls it; ``VLLM_PLUGINS=avbench`` selects this one alone. Two
independent parts, each off unless its variable is set:

``AVBENCH_CPU_EXPAND_FIX=1`` replaces the CPU build's broken expand kernel where it is broken
(``avbench.vllm_plugin.cpu_expand``) and says so in the server log.

``AVBENCH_CPU_SEED_FIX=1`` makes the CPU build's rewind of a seeded request's discarded
prefill sample work instead of killing the engine (``avbench.vllm_plugin.cpu_seed``), and says
so in the log of the process that patched it.

``AVBENCH_CAPTURE_DIR`` naming an existing directory turns captures on:

- ``AVBENCH_CAPTURE``: what to capture, comma-separated ``drafts``, ``refits``, ``steps``
  (default all three);
- ``AVBENCH_CAPTURE_DRAFT_FRACTION``: share of requests whose drafts are captured (default 1),
  chosen by a hash of the request id the client sees, so the choice is the same everywhere.

Drafts land as ``drafts-<pid>-<n>.capture.parquet`` shards, refits as lines of
``refits.<pid>.jsonl``, step timings as lines of ``steps.<pid>.jsonl``
(``avbench.vllm_plugin.steps``), and each process's health (hooks installed, errors caught,
reasons for staying inert) in ``status-<pid>.json``: the names, variables and columns are the
capture protocol's (``avbench.capture_protocol``), shared with the sweep that reads them.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path

from avbench.capture_protocol import (
    CAPTURE_KINDS,
    ENV_CPU_FIX,
    ENV_CPU_SEED_FIX,
    ENV_DIR,
    ENV_FRACTION,
    ENV_WHAT,
    PATCH_LOG_MARK,
)

_installed: dict[str, object] = {}
_cpu_fix_checked: list[str] = []


def register() -> None:
    """The entry point vLLM calls. Inert without ``AVBENCH_CPU_EXPAND_FIX``,
    ``AVBENCH_CPU_SEED_FIX`` or ``AVBENCH_CAPTURE_DIR``."""
    if os.environ.get(ENV_CPU_FIX) == "1" and ENV_CPU_FIX not in _cpu_fix_checked:
        _cpu_fix_checked.append(ENV_CPU_FIX)
        _fix_cpu_expand()
    if os.environ.get(ENV_CPU_SEED_FIX) == "1" and ENV_CPU_SEED_FIX not in _cpu_fix_checked:
        _cpu_fix_checked.append(ENV_CPU_SEED_FIX)
        _fix_cpu_seed()
    capture_dir = os.environ.get(ENV_DIR)
    if not capture_dir or not os.path.isdir(capture_dir) or _installed:
        return
    from avbench.vllm_plugin.runtime import Health, log

    health = Health(Path(capture_dir))
    _installed["health"] = health
    try:
        _install(Path(capture_dir), health)
    except Exception as exc:  # noqa: BLE001 - a capture problem must never stop vLLM
        health.error("register", exc)
        log.warning("avbench capture: not installed: %r", exc)
    atexit.register(_final_status, Path(capture_dir), health)


def _fix_cpu_expand() -> None:
    import logging

    from avbench.vllm_plugin.cpu_expand import PATCH_NAME, install

    # Under vLLM's logger, so the line reaches the server log from every process.
    log = logging.getLogger("vllm.avbench_plugin")
    try:
        not_needed = install(say=log.warning)
    except Exception as exc:  # noqa: BLE001 - the server must still start; the log says why
        log.warning("avbench: the %s fix failed: %r", PATCH_NAME, exc)
        return
    if not_needed is None:
        log.warning(
            "%s %s (exact torch expand in place of the C++ one)", PATCH_LOG_MARK, PATCH_NAME
        )
    else:
        log.info("avbench: %s fix not applied: %s", PATCH_NAME, not_needed)


def _fix_cpu_seed() -> None:
    import logging

    from avbench.vllm_plugin.cpu_seed import PATCH_NAME, RUNNER_MODULE, needed, patch
    from avbench.vllm_plugin.runtime import when_imported

    log = logging.getLogger("vllm.avbench_plugin")
    try:
        not_needed = needed()
    except Exception as exc:  # noqa: BLE001 - the server must still start; the log says why
        log.warning("avbench: the %s fix failed: %r", PATCH_NAME, exc)
        return
    if not_needed is not None:
        log.info("avbench: %s fix not applied: %s", PATCH_NAME, not_needed)
        return

    def on_import(module) -> None:
        # Only the worker imports the runner: its log line marks the server as patched.
        try:
            patched = patch(module)
        except Exception as exc:  # noqa: BLE001 - as above
            log.warning("avbench: the %s fix failed: %r", PATCH_NAME, exc)
            return
        if patched:
            log.warning(
                "%s %s (the CPU generator's saved state restored in place of vLLM's offset rewind)",
                PATCH_LOG_MARK, PATCH_NAME,
            )  # fmt: skip
        else:
            log.warning("avbench: %s fix not applied: this vLLM's runner differs", PATCH_NAME)

    when_imported(RUNNER_MODULE, on_import)


def _final_status(capture_dir: Path, health) -> None:
    """At exit, a process whose hooks ran but never captured a draft still reports its errors
    (a process that captured drafts reports through its writer)."""
    from avbench.vllm_plugin.runtime import write_status

    drafts = _installed.get("drafts")
    if getattr(drafts, "_writer", None) is None and (health.errors or health.installed):
        try:
            write_status(capture_dir, health, {"closed": True})
        except OSError:
            pass


def _install(capture_dir: Path, health) -> None:
    from avbench.vllm_plugin.runtime import log

    what = {w.strip() for w in os.environ.get(ENV_WHAT, ",".join(CAPTURE_KINDS)).split(",") if w}
    unknown = what - set(CAPTURE_KINDS)
    if unknown:
        log.warning("avbench capture: %s=%s: unknown %s", ENV_WHAT, ",".join(what), unknown)
    if "drafts" in what:
        try:
            fraction = float(os.environ.get(ENV_FRACTION, "1"))
        except ValueError:
            fraction = 1.0
            log.warning(
                "avbench capture: %s is not a number; capturing every request", ENV_FRACTION
            )
        _installed["drafts"] = _install_drafts_capture(capture_dir, fraction, health)
    if "steps" in what:
        from avbench.vllm_plugin.steps import install_steps_capture

        _installed["steps"] = install_steps_capture(capture_dir, health)
    if "refits" in what:
        try:
            from avbench.vllm_plugin.refits import install_refit_capture
        except ImportError as exc:
            health.mismatch(f"refit capture unavailable ({exc})")
            return
        if install_refit_capture(capture_dir):
            _installed["refits"] = True
        else:
            health.mismatch("refit capture off (the estimator class differs; see the log)")


def _install_drafts_capture(capture_dir: Path, fraction: float, health):
    """Patch the V1 and V2 model runners when (and if) this process imports them."""
    from avbench.vllm_plugin.drafts import DraftCapture
    from avbench.vllm_plugin.runtime import guarded, when_imported

    cap = DraftCapture(capture_dir, fraction, health)

    def v1(module_name: str):
        def cb(module) -> None:
            from avbench.vllm_plugin import v1 as hooks

            guarded(health, f"install {module_name}", hooks.patch, cap, module_name, module)

        return cb

    def v2(module_name: str):
        def cb(module) -> None:
            from avbench.vllm_plugin import v2 as hooks

            guarded(health, f"install {module_name}", hooks.patch, cap, module_name, module)

        return cb

    for name in ("vllm.v1.worker.gpu_model_runner", "vllm.v1.spec_decode.llm_base_proposer"):
        when_imported(name, v1(name))
    for name in ("vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu.spec_decode.speculator"):
        when_imported(name, v2(name))
    return cap
