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
import stat
import sys
from dataclasses import asdict, replace
from pathlib import Path

from avbench.serving.server import VLLM_MODULE
from avbench.testing.fake_server import ServerConfig, _config_from_json, _run

GPUS_LINE = "fake vLLM: CUDA_VISIBLE_DEVICES="


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
