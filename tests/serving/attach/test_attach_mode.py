"""`avbench sweep --endpoint URL` with no suite file, against the project's scripted server.

The scripted server (avbench/testing/fake_server.py) stands in for vLLM where the behaviour
under test is the client's: it tokenizes like vLLM's /tokenize (one token per word), counts a
completion prompt with that tokenizer, and streams exactly max_tokens tokens.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from avbench.store.run_store import RunStore
from avbench.testing.fake_server import ServerConfig, serve_in_thread

PROVENANCE = ("transport", "event_loop", "timestamp_source", "avbench_version", "avbench_commit")


def avbench(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    # cwd outside the repo: no ./suites to fall back on, so nothing comes from a suite file.
    return subprocess.run(
        [sys.executable, "-m", "avbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k not in ("AVBENCH_SUITES", "OPENAI_API_KEY")}
        | (env or {}),
    )


SYNTHETIC = (
    "--workload", "synthetic", "--input-len", "32", "--output-len", "128", "--ignore-eos",
    "--concurrencies", "1,4", "--requests", "32",
)  # fmt: skip


@pytest.mark.slow
def test_synthetic_attach_sweep_without_suite_file(tmp_path):
    with serve_in_thread(ServerConfig(model="served-x", keep_bodies=True)) as srv:
        res = avbench(
            "sweep", "--endpoint", srv.base_url, *SYNTHETIC, "--results", str(tmp_path / "r"),
            "--run-id", "syn", "--no-report", cwd=tmp_path,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        bodies = [e["body"] for e in srv.emissions()]
    assert {b["model"] for b in bodies} == {"served-x"}  # discovered from /v1/models
    assert {b["max_tokens"] for b in bodies} == {128}
    assert all(b["ignore_eos"] is True for b in bodies)

    store = RunStore.open(tmp_path / "r" / "syn")
    rows = store.finished_cells()
    assert sorted(rows) == ["baseline__synthetic__c1__rep0", "baseline__synthetic__c4__rep0"]
    for cell_id, row in rows.items():
        records = [r for r in store.read_records(cell_id) if not r.warmup]
        assert len(records) == 32
        # Measured by the server, not assumed: usage counts match what was asked for.
        assert {r.prompt_tokens for r in records} == {32}
        assert {r.completion_tokens for r in records} == {128}
        assert {sum(r.chunk_tokens) for r in records} == {128}
        assert row["pair"] == "attached" and row["ignore_eos"]
        assert (row["input_len"], row["output_len"], row["len_range"]) == (32, 128, 0.0)
    # Distinct prompts (no cycling): a prefix cache cannot flatter a repeated prompt.
    prompts = {r.prompt_text for r in store.read_records("baseline__synthetic__c4__rep0")}
    assert len(prompts) == 36  # 32 measured + 4 warmup

    manifest = store.read_manifest()
    assert manifest.mode == "attach" and manifest.pair["served_model_name"] is None
    assert manifest.served_model == "served-x"
    src = manifest.workload_sources["synthetic"]
    assert src.source.origin == "synthetic:server:/tokenize of served-x"
    assert src.source.extra["inexact_prompts"] == 0


def test_wrong_model_fails_before_any_request(tmp_path):
    with serve_in_thread(ServerConfig(model="served-x")) as srv:
        res = avbench(
            "sweep", "--endpoint", srv.base_url, "--model", "other-model", *SYNTHETIC,
            "--results", str(tmp_path / "r"), cwd=tmp_path,
        )  # fmt: skip
        stats = srv.stats()
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "'other-model'" in lines[0] and "it serves: served-x" in lines[0]
    assert stats["requests"] == 0
    assert not (tmp_path / "r").exists()


def test_pair_naming_an_unserved_model_fails_before_any_request(tmp_path):
    repo = Path(__file__).resolve().parents[3]
    with serve_in_thread(ServerConfig(model="served-x")) as srv:
        res = avbench(
            "sweep", "--endpoint", srv.base_url, "--pair", "tiny-cpu", "--suites",
            str(repo / "avbench" / "suites"), "--arm", "baseline", *SYNTHETIC, "--results",
            str(tmp_path / "r"), cwd=tmp_path,
        )  # fmt: skip
        stats = srv.stats()
    assert res.returncode != 0 and stats["requests"] == 0
    assert "'tiny-target'" in res.stderr and "it serves: served-x" in res.stderr


def test_provenance_read_back_from_manifest_and_cells(tmp_path):
    with serve_in_thread(ServerConfig(model="served-x")) as srv:
        res = avbench(
            "sweep", "--endpoint", srv.base_url, "--workload", "synthetic", "--input-len", "8",
            "--output-len", "8", "--concurrencies", "2", "--requests", "4", "--warmup", "0",
            "--results", str(tmp_path / "r"), "--run-id", "p", "--no-report", cwd=tmp_path,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    store = RunStore.open(tmp_path / "r" / "p")
    prov = store.read_manifest().provenance.model_dump()
    assert set(PROVENANCE) <= set(prov)
    assert prov["transport"].startswith("avbench FastTransport")  # http:// -> our transport
    assert prov["event_loop"].split()[0] == "uvloop"  # a runtime dependency, always used
    assert prov["timestamp_source"].startswith(("kernel", "user space"))
    from avbench import __version__

    assert prov["avbench_version"] == __version__
    (row,) = store.finished_cells().values()
    assert {k: row[k] for k in PROVENANCE} == {k: prov[k] for k in PROVENANCE}


def test_api_key_from_file_never_on_the_command_line(tmp_path):
    key = "sk-file-key-0123456789"
    (tmp_path / "key").write_text(key + "\n")
    cfg = ServerConfig(model="served-x", api_key=key)
    with serve_in_thread(cfg) as srv:
        res = avbench(
            "sweep", "--endpoint", srv.base_url, "--api-key-file", str(tmp_path / "key"),
            "--workload", "synthetic", "--input-len", "8", "--output-len", "4",
            "--concurrencies", "1", "--requests", "2", "--warmup", "0",
            "--results", str(tmp_path / "r"), "--run-id", "k", "--no-report", cwd=tmp_path,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    run = tmp_path / "r" / "k"
    assert not [p for p in run.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert json.loads((run / "manifest.json").read_text())["run_id"] == "k"


def test_lengths_need_a_synthetic_workload(tmp_path):
    res = avbench(
        "sweep", "--endpoint", "http://127.0.0.1:9", "--workload", "gsm8k", "--input-len", "8",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2
    assert "--input-len" in res.stderr and "--workload synthetic" in res.stderr


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_empty_key_file_is_refused(tmp_path, content):
    (tmp_path / "key").write_text(content)
    res = avbench(
        "sweep", "--endpoint", "http://127.0.0.1:9", "--api-key-file", str(tmp_path / "key"),
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2 and "--api-key-file" in res.stderr and "empty" in res.stderr
