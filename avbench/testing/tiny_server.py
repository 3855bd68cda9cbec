"""The shipped tiny pair served by the real vLLM CPU build at a static K, with the avbench
plugin's captures on or off: what the capture benchmark and the capture integration tests
serve. Built exactly as a sweep builds its arm (``arm_server``).
"""

from __future__ import annotations

from pathlib import Path

from avbench.inputs.suite import Pair, load_suite
from avbench.plan.cells import Arm
from avbench.serving.capture import CaptureSettings
from avbench.serving.server import Launch, ServerProcess, arm_server, find_free_port


def tiny_capture_server(
    k: int,
    capture_dir: Path | None,
    log_path: Path,
    ready_timeout_s: float,
    kinds: tuple[str, ...] = ("drafts", "refits"),
) -> tuple[ServerProcess, Pair]:
    """A not yet started server of ``tiny-cpu`` at static K ``k``; ``capture_dir`` (an existing
    directory) turns on the ``kinds`` of capture for every request, None leaves it off."""
    pair = load_suite().pair("tiny-cpu")
    capture = None if capture_dir is None else (CaptureSettings(kinds, 1.0), capture_dir)
    launch = Launch(find_free_port(), log_path, capture=capture, ready_timeout_s=ready_timeout_s)
    return arm_server(pair, Arm("static", k), launch), pair
