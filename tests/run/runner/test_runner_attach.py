"""The sweep pipeline end to end in attach mode, against the project's local streaming server
(the behaviour under test is avbench's: plan → driver → records → metrics → store → report)."""

import json

import pytest
from pydantic import SecretStr

from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm
from avbench.run.runner import SweepOptions, resume_sweep, start_sweep
from avbench.store.run_store import RunStore
from avbench.testing.fake_server import ServerConfig, serve_in_thread


@pytest.fixture(scope="module")
def fake_server():
    cfg = ServerConfig(
        model="tiny-target", tokens_per_chunk=3, output_tokens=12, inter_chunk_delay_s=0.002
    )
    with serve_in_thread(cfg) as srv:
        yield srv


def _opts(tmp_path, url, arm="static-k3", **kw):
    suite = load_suite()
    sweep = suite.sweep("demo").model_copy(
        update={
            "workloads": ["gsm8k-tiny", "mt-bench-tiny"],
            "concurrencies": [1, 3],
            "min_requests": 5,
            "requests_per_concurrency": 1,
            "warmup": 1,
        }
    )
    return SweepOptions(
        pair=suite.pair("tiny-cpu"),
        sweep=sweep,
        workloads=suite.workloads,
        results_dir=tmp_path,
        endpoint=url,
        attach_arm=Arm.parse(arm),
        **kw,
    )


def test_attach_sweep_stores_every_cell(tmp_path, fake_server):
    url = f"http://127.0.0.1:{fake_server.port}"
    key = "sk-attach-secret-91"
    out = start_sweep(_opts(tmp_path, url, run_id="a", api_key=SecretStr(key)))
    store = out.store
    rows = store.finished_cells()
    assert len(rows) == 4 and not out.failed
    for cell_id, row in rows.items():
        recs = store.records_frame(cell_id)
        measured = recs[~recs["warmup"]]
        conversations = measured[measured["turn"] == 0]
        assert len(conversations) == row["num_requests"] == 5
        assert row["requests_ok"] == len(measured)
        # 12 tokens per answer in chunks of 3: the metrics saw exactly what the server sent.
        assert row["output_tokens"] == 12 * len(measured)
        assert row["chunk_tokens_mean"] == pytest.approx(3.0)
        # A client stalled past the server's 6 ms of chunk gaps reads all four chunks at once,
        # so one request's TPOT may be 0 on a loaded box; the cell's TPOT is still measured.
        assert row["output_tok_s"] > 0 and row["tpot_ms_median"] >= 0
        assert (measured["e2e"] - measured["ttft"]).max() > 0
    mt_row = rows["static-k3__mt-bench-tiny__c1__rep0"]
    # Per-turn metrics are kept apart for the two-turn workload, and add up to the cell's.
    assert mt_row["turn1_requests_ok"] == mt_row["turn2_requests_ok"] == 5
    assert mt_row["turn1_output_tokens"] + mt_row["turn2_output_tokens"] == mt_row["output_tokens"]
    assert mt_row["turn2_ttft_ms_median"] > 0
    assert not any(k.startswith("turn") for k in rows["static-k3__gsm8k-tiny__c1__rep0"])
    mt = store.records_frame("static-k3__mt-bench-tiny__c1__rep0")
    assert set(mt["turn"]) == {0, 1}  # MT-Bench sends its real second turn
    for conv_id, turns in mt.groupby("conversation_id"):
        first, second = turns.sort_values("turn").itertuples()
        sent = json.loads(second.prompt_messages)
        assert [m["role"] for m in sent] == ["user", "assistant", "user"], conv_id
        assert sent[1]["content"] == first.output_text != ""
    manifest = json.loads(store.manifest_path.read_text())
    assert manifest["mode"] == "attach" and manifest["status"] == "finished"
    assert manifest["workload_sources"]["gsm8k-tiny"]["source"]["sha256"]
    for p in store.root.rglob("*"):
        if p.is_file():
            assert key not in p.read_text(errors="replace"), p


def test_every_arm_gets_the_same_prompts_in_the_same_order(tmp_path, fake_server):
    url = f"http://127.0.0.1:{fake_server.port}"
    orders = []
    for arm in ("baseline", "static-k3"):
        store = start_sweep(_opts(tmp_path, url, arm=arm, run_id=arm)).store
        seqs = {}
        for cell_id in store.finished_cells():
            # queued_at = when the driver took the conversation off its ordered list.
            df = store.records_frame(cell_id).sort_values("queued_at", kind="stable")
            key = cell_id.split("__", 1)[1]
            seqs[key] = list(zip(df["conversation_id"], df["turn"], df["prompt_text"], strict=True))
            seqs[key + "/sha"] = store.finished_cells()[cell_id]["prompts_sha256"]
        orders.append(seqs)
    assert orders[0].keys() == orders[1].keys() and len(orders[0]) == 8
    for key in orders[0]:
        if key.endswith("/sha"):
            assert orders[0][key] == orders[1][key]
            continue
        first = [x for x in orders[0][key] if x[1] == 0]
        second = [x for x in orders[1][key] if x[1] == 0]
        assert first == second, key


def test_resume_skips_finished_and_reruns_failed(tmp_path, fake_server):
    url = f"http://127.0.0.1:{fake_server.port}"
    store = start_sweep(_opts(tmp_path, url, run_id="r")).store
    rows = store.finished_cells()
    # Pretend the last cell failed: drop its row (as a crash before its append would).
    lines = store.cells_path.read_text().splitlines()
    store.cells_path.write_text("\n".join(lines[:-1]) + "\n")
    kept = {cid: store.requests_path(cid).stat().st_mtime_ns for cid in list(rows)[:-1]}
    out = resume_sweep(store.root, {})
    assert len(out.finished) == 1 and out.skipped == 3
    assert list(RunStore.open(store.root).finished_cells()) == list(rows)
    for cid, mtime in kept.items():
        assert store.requests_path(cid).stat().st_mtime_ns == mtime  # not rerun
