"""The shipped tiny pair served by the real vLLM CPU build at a static K, with the avbench
plugin's captures on or off: what the capture benchmark and the capture integration tests
serve. Built exactly as a sweep builds its arm (``build_command``/``build_env``/``capture_env``).
"""

from __future__ import annotations

from pathlib import Path

from avbench.capture import CaptureSettings, capture_env
from avbench.plan import Arm
from avbench.server import ServerProcess, build_command, build_env, find_free_port
from avbench.suite import Pair, load_suite


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
    arm = Arm("static", k)
    env = build_env(pair, arm, None)
    if capture_dir is not None:
        env |= capture_env(CaptureSettings(kinds, 1.0), capture_dir, env)
    port = find_free_port()
    server = ServerProcess(
        cmd=build_command(pair, arm, port=port),
        env=env,
        port=port,
        log_path=log_path,
        secrets=[],
        ready_timeout_s=ready_timeout_s,
    )
    return server, pair
