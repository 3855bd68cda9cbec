"""The load driver's timeouts are settable in the sweep file and on the command line, field by
field, are stored with the run, and reach the driver: a stall timeout of 1 s fails a cell whose
server only sends SSE keep-alive comments in about a second.

Against the project's scripted streaming server (it stands in for vLLM; the fault is real: every
response turns into ``: ping`` comments halfway), through the real CLI in this process."""

import io
import json
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import avbench.cli
from avbench.testing.fake_server import ServerConfig, serve_in_thread

REPO = Path(__file__).resolve().parents[2]


def _main(*argv: str) -> tuple[int, str]:
    err, old = io.StringIO(), sys.argv
    sys.argv = ["avbench", *argv]
    try:
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            try:
                avbench.cli.main()
                return 0, err.getvalue()
            except SystemExit as exc:
                return exc.code, err.getvalue()
    finally:
        sys.argv = old


@pytest.fixture(scope="module")
def pinging_server():
    cfg = ServerConfig(
        model="tiny-target", output_tokens=8, ping_interval_s=0.05, faults_by_index={0: "pings"}
    )
    with serve_in_thread(cfg) as srv:
        yield srv


def _sweep(url: str, results: Path, *extra: str) -> tuple[str, ...]:
    return (
        "sweep", "--pair", "tiny-cpu", "--endpoint", url, "--arm", "static-k3",
        "--workloads", "humaneval-tiny", "--concurrencies", "1", "--warmup", "0",
        "--requests", "2", "--results", str(results), "--run-id", "r", "--no-report", *extra,
    )  # fmt: skip


def test_sweep_file_and_command_line_timeouts_are_merged_and_stored(tmp_path, suites_copy):
    sweeps = suites_copy / "sweeps.toml"
    line = "timeouts = { stall_s = 5.0, cell_s = 100.0 }\n"
    sweeps.write_text(sweeps.read_text().replace("[sweeps.demo]\n", f"[sweeps.demo]\n{line}", 1))
    with serve_in_thread(ServerConfig(model="tiny-target", output_tokens=4)) as srv:
        code, err = _main(
            *_sweep(srv.base_url, tmp_path, "--suites", str(suites_copy)), "--read-timeout", "9"
        )
    assert code == 0, err
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["sweep"]["timeouts"] == {
        "request_s": 600.0, "read_s": 9.0, "stall_s": 5.0, "cell_s": 100.0,
    }  # fmt: skip


def test_a_stall_timeout_from_the_command_line_reaches_the_driver(tmp_path, pinging_server):
    t0 = time.monotonic()
    code, err = _main(*_sweep(pinging_server.base_url, tmp_path, "--stall-timeout", "1"))
    took = time.monotonic() - t0
    assert code == 1, err
    assert "server stalled: no progress on any of 1 in-flight request(s)" in err
    (failure,) = [
        json.loads(x) for x in (tmp_path / "r" / "failures.jsonl").read_text().splitlines()
    ]
    assert failure["failure_kind"] == "server_stalled"
    assert took < 30, took  # the read timeout (120 s) was never waited for
