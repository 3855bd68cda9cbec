"""avbench.analysis.compare: matching, noise, verdicts and exit codes on hand-made cell rows."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from avbench.analysis.compare import (
    RunCells,
    cell_settings,
    compare_cells,
    sampling_noise,
    server_signature,
    to_markdown,
)
from avbench.store.artefacts import SweepManifest

COMMAND = [
    "/some/venv/bin/python3",
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "/ckout-a/avbench/assets/tiny/target",
    "--host",
    "127.0.0.1",
    "--port",
    "41234",
    "--max-model-len",
    "1024",
]
MANIFEST = {
    "arms": [{"name": "static-k3", "kind": "static", "command": COMMAND, "env": {"A": "1"}}]
}


def rows(tput: list[float], *, conc: int = 4, arm: str = "static-k3", **extra) -> list[dict]:
    """One row per repeat; TPOT/TTFT follow throughput so only throughput moves the verdict."""
    return [
        {
            "cell_id": f"{arm}__w__c{conc}__rep{i}",
            "pair": "tiny",
            "workload": "w",
            "arm": arm,
            "concurrency": conc,
            "rate": None,
            "repeat": i,
            "output_tok_s": t,
            "tpot_ms_median": 10.0,
            "ttft_ms_median": 50.0,
            "acceptance_length": 2.0,
            "temperature": 0.0,
            "top_p": 1.0,
            "max_tokens": 64,
            "num_requests": 8,
            "warmup": 1,
            "prompts_sha256": "abc",
        }
        | extra
        for i, t in enumerate(tput)
    ]


def compare(
    base: list[dict],
    new: list[dict],
    manifest_new: dict = MANIFEST,
    requests: tuple[list[dict], list[dict]] | None = None,
    **kw,
):
    return compare_cells(
        RunCells(
            pd.DataFrame(base),
            [cell_settings(r, SweepManifest.model_validate(MANIFEST)) for r in base],
            requests[0] if requests else None,
        ),
        RunCells(
            pd.DataFrame(new),
            [cell_settings(r, SweepManifest.model_validate(manifest_new)) for r in new],
            requests[1] if requests else None,
        ),
        **kw,
    )


def tpot_requests(n: int, median: float, seed: int) -> dict[str, np.ndarray]:
    """n requests' TPOT (ms) from a wide log-normal around ``median``."""
    rng = np.random.default_rng(seed)
    return {"tpot_ms_median": median * np.exp(rng.normal(0.0, 0.5, n))}


@pytest.mark.parametrize(("n", "verdict"), [(16, "same within noise"), (4000, "worse")])
def test_a_latency_median_is_judged_against_its_sampling_noise(n, verdict):
    """One repeat each, TPOT medians 15% apart, the floor 5%: with 16 requests a median moves
    that much by chance; with 4000 it does not."""
    base_req, new_req = tpot_requests(n, 10.0, seed=1), tpot_requests(n, 11.5, seed=2)
    base = rows([100], tpot_ms_median=float(np.median(base_req["tpot_ms_median"])))
    new = rows([100], tpot_ms_median=float(np.median(new_req["tpot_ms_median"])))
    (cell,) = compare(base, new, requests=([base_req], [new_req])).cells
    tpot = next(d for d in cell.deltas if d.metric.label == "TPOT")
    assert tpot.verdict == verdict
    assert tpot.noise == max(0.05, tpot.sampling)
    # Throughput has no per-request samples: its noise stays the floor.
    assert cell.deltas[0].noise == 0.05 and np.isnan(cell.deltas[0].sampling)


def test_sampling_noise_shrinks_with_requests_and_needs_two():
    small = sampling_noise(
        tpot_requests(16, 10, 1)["tpot_ms_median"], tpot_requests(16, 10, 2)["tpot_ms_median"]
    )
    large = sampling_noise(
        tpot_requests(1600, 10, 1)["tpot_ms_median"], tpot_requests(1600, 10, 2)["tpot_ms_median"]
    )
    assert large < small / 5  # ~1/sqrt(n)
    assert np.isnan(sampling_noise(np.array([1.0]), np.array([1.0, 2.0])))


def test_identical_settings_within_noise_are_same():
    res = compare(rows([100, 104]), rows([102, 98]))
    assert [c.verdict for c in res.cells] == ["same within noise"]
    assert res.exit_code == 0


def test_slower_beyond_noise_is_worse_and_exit_1():
    res = compare(rows([100, 104]), rows([60, 62]))
    (cell,) = res.cells
    assert cell.verdict == "worse"
    tput = cell.deltas[0]
    assert tput.metric.column == "output_tok_s"
    assert tput.rel == pytest.approx((61 - 102) / 102)
    assert res.exit_code == 1


def test_lower_latency_is_better_and_higher_throughput_is_better():
    res = compare(rows([100, 100]), rows([130, 130], tpot_ms_median=7.0))
    (cell,) = res.cells
    assert {d.metric.label: d.verdict for d in cell.deltas} == {
        "throughput": "better",
        "TPOT": "better",
        "TTFT": "same within noise",
        "acceptance length": "same within noise",
    }
    assert cell.verdict == "better"
    assert res.exit_code == 0


def test_repeat_spread_widens_the_noise_beyond_the_floor():
    # Baseline repeats differ by 40%: a 20% drop is inside that run's own noise.
    res = compare(rows([80, 120]), rows([80, 80]))
    (cell,) = res.cells
    tput = cell.deltas[0]
    assert tput.base_spread == pytest.approx(0.4)
    assert tput.noise == pytest.approx(0.4)
    assert cell.verdict == "same within noise"


def test_single_repeat_uses_the_tolerance_floor():
    assert compare(rows([100]), rows([93])).cells[0].verdict == "worse"
    assert compare(rows([100]), rows([93]), tolerance=0.1).cells[0].verdict == "same within noise"


def test_different_settings_are_listed_never_compared():
    res = compare(rows([100, 100]), rows([50, 50], max_tokens=128))
    assert res.cells == []
    (m,) = res.mismatched
    assert m.differences == {"max_tokens": (64, 128)}
    assert res.exit_code == 3
    md = to_markdown(res, "a", "b")
    assert "settings differ" in md and "`max_tokens`: 64 → 128" in md


def test_server_flags_are_a_setting_unless_ignored():
    slow_cmd = [*COMMAND, "--max-num-seqs", "1"]
    slow = {
        "arms": [{"name": "static-k3", "kind": "static", "command": slow_cmd, "env": {"A": "1"}}]
    }
    res = compare(rows([100, 100]), rows([50, 50]), manifest_new=slow)
    assert [list(m.differences) for m in res.mismatched] == [["server_command"]]
    assert "`server_command`: + --max-num-seqs 1" in to_markdown(res, "a", "b")
    res = compare(
        rows([100, 100]), rows([50, 50]), manifest_new=slow, ignore=frozenset({"server_command"})
    )
    assert res.cells[0].verdict == "worse"
    assert res.cells[0].ignored == ["server_command"]


def test_port_host_interpreter_and_checkout_do_not_count():
    other = [
        "/other/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/ckout-b/avbench/assets/tiny/target",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--max-model-len",
        "1024",
    ]
    assert server_signature(other) == server_signature(COMMAND)
    assert server_signature(COMMAND) == [
        "--model",
        "@assets/tiny/target",
        "--max-model-len",
        "1024",
    ]


def test_a_snapshot_folder_counts_by_repository_and_revision_not_cache_location():
    """A sub-folder drafter is launched from the local Hugging Face snapshot: another cache
    directory is the same setting, another revision of the repository is not."""

    def spec(hub: str, rev: str) -> list[str]:
        model = f"{hub}/models--XiaomiMiMo--MiMo-V2.5-Pro-FP4-DFlash/snapshots/{rev}/dflash"
        return ["py", "-m", "mod", "--speculative-config", json.dumps({"model": model})]

    a, b = "ab12" * 10, "cd34" * 10
    assert server_signature(spec("/opt/hf-cache/hub", a)) == server_signature(
        spec("/home/user/.cache/huggingface/hub", a)
    )
    assert server_signature(spec("/opt/hf-cache/hub", a)) != server_signature(
        spec("/opt/hf-cache/hub", b)
    )
    cfg = json.loads(server_signature(spec("/x/hub", a))[1])
    assert cfg["model"] == f"hf:XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash@{a}/dflash"


def test_a_derived_model_counts_by_recipe_key_not_cache_location():
    """A derived target (avbench/assets/derived.py) is served from avbench's cache: another
    cache directory is the same setting, another recipe key (recipe or source) is not."""

    def cmd(cache: str, key: str) -> list[str]:
        return ["py", "-m", "mod", "--model", f"{cache}/derived/tiny-wide-{key}/target"]

    a, b = "9362b6fc61fd", "0123456789ab"
    assert server_signature(cmd("/home/u/.cache/avbench", a)) == server_signature(
        cmd("/scratch/avbench-cache", a)
    )
    assert server_signature(cmd("/x", a)) != server_signature(cmd("/x", b))
    assert server_signature(cmd("/x", a)) == ["--model", f"@derived/tiny-wide-{a}/target"]


def test_cells_in_one_run_only_are_listed():
    res = compare(rows([100, 100]) + rows([10, 10], conc=1), rows([100, 100], conc=4))
    assert [c["concurrency"] for c in res.only_base] == [1]
    assert res.only_new == []
    assert len(res.cells) == 1
    assert "1 cells only in the baseline" in to_markdown(res, "a", "b")


def test_missing_metric_is_not_applicable_not_a_verdict():
    base = rows([100, 100], acceptance_length=None)
    res = compare(base, rows([100, 100], acceptance_length=None))
    assert res.cells[0].deltas[3].verdict == "n/a"
    assert res.cells[0].verdict == "same within noise"


def test_a_cell_without_throughput_is_not_comparable():
    # Latencies agree, throughput is missing (NaN) on one side: nothing says "same".
    res = compare(rows([100, 100]), rows([float("nan"), float("nan")]))
    (cell,) = res.cells
    assert [d.verdict for d in cell.deltas[:3]] == ["n/a", "same within noise", "same within noise"]
    assert cell.verdict == "not comparable" and res.exit_code == 3
    md = to_markdown(res, "a", "b")
    assert "| tiny / w / static-k3 / c=4 | not comparable | – |" in md
    assert "0 same within noise, 1 not comparable (no throughput measured)" in md
    # Beside a comparable cell, it does not count as compared either way.
    res = compare(rows([100, 100]) + rows([50, 50], conc=1),
                  rows([float("nan")] * 2) + rows([50, 50], conc=1))  # fmt: skip
    assert [c.verdict for c in res.cells] == ["not comparable", "same within noise"]
    assert res.exit_code == 0


def test_markdown_names_each_cell_and_the_regression():
    res = compare(rows([100, 100]), rows([50, 50]))
    md = to_markdown(res, "night-1", "night-2")
    assert md.startswith("## avbench compare: REGRESSION")
    assert "| tiny / w / static-k3 / c=4 | worse | -50.0% (±5%) ▼" in md


def write_run(root, run_id: str, tput: list[float]):
    from avbench.store.run_store import RunStore

    store = RunStore.create(root, run_id, {"run_id": run_id} | MANIFEST)
    for row in rows(tput):
        store.write_cell(row, [], {})
    return store.root


def cli(*args):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "avbench.cli", "compare", *map(str, args)],
        capture_output=True,
        text=True,
    )


@pytest.mark.slow
def test_cli_exit_codes_and_markdown(tmp_path):
    base = write_run(tmp_path, "base", [100, 102])
    same = write_run(tmp_path, "same", [101, 99])
    slow = write_run(tmp_path, "slow", [50, 52])
    md = tmp_path / "summary" / "compare.md"
    res = cli(base, same, "--markdown", md)
    assert res.returncode == 0 and "| same within noise |" in res.stdout
    assert md.read_text().startswith("## avbench compare: OK")
    res = cli(base, slow)
    assert res.returncode == 1 and "| worse |" in res.stdout
    empty = write_run(tmp_path, "empty", [])
    assert cli(base, empty).returncode == 3
    res = cli(base, tmp_path / "nope")
    assert res.returncode == 2
    assert (
        res.stderr.strip() == f"error: {tmp_path / 'nope'}: not a run directory (no manifest.json)"
    )
    assert cli(base, same, "--tolerance", "2").returncode == 2
