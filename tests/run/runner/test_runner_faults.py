"""How the sweep judges a cell and refuses what it cannot measure, against the project's
scripted streaming server (the behaviour under test is avbench's, the faults are real: HTTP
errors, cut streams, a server process killed mid-cell, closed ports, wrong keys)."""

import json
import os
import signal
import socket
import threading
import time

import pytest
from pydantic import SecretStr

from avbench.errors import AvbenchError, ServerError, StoreError
from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm
from avbench.run.runner import SweepOptions, resume_sweep, start_sweep
from avbench.store.failures import FailureKind
from avbench.store.run_store import RunStore
from avbench.testing.fake_server import ServerConfig, serve_in_subprocess, serve_in_thread


def _opts(tmp_path, url, run_id="r", concurrencies=(4,), requests=40, **kw):
    suite = load_suite()
    sweep = suite.sweep("demo").model_copy(
        update={
            "workloads": ["gsm8k-tiny"],
            "concurrencies": list(concurrencies),
            "min_requests": requests,
            "requests_per_concurrency": 1,
            "warmup": 0,
        }
    )
    return SweepOptions(
        pair=suite.pair("tiny-cpu"),
        sweep=sweep,
        workloads=suite.workloads,
        results_dir=tmp_path,
        run_id=run_id,
        endpoint=url,
        attach_arm=Arm("static", 3),
        **kw,
    )


def _manifest(store: RunStore) -> dict:
    return json.loads(store.manifest_path.read_text())


def test_a_cell_with_17_of_40_requests_failed_is_a_failed_cell(tmp_path):
    faults = {i: ("http_5xx" if i % 2 else "cut") for i in range(3, 37, 2)}  # 17 requests
    assert len(faults) == 17
    cfg = ServerConfig(model="tiny-target", output_tokens=12, faults_by_index=faults)
    with serve_in_thread(cfg) as srv:
        out = start_sweep(_opts(tmp_path, srv.base_url))
        store = out.store
        cell_id = "static-k3__gsm8k-tiny__c4__rep0"
        assert store.finished_cells() == {} and not out.finished
        (failure,) = store.failures()
        assert failure.cell_id == cell_id and failure.kind == FailureKind.REQUESTS_FAILED
        assert failure.reason.startswith(
            "17 of 40 measured requests failed (42% > max_failed_share 10%)"
        )
        assert failure.requests_ok == 23 and failure.requests_failed == 17
        # What was measured stays on disk for inspection, where reports never look.
        kept = store.root / failure.requests_file
        assert kept == store.failed_requests_path(cell_id, 1)
        partial = RunStore.open(store.root).records_frame()
        assert partial.empty
        import pandas as pd

        df = pd.read_parquet(kept)
        assert len(df) == 40 and df["error"].notna().sum() == 17
        m = _manifest(store)
        assert m["status"] == "finished_with_failures"
        assert m["counts"] == {"measured": 0, "failed": 1, "unsupported": 0, "already_done": 0}
        # The server's fault script is spent: resume measures the cell for real this time.
        again = resume_sweep(store.root, {})
        assert len(again.finished) == 1 and not again.failed
        assert again.finished[0]["requests_failed"] == 0
        assert list(store.finished_cells()) == [cell_id]
        assert _manifest(store)["status"] == "finished"
        assert kept.exists() and len(store.failures()) == 1  # history kept


def test_a_few_failures_under_the_threshold_still_measure(tmp_path):
    cfg = ServerConfig(model="tiny-target", output_tokens=6, faults_by_index={5: "http_5xx"})
    with serve_in_thread(cfg) as srv:
        out = start_sweep(_opts(tmp_path, srv.base_url, requests=20))
    (row,) = out.store.finished_cells().values()
    assert row["requests_failed"] == 1 and row["requests_ok"] == 19
    assert out.store.failures() == []


def test_attached_server_killed_mid_cell_fails_that_cell_and_the_rest(tmp_path):
    # A slow server so that the kill lands inside the first cell.
    cfg = ServerConfig(model="tiny-target", output_tokens=40, inter_chunk_delay_s=0.05)
    with serve_in_subprocess(cfg) as srv:
        url = srv.base_url

        def kill_when_busy():
            deadline = time.monotonic() + 30
            while srv.stats()["requests"] < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            os.killpg(srv.proc.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        out = start_sweep(_opts(tmp_path, url, concurrencies=(2, 4), requests=12))
        killer.join()
    store = out.store
    assert store.finished_cells() == {}
    failures = store.failures()
    assert [f.cell_id.split("__")[2] for f in failures] == ["c2", "c4"]
    assert {f.kind for f in failures} == {FailureKind.SERVER_DIED}
    assert "stopped answering during the cell" in failures[0].reason
    assert _manifest(store)["status"] == "finished_with_failures"


def test_an_engine_dead_behind_a_live_http_server_fails_its_cell_and_stops_the_arm(tmp_path):
    # The second cell's last request kills the fake's engine: as vLLM's API server does then,
    # every open and later stream gets an error event and [DONE], and /health answers 503.
    # One failed request of 20 is under max_failed_share: /health is what fails the cell.
    cfg = ServerConfig(model="tiny-target", output_tokens=8, faults_by_index={39: "engine_dead"})
    with serve_in_thread(cfg) as srv:
        out = start_sweep(_opts(tmp_path, srv.base_url, concurrencies=(1, 2, 4), requests=20))
        store = out.store
        assert list(store.finished_cells()) == ["static-k3__gsm8k-tiny__c1__rep0"]
        died, unrun = store.failures()
        assert died.cell_id.endswith("__c2__rep0") and unrun.cell_id.endswith("__c4__rep0")
        assert died.kind == unrun.kind == FailureKind.ENGINE_DIED
        assert died.reason == "the server's engine is not serving (GET /health: HTTP 503)"
        assert died.requests_failed == 1 and died.requests_ok == 19  # kept aside, records too
        assert (store.root / died.requests_file).exists()
        assert unrun.requests_file is None and srv.stats()["requests"] == 40  # c4 sent nothing
        assert _manifest(store)["status"] == "finished_with_failures"

        srv.revive()  # the engine is back: --resume measures both
        again = resume_sweep(store.root, {})
    assert sorted(c.split("__")[2] for c in again.store.finished_cells()) == ["c1", "c2", "c4"]
    assert again.failed == []


def test_endpoint_problems_stop_before_any_run_exists(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with pytest.raises(ServerError, match="cannot connect"):
        start_sweep(_opts(tmp_path, f"http://127.0.0.1:{closed}"))
    cfg = ServerConfig(model="tiny-target", api_key="sk-right-key-1234")
    with serve_in_thread(cfg) as srv:
        with pytest.raises(ServerError, match="HTTP 401 .*wants an API key"):
            start_sweep(_opts(tmp_path, srv.base_url))
        with pytest.raises(ServerError, match="HTTP 401 .*API key was refused"):
            start_sweep(_opts(tmp_path, srv.base_url, api_key=SecretStr("sk-wrong-key-99")))
        ok = start_sweep(
            _opts(tmp_path, srv.base_url, requests=4, api_key=SecretStr("sk-right-key-1234"))
        )
        assert len(ok.finished) == 1
    with serve_in_thread(ServerConfig(model="another-model")) as srv:
        with pytest.raises(
            ServerError, match="pair tiny-cpu's served_model_name.*serves: another-model"
        ):
            start_sweep(_opts(tmp_path, srv.base_url, run_id="m"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # only the run that worked


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda m: {}, "no 'pair' key"),
        (lambda m: m | {"plan": [c | {"colour": "red"} for c in m["plan"]]}, "colour"),
        (lambda m: m | {"pair": m["pair"] | {"flavour": 1}}, "pair.flavour"),
        (lambda m: m | {"plan": "everything"}, "not a sweep manifest"),
    ],
)
def test_resume_refuses_a_manifest_it_cannot_trust(tmp_path, edit, says):
    with serve_in_thread(ServerConfig(model="tiny-target", output_tokens=4)) as srv:
        store = start_sweep(_opts(tmp_path, srv.base_url, requests=2)).store
        store.manifest_path.write_text(json.dumps(edit(_manifest(store))))
        with pytest.raises(StoreError, match=says) as exc:
            resume_sweep(store.root, {})
    assert "\n" not in str(exc.value) and str(store.manifest_path) in str(exc.value)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"port": 99999}, "--port: expected a TCP port 1-65535, got 99999"),
        ({"ready_timeout_s": -5}, "--ready-timeout: expected a finite number > 0, got -5"),
        ({"api_key": SecretStr("abc")}, "key of 3 characters refused"),
        ({"attach_arm": Arm("static", 99)}, "--arm static-k99: K=99 is above max_k 3"),
        ({"endpoint": "ftp://127.0.0.1:1"}, "expected an http:// or https:// URL"),
        ({"run_id": "../../x"}, "--run-id '../../x'"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(tmp_path, change, says):
    opts = _opts(tmp_path / "results", "http://127.0.0.1:9")
    for k, v in change.items():
        setattr(opts, k, v)
    with pytest.raises(AvbenchError) as exc:
        start_sweep(opts)
    assert says in str(exc.value)
    assert not (tmp_path / "results").exists() and not (tmp_path / "x").exists()
