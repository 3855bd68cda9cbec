"""Each way a sweep can fail to start says so in one line (run through the real CLI)."""

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from avbench.serving.server import group_alive, probe_vllm


def avbench(*args, env=None, cwd=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "avbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=(os.environ | (env or {})),
    )


def one_line_error(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


def test_unknown_pair():
    res = avbench("sweep", "--pair", "nope")
    assert res.returncode == 2
    assert "unknown pair 'nope'" in one_line_error(res)


def test_malformed_suite(suites_copy: Path):
    (suites_copy / "sweeps.toml").write_text("[sweeps.demo]\nconcurrencies = 'many'\n")
    res = avbench("plan", "--pair", "tiny-cpu", "--suites", str(suites_copy))
    assert res.returncode == 2
    err = one_line_error(res)
    assert "sweeps.toml" in err and "sweeps.demo" in err


def test_missing_vllm(tmp_path):
    base = str(Path(sys.base_prefix) / "bin" / "python3")
    if probe_vllm(base).distribution is not None:
        pytest.skip("base interpreter has vLLM")
    res = avbench("sweep", "--pair", "tiny-cpu", "--results", str(tmp_path), "--vllm-python", base)
    assert res.returncode == 2
    assert "vLLM is not installed" in one_line_error(res)


def test_busy_port(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = avbench(
            "sweep", "--pair", "tiny-cpu", "--results", str(tmp_path), "--port", str(port)
        )
    assert res.returncode == 2
    assert f"port {port}" in one_line_error(res) and "already in use" in res.stderr
    assert not any(tmp_path.iterdir())  # refused before creating a run


def fake_vllm_python(tmp_path: Path) -> str:
    """Stand-in for an interpreter whose vLLM hangs during start-up: the capability probe
    (python -c ...) goes to the real interpreter, the server launch sleeps forever."""
    script = tmp_path / "fake-python"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-c" ]; then exec "{sys.executable}" "$@"; fi\n'
        'echo "fake vLLM: loading weights with key $VLLM_API_KEY"\n'
        "exec sleep 300\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.slow
def test_server_never_ready_fails_each_arm_and_goes_on(tmp_path):
    key = "sk-test-never-ready-7f3a"
    res = avbench(
        "sweep",
        "--pair",
        "tiny-cpu",
        "--results",
        str(tmp_path),
        "--run-id",
        "r",
        "--vllm-python",
        fake_vllm_python(tmp_path),
        "--ready-timeout",
        "2",
        "--port",
        "18731",
        "--concurrencies",
        "1",
        "--workloads",
        "gsm8k-tiny",
        env={"OPENAI_API_KEY": key},
        timeout=180,
    )
    assert res.returncode == 1, res.stderr
    run = tmp_path / "r"
    failures = (run / "failures.jsonl").read_text().splitlines()
    # baseline, static-k1, static-k3 time out; av-k3 is refused as unsupported (CPU build).
    assert len(failures) == 4
    assert res.stderr.count("did not become ready within 2 s") >= 3
    assert "Model Runner V1" in res.stderr or "enable_adaptive_verification" in res.stderr
    for arm in ("baseline", "static-k1", "static-k3"):
        pgid = int((run / "arms" / arm / "server.pid").read_text())
        deadline = time.monotonic() + 5
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not group_alive(pgid), f"{arm} server group {pgid} still alive"
    leaked = [p for p in run.rglob("*") if p.is_file() and key in p.read_text(errors="replace")]
    assert leaked == []
    assert "***" in (run / "arms" / "baseline" / "server.log").read_text()
