"""avbench's command line in tests: run inside the test process (the same entry point, exit codes
and output as ``python -m avbench.cli``, without an interpreter start-up of about 2 s of imports
per command), or as a child that a test interrupts."""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys

import typer


def run_cli(*args: str, app: typer.Typer | None = None) -> subprocess.CompletedProcess:
    """Run ``avbench ARGS...`` (or another command line, ``app``, the same way) in this process;
    stdout and stderr are captured."""
    from avbench.cli import app as avbench_app
    from avbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["avbench", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(app or avbench_app)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(["avbench", *args], code, out.getvalue(), err.getvalue())


def default_sigint() -> None:
    """``preexec_fn`` for a child that a test interrupts as Ctrl-C in a terminal would.

    An ignored SIGINT is inherited across exec (xdist's workers and a shell's background jobs
    ignore it), and a Python started with SIGINT ignored never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
