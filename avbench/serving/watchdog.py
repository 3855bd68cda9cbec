"""Server watchdog: SIGKILLs a vLLM server's whole process group when avbench dies.

Run by path as ``python watchdog.py PGID`` with its stdin the read end of a pipe whose write end
only avbench holds. avbench writes ``disarm`` before it stops the server itself; end of file
without it means avbench died (even by SIGKILL), so the group goes at once. It cannot rely on
the server: vLLM's EngineCore is a grandchild and may ignore SIGTERM. Standard library only,
in its own session so a signal to avbench's process group does not reach it first.
"""

import os
import signal
import sys

DISARM = b"disarm"


def main() -> None:
    pgid = int(sys.argv[1])
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    if sys.stdin.buffer.read() == DISARM:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    main()
