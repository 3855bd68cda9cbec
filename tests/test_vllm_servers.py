"""The watcher's test for a vLLM server (``tests/vllm_servers.py``), against real processes: a
wrapper that execs Python, as the fake vLLM interpreter does, is never taken for a server while
it execs. A shell script passes ``-m vllm.entrypoints...`` back and forth with a Python
interpreter that carries no such argument. Reading the arguments and the executable around an
exec judged the shell's arguments with Python's executable (43 times in 200 round trips); reading
the executable before and after the arguments still did once in a CI run, the shell's whole turn
falling between the two reads. The judgement now rests on one read of the arguments, which
start with the shell in its turn."""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from vllm_servers import _is_server

pytestmark = pytest.mark.slow

ENTRY = "vllm.entrypoints.openai.api_server"


def test_a_python_interpreter_running_an_entry_module_is_a_server():
    """Started by a shell that exits at once, it takes the entry module's arguments half a
    second later, when it is no longer below pytest's process, where the watcher of this
    session's servers would take it for one the test started."""
    later = (
        "import os, sys, time; time.sleep(0.5); "
        "os.execv(sys.executable, [sys.executable, '-S', '-c', 'import time; time.sleep(30)', "
        f"'-m', {ENTRY!r}])"
    )
    out = subprocess.run(
        ["sh", "-c", f"{sys.executable} -S -c {shlex.quote(later)} >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    pid = int(out.stdout)
    try:
        deadline = time.monotonic() + 10
        while not _is_server(pid):
            assert time.monotonic() < deadline, "never judged a server"
            time.sleep(0.01)
    finally:
        os.kill(pid, signal.SIGKILL)


def test_a_wrapper_that_execs_python_is_never_judged_a_server_on_the_way(tmp_path):
    script = tmp_path / "ping-pong"
    back = (
        "import os, sys; n = int(sys.argv[1]); "
        f"os.execv({str(script)!r}, [{str(script)!r}, '-m', {ENTRY!r}, str(n - 1)])"
    )
    script.write_text(
        f'#!/bin/sh\n[ "$3" -le 0 ] && exit 0\nexec {sys.executable} -S -c "{back}" "$3"\n'
    )
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), "-m", ENTRY, "100"])
    judged = polls = 0
    while proc.poll() is None:
        judged += _is_server(proc.pid)
        polls += 1
    assert proc.returncode == 0 and polls > 1000
    assert judged == 0
