import subprocess
import time

import pytest


def _wait(what: str, check, proc: subprocess.Popen, timeout: float):
    """Poll ``check`` until it returns something true; fail if avbench (``proc``) exits first."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if proc.poll() is not None:
            pytest.fail(f"avbench exited (code {proc.returncode}) before {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


@pytest.fixture
def wait_for():
    """``wait_for(what, check, proc, timeout)``: what a test of a running avbench waits on."""
    return _wait
