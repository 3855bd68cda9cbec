"""A stalled server fails its cell fast and the arm's remaining cells at once; resume measures
them once the server is back. The cell deadline fails one cell and the arm goes on.

Against the project's scripted streaming server, attached (it stands in for a vLLM server; the
behaviour under test is the sweep's). The stall is real: the server's process group SIGSTOPped.
"""

import json
import os
import signal
import threading
import time

import pytest

from avbench.inputs.request import Timeouts
from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm
from avbench.run.runner import SweepOptions, resume_sweep, start_sweep
from avbench.testing.fake_server import ServerConfig, serve_in_subprocess, serve_in_thread

ARM = "static-k3__humaneval-tiny"
SLACK_S = 8.0  # a busy shared machine (the read timeout, 60 s here, is what the base waited)


def _opts(tmp_path, url, concurrencies, requests, timeouts) -> SweepOptions:
    suite = load_suite()
    sweep = suite.sweep("demo").model_copy(
        update={
            "workloads": ["humaneval-tiny"],  # loads fastest
            "concurrencies": list(concurrencies),
            "min_requests": requests,
            "requests_per_concurrency": 1,
            "warmup": 0,
            "timeouts": timeouts,
        }
    )
    return SweepOptions(
        pair=suite.pair("tiny-cpu"),
        sweep=sweep,
        workloads=suite.workloads,
        results_dir=tmp_path,
        run_id="r",
        endpoint=url,
        attach_arm=Arm("static", 3),
    )


@pytest.mark.slow
def test_a_frozen_server_fails_the_cell_and_the_arms_other_cells_then_resume_measures(tmp_path):
    cfg = ServerConfig(model="tiny-target", output_tokens=40, inter_chunk_delay_s=0.05)
    with serve_in_subprocess(cfg) as srv:
        frozen: list[float] = []

        def freeze_in_the_first_cell():
            deadline = time.monotonic() + 60
            while srv.stats()["requests"] < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            frozen.append(time.monotonic())
            os.killpg(srv.proc.pid, signal.SIGSTOP)

        freezer = threading.Thread(target=freeze_in_the_first_cell)
        freezer.start()
        try:
            opts = _opts(tmp_path, srv.base_url, (1, 2), 4, Timeouts(stall_s=1.0, read_s=60))
            out = start_sweep(opts)
            done = time.monotonic()
        finally:
            freezer.join()
            os.killpg(srv.proc.pid, signal.SIGCONT)
        store = out.store
        first, second = (json.loads(x) for x in store.failures_path.read_text().splitlines())
        assert first["cell_id"] == f"{ARM}__c1__rep0" and second["cell_id"] == f"{ARM}__c2__rep0"
        for f in (first, second):
            assert f["failure_kind"] == "server_stalled"
            assert f["reason"].startswith("server stalled: no progress on any of 1 in-flight")
            assert "GET /health: no answer within 1 s" in f["reason"]
        # 1 s of silence + 1 s for /health; the second cell is not waited for at all.
        assert done - frozen[0] < 2.0 + SLACK_S, (done - frozen[0], first["reason"])
        assert first["requests_ok"] == 1 and first["requests_failed"] == 1
        assert (store.root / first["requests_file"]).exists()  # what the cell measured
        assert store.finished_cells() == {}
        assert json.loads(store.manifest_path.read_text())["status"] == "finished_with_failures"

        again = resume_sweep(store.root, {})  # the server answers again
        assert sorted(again.store.finished_cells()) == [f"{ARM}__c1__rep0", f"{ARM}__c2__rep0"]
        assert not again.failed
        assert json.loads(store.manifest_path.read_text())["status"] == "finished"


def test_the_cell_deadline_fails_that_cell_and_the_arm_goes_on(tmp_path):
    cfg = ServerConfig(model="tiny-target", output_tokens=40, inter_chunk_delay_s=0.05)
    with serve_in_thread(cfg) as srv:
        out = start_sweep(_opts(tmp_path, srv.base_url, (1, 2), 4, Timeouts(cell_s=0.5)))
        sent = srv.stats()["requests"]
    kinds = [(f.cell_id.split("__")[2], f.kind) for f in out.store.failures()]
    assert kinds == [("c1", "cell_deadline"), ("c2", "cell_deadline")]
    assert out.store.failures()[0].reason == "cell deadline: not finished within 0.5 s"
    assert sent == 3, sent  # c=1 sent one request, then c=2 ran (two), each cut at 0.5 s
