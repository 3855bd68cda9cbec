"""avbench's vLLM general plugin: captures labeled drafts and estimator refits while serving.

vLLM loads every ``vllm.general_plugins`` entry point in each process it starts (API server,
engine core, workers) and calls it; ``VLLM_PLUGINS=avbench`` selects this one alone. It does
nothing unless ``AVBENCH_CAPTURE_DIR`` names an existing directory. Then:

- ``AVBENCH_CAPTURE``: what to capture, comma-separated ``drafts``, ``refits``, ``steps``
  (default all three);
- ``AVBENCH_CAPTURE_DRAFT_FRACTION``: share of requests whose drafts are captured (default 1),
  chosen by a hash of the request id the client sees, so the choice is the same everywhere.

Drafts land as ``drafts-<pid>-<n>.capture.parquet`` shards (schema ``CAPTURE_SCHEMA`` in
``avbench.estimator.drafts``), refits as lines of ``refits.jsonl``, step timings as lines of ``steps.<pid>.jsonl``
(``avbench.vllm_plugin.steps``), and each process's health
(hooks installed, errors caught, reasons for staying inert) in ``status-<pid>.json``.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path

ENV_DIR = "AVBENCH_CAPTURE_DIR"
ENV_WHAT = "AVBENCH_CAPTURE"
ENV_FRACTION = "AVBENCH_CAPTURE_DRAFT_FRACTION"
CAPTURES = ("drafts", "refits", "steps")

_installed: dict[str, object] = {}


def register() -> None:
    """The entry point vLLM calls. Inert without ``AVBENCH_CAPTURE_DIR``."""
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

    what = {w.strip() for w in os.environ.get(ENV_WHAT, ",".join(CAPTURES)).split(",") if w}
    unknown = what - set(CAPTURES)
    if unknown:
        log.warning("avbench capture: %s=%s: unknown %s", ENV_WHAT, ",".join(what), unknown)
    if "drafts" in what:
        from avbench.vllm_plugin.drafts import install_drafts_capture

        try:
            fraction = float(os.environ.get(ENV_FRACTION, "1"))
        except ValueError:
            fraction = 1.0
            log.warning(
                "avbench capture: %s is not a number; capturing every request", ENV_FRACTION
            )
        _installed["drafts"] = install_drafts_capture(capture_dir, fraction, health)
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
