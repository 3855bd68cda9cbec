"""`avbench sweep --endpoint URL` with no suite file against a REAL vLLM CPU server (tiny pair):
the session's shared static-k3 server (``tiny_k3_server``, docs/testing.md)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_servers import TinyK3

from avbench.serving.server import probe_vllm
from avbench.store.run_store import RunStore

pytestmark = pytest.mark.vllm

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)


def avbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # cwd outside the repo: no ./suites, so nothing comes from a suite file. The key is the
    # shared server's.
    env = {k: v for k, v in os.environ.items() if k != "AVBENCH_SUITES"}
    env["OPENAI_API_KEY"] = TinyK3.API_KEY
    return subprocess.run(
        [sys.executable, "-m", "avbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        env=env,
    )


def test_synthetic_lengths_are_what_the_server_counted(tiny_k3_server, tmp_path):
    vllm = tiny_k3_server.server
    res = avbench(
        "sweep", "--endpoint", vllm.base_url, "--workload", "synthetic", "--input-len", "32",
        "--output-len", "64", "--ignore-eos", "--concurrencies", "1,4", "--requests", "8",
        "--arm", "static-k3", "--temperature", "0", "--results", str(tmp_path), "--run-id", "s",
        "--no-report", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    store = RunStore.open(tmp_path / "s")
    rows = store.finished_cells()
    assert sorted(rows) == ["static-k3__synthetic__c1__rep0", "static-k3__synthetic__c4__rep0"]
    for cell_id, row in rows.items():
        records = [r for r in store.read_records(cell_id) if not r.warmup]
        assert len(records) == 8 and all(r.ok for r in records)
        # vLLM's own usage: exactly the prompt length built with its /tokenize, and
        # exactly max_tokens generated past EOS.
        assert {r.prompt_tokens for r in records} == {32}
        assert {r.completion_tokens for r in records} == {64}
        assert {len(r.output_token_ids) for r in records} == {64}
        assert row["acceptance_length"] is not None and row["acceptance_length"] > 1
    src = store.read_manifest().workload_sources["synthetic"].source.model_dump()
    assert src["origin"] == "synthetic:server:/tokenize of tiny-target"


def test_wrong_model_fails_before_any_request(tiny_k3_server, tmp_path):
    vllm = tiny_k3_server.server
    before = vllm.log_path.read_text().count("POST /v1/")
    res = avbench(
        "sweep", "--endpoint", vllm.base_url, "--model", "not-served", "--workload", "synthetic",
        "--input-len", "8", "--output-len", "8", "--results", str(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode != 0
    (line,) = res.stderr.strip().splitlines()
    assert "'not-served'" in line and "it serves: tiny-target" in line
    assert vllm.log_path.read_text().count("POST /v1/") == before
    assert not list(tmp_path.iterdir())
