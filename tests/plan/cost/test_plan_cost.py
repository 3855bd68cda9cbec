"""avbench.plan.cost: server starts, request counts, the output-token bound and the estimate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from avbench.inputs.suite import Pair, Sweep
from avbench.plan.cells import build_plan
from avbench.plan.cost import PreviousRun, estimate_wall_time, format_duration, plan_work
from avbench.store.artefacts import SweepManifest

REPO = Path(__file__).resolve().parents[3]
PAIR = Pair(name="p", target="t", drafter="d", method="draft_model", max_k=3, k_values=[1, 3])
SWEEP = Sweep(
    name="s",
    workloads=["one-turn", "two-turn"],
    concurrencies=[1, 4],
    arms=["static", "av"],
    requests_per_concurrency=2,
    min_requests=6,
    warmup=1,
    repeats=2,
    sampling={"max_tokens": 64},
)


def work(unsupported=None, turns=None):
    cells = build_plan(PAIR, SWEEP)
    arms = dict.fromkeys(c.arm for c in cells)
    return cells, plan_work(
        cells,
        max_tokens=SWEEP.sampling.max_tokens,
        turns=turns if turns is not None else {"one-turn": 1, "two-turn": 2},
        commands=dict.fromkeys(arms, ["python", "-m", "x"]),
        unsupported=unsupported or {},
    )


def test_one_server_start_per_repeat_and_supported_arm():
    _, w = work()
    assert [a.arm for a in w.arms] == ["static-k1", "static-k3", "av-k3"]
    assert w.server_starts == 3 * 2
    _, w = work(unsupported={"av-k3": "no AV on CPU"})
    assert w.server_starts == 2 * 2
    assert w.arms[2].server_starts == 0 and w.arms[2].requests == 0
    assert w.arms[2].unsupported == "no AV on CPU"


def test_requests_and_output_token_bound():
    _, w = work(unsupported={"av-k3": "x"})
    # Per arm and repeat: c=1 -> 6 + 1 warmup, c=4 -> 8 + 1, for each of two workloads.
    per_workload = (6 + 1) + (8 + 1)
    assert w.requests == 2 * 2 * 2 * per_workload
    # The two-turn workload sends two requests per conversation.
    assert w.max_output_tokens == 2 * 2 * per_workload * (1 + 2) * 64


def test_unknown_turns_count_one_and_are_named():
    _, w = work(turns={"one-turn": 1, "two-turn": None})
    assert w.unknown_turns == ["two-turn"]
    assert w.max_output_tokens == 3 * 2 * 2 * 16 * 64


def test_wall_time_from_a_previous_run():
    cells, w = work(unsupported={"av-k3": "x"})
    # Previous run: the same plan measured at 0.5 s per request, 100 s per server start.
    prev = pd.DataFrame(
        [c.to_dict() | {"window_s": 0.5 * c.num_requests} for c in cells if c.arm != "av-k3"]
    )
    in_cells = float(((prev["num_requests"] + prev["warmup"]) * 0.5).sum())
    manifest = {
        "started_at": "2026-12-01T00:00:00+00:00",
        "ended_at": pd.Timestamp("2026-12-01T00:00:00+00:00")
        + pd.Timedelta(seconds=in_cells + 4 * 100),
    }
    manifest["ended_at"] = manifest["ended_at"].isoformat()
    wall_s = SweepManifest.model_validate(manifest).wall_s
    assert wall_s == pytest.approx(in_cells + 4 * 100)
    est = estimate_wall_time(cells, w, PreviousRun(Path("prev"), prev, wall_s))
    assert est.server_start_s == pytest.approx(100)
    assert est.seconds == pytest.approx(in_cells + 4 * 100)
    assert (est.cells_priced, est.cells_fallback) == (len(prev), 0)


def test_unmatched_cells_fall_back_to_the_same_load():
    cells, w = work(unsupported={"av-k3": "x"})
    prev = pd.DataFrame(
        [
            {
                "arm": "static-k3",
                "workload": "one-turn",
                "concurrency": c,
                "rate": None,
                "repeat": 0,
                "num_requests": 10,
                "warmup": 0,
                "window_s": 10.0 * c,
            }
            for c in (1, 4)
        ]
    )
    assert SweepManifest().wall_s is None  # no start and end recorded
    est = estimate_wall_time(cells, w, PreviousRun(Path("prev"), prev, None))
    expected = sum((c.num_requests + c.warmup) * c.concurrency for c in cells if c.arm != "av-k3")
    assert est.seconds == pytest.approx(expected)
    # 16 cells run (av unsupported); 4 of them are static-k3 on one-turn (2 loads x 2 repeats).
    assert (est.cells_priced, est.cells_fallback) == (4, 12)


def test_format_duration():
    assert format_duration(59.6) == "1m00s"
    assert format_duration(3 * 3600 + 125) == "3h02m"


def test_cli_plan_shows_commands_work_and_wall_time(tmp_path):
    """`avbench plan --from RUN` on the shipped nightly-cpu sweep, priced by a stored run."""
    from avbench.inputs.suite import load_suite
    from avbench.plan.cells import Cell
    from avbench.store.run_store import RunStore

    suite = load_suite(REPO / "avbench" / "suites")
    cells = build_plan(suite.pair("tiny-cpu"), suite.sweep("nightly-cpu"))
    prev = RunStore.create(
        tmp_path,
        "prev",
        {
            "run_id": "prev",
            "started_at": "2026-12-01T00:00:00+00:00",
            "ended_at": "2026-12-01T00:10:00+00:00",
        },
    )
    measured: list[Cell] = [c for c in cells if not c.arm.startswith("av")]
    for c in measured:  # 2 s per request everywhere
        prev.write_cell(c.to_dict() | {"window_s": 2.0 * c.num_requests}, [], {})
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "plan", "--pair", "tiny-cpu", "--sweep", "nightly-cpu",
         "--from", str(prev.root)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=os.environ | {"COLUMNS": "200"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for arm in ("static-k3", "av-k3"):  # static_k = "max": AV and its OFF twin only
        assert f"  {arm}: " in out and "-m vllm.entrypoints.launchers.api_server.entry" in out
    assert "static-k1" not in out
    # Per arm: 2 repeats x (c=1: 4 + 1 warmup, c=4: 4 + 1); AV is not started where this vLLM
    # cannot run it (the CPU build).
    av_line = next(line for line in out.splitlines() if line.startswith("  av-k3: "))
    arms = 1 if "[unsupported here, not started" in av_line else 2
    assert (
        f"work: {20 * arms} requests (warmup included), at most {20 * arms * 32:,} output "
        f"tokens, {2 * arms} server starts"
    ) in out
    # Each request at 2 s; each start at the stored run's (600 s - 40 s in cells) / 2 starts.
    if arms == 1:
        assert "estimated wall time: 10m00s from run prev (4 cells priced from the same cell" in out


def test_cli_plan_adaptive_replays_the_rounds_on_a_stored_run(tmp_path):
    """`avbench plan --adaptive --from RUN`: round 0, the ceiling, and the rounds the stored
    throughputs would take (known by hand below), priced like the fixed protocol."""
    from avbench.inputs.suite import load_suite
    from avbench.plan.cells import Arm
    from avbench.store.run_store import RunStore

    suite = load_suite(REPO / "avbench" / "suites")
    sweep = suite.sweep("predict-cpu-t1").model_copy(
        update={"workloads": ["gsm8k-tiny"], "concurrencies": [1, 2], "k_values": [1, 3]}
    )
    cells = build_plan(suite.pair("tiny-cpu"), sweep)
    prev = RunStore.create(
        tmp_path, "prev",
        {"run_id": "prev", "started_at": "2026-12-01T00:00:00+00:00",
         "ended_at": "2026-12-01T01:00:00+00:00"},
    )  # fmt: skip
    # c=1: K=1 within 10% of the baseline (measured, then both repeated, then inside noise);
    # c=2: the baseline leads by 67%, decided after round 0.
    tput = {("baseline", 1): 100, ("static-k3", 1): 60, ("static-k1", 1): 96,
            ("baseline", 2): 200, ("static-k3", 2): 100, ("static-k1", 2): 120}  # fmt: skip
    for c in cells:
        if (c.arm, c.concurrency) in tput:
            y = tput[c.arm, c.concurrency] * (1 + 0.01 * c.repeat)
            arm = Arm.parse(c.arm)
            row = {"window_s": 2.0 * c.num_requests, "output_tok_s_per_gpu": y,
                   "arm_kind": arm.kind, "k": arm.k}  # fmt: skip
            prev.write_cell(c.to_dict() | row, [], {})
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "plan", "--pair", "tiny-cpu", "--sweep",
         "predict-cpu-t1", "--workloads", "gsm8k-tiny", "--concurrencies", "1,2", "--k", "1,3",
         "--adaptive", "--from", str(prev.root)],
        capture_output=True, text=True, cwd=REPO, env=os.environ | {"COLUMNS": "250"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = res.stdout
    # Round 0: baseline and K=3 at c=1, 2; the ceiling: baseline, K=1, K=3 x 2 loads x 2 repeats.
    assert "--adaptive: the first round measures 4 cells (baseline, static-k3" in out
    assert "between 4 and 12 cells in all" in out
    # Round 1: K=1 at c=1; round 2: the second repeat of the baseline and K=1 at c=1.
    assert (
        "--adaptive replayed on run prev (its measured throughput taken as each prediction): "
        "7 cells in 3 round(s)"
    ) in out
    assert f"against the fixed protocol's {len(cells)} cells" in out

    missing = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "plan", "--pair", "tiny-cpu", "--sweep", "demo",
         "--k", "2", "--adaptive", "--from", str(prev.root)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    # Round 0 would measure K=2, which the stored run never did: nothing to replay from.
    assert missing.returncode != 0 and missing.stderr.count("\n") == 1, missing.stderr
    assert "--from" in missing.stderr and "no measured static-k2" in missing.stderr
