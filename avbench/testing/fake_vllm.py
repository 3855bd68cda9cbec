"""A vLLM interpreter stand-in for launched sweeps whose point is scheduling, not serving.

``interpreter(directory, cfg)`` writes an executable to pass as ``--vllm-python``
(``SweepOptions.vllm_python``). Run as avbench runs a vLLM interpreter it does what that would:

- ``-c CODE`` (the vLLM probe, the pre-flight): the real interpreter runs it, so avbench sees
  the vLLM installed here, as it would;
- ``-m vllm.entrypoints.openai.api_server ... --port N --served-model-name M`` (passed on as
  ``--module ...``): instead of
  vLLM, the fake streaming server (``avbench.testing.fake_server``) serves ``M`` on port ``N``
  in this process, so avbench's stop, watchdog and process-group handling apply unchanged.
  Its first log line says which GPUs it was given (``CUDA_VISIBLE_DEVICES``), for the tests
  to read from each arm's server.log.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from avbench.serving.server import VLLM_MODULE, find_free_port, proc_stat
from avbench.testing.fake_server import ServerConfig, _config_from_json, _run

if TYPE_CHECKING:
    from avbench.run.runner import SweepOptions

GPUS_LINE = "fake vLLM: CUDA_VISIBLE_DEVICES="
# Set in each stand-in's environment to its interpreter's path: whose stand-in it is.
INTERPRETER_ENV = "FAKE_VLLM_INTERPRETER"


def interpreter(directory: Path, cfg: ServerConfig | None = None) -> Path:
    """An executable that stands in for a vLLM interpreter, serving ``cfg`` (its model is
    replaced by the served model name avbench asks for)."""
    root = Path(__file__).resolve().parents[2]
    path = Path(directory) / "fake-vllm-python"
    config = json.dumps(asdict(cfg or ServerConfig()))
    # "-m <vllm entry module>" becomes "--module ...": no process here looks like a vLLM
    # server to the tests' watcher of real ones (tests/vllm_servers.py).
    path.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH={shlex.quote(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f"export FAKE_VLLM_CONFIG={shlex.quote(config)}\n"
        f"export {INTERPRETER_ENV}={shlex.quote(str(path))}\n"
        'if [ "$1" = -m ]; then shift; set -- --module "$@"; fi\n'
        f'exec {shlex.quote(sys.executable)} -m avbench.testing.fake_vllm "$@"\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def gpus_given(server_log: Path) -> str | None:
    """What the arm's server was given as CUDA_VISIBLE_DEVICES (None: not set)."""
    for line in server_log.read_text().splitlines():
        if line.startswith(GPUS_LINE):
            value = line[len(GPUS_LINE) :]
            return None if value == "(unset)" else value
    raise AssertionError(f"{server_log}: no line from the fake vLLM")


def sweep_options(
    results: Path, vllm_python: str, run_id: str, concurrencies: Sequence[int] = (1, 2), **kw: Any
) -> SweepOptions:
    """A launched sweep of the tiny pair's baseline, static-k1 and static-k3 on one small
    workload, served by the stand-in ``vllm_python`` (``interpreter``); ``kw``: more options."""
    from avbench.inputs.suite import load_suite
    from avbench.run.runner import SweepOptions  # not in the stand-in server: it starts lean

    suite = load_suite()
    sweep = suite.sweep("demo").model_copy(
        update={
            "arms": ["baseline", "static"],
            "k_values": [1, 3],
            "static_k": "all",
            "workloads": ["gsm8k-tiny"],
            "concurrencies": list(concurrencies),
            "min_requests": 4,
            "requests_per_concurrency": 1,
            "warmup": 1,
            "capture": [],
        }
    )
    return SweepOptions(
        pair=suite.pair("tiny-cpu"),
        sweep=sweep,
        workloads=suite.workloads,
        results_dir=results,
        run_id=run_id,
        port=find_free_port(),
        vllm_python=vllm_python,
        **kw,
    )


def server_pid(interpreter: str, k: int) -> int | None:
    """The pid of the stand-in serving static-k<k> from ``interpreter`` (``interpreter()``'s
    path), while one runs: not another test's, as pytest-xdist runs tests side by side."""
    mine = f"{INTERPRETER_ENV}={interpreter}".encode()
    spec = f'"num_speculative_tokens": {k}'.encode()
    for pid in (int(n) for n in os.listdir("/proc") if n.isdigit()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"avbench.testing.fake_vllm" not in argv or not any(spec in a for a in argv):
                continue
            if mine in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return pid
        except OSError:
            continue
    return None


def kill_launcher_mid_arm(
    run_dir: Path, interpreter: str, k: int, running: Callable[[], bool], timeout_s: float = 240
) -> int | None:
    """Once static-k<k> has stored a cell and its server (from ``interpreter``) runs, SIGKILL
    the process that launched that server (the arm's own process, or the Ray worker running its
    task): a session lost mid-arm. Returns the killed pid; None if the arm never got there
    while ``running()``."""
    cells = run_dir / "cells.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and running():
        time.sleep(0.1)
        server = server_pid(interpreter, k)
        stored = cells.read_text() if cells.exists() else ""
        stat = proc_stat(server) if server is not None else None
        if stat is not None and f'"arm": "static-k{k}"' in stored:
            os.kill(int(stat[1]), signal.SIGKILL)
            return int(stat[1])
    return None


def _option(args: list[str], name: str, default: str) -> str:
    return args[args.index(name) + 1] if name in args else default


def main(args: list[str]) -> None:
    if args[:1] == ["-c"]:
        os.execv(sys.executable, [sys.executable, *args])
    if args[:2] != ["--module", VLLM_MODULE]:
        raise SystemExit(f"fake vLLM: expected -c CODE or -m {VLLM_MODULE}, got {args[:2]}")
    rest = args[2:]
    cfg = _config_from_json(os.environ.get("FAKE_VLLM_CONFIG", "{}"))
    cfg = replace(cfg, model=_option(rest, "--served-model-name", cfg.model))
    print(GPUS_LINE + os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"), flush=True)
    _run(cfg, _option(rest, "--host", "127.0.0.1"), int(_option(rest, "--port", "8000")))


if __name__ == "__main__":
    main(sys.argv[1:])
