"""avbench merge: runs written through the real RunStore, merged, then read by the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from avbench.errors import AvbenchError
from avbench.loadgen.records import RequestRecord
from avbench.store.artefacts import source_manifest
from avbench.store.failures import CellFailure
from avbench.store.merge import merge_runs
from avbench.store.run_store import RunStore


def make_run(
    results: Path, run_id: str, pair: str, tput: float = 100.0, arms=("static-k1", "static-k3")
) -> RunStore:
    store = RunStore.create(
        results,
        run_id,
        {
            "run_id": run_id,
            "status": "finished",
            "pair": {"name": pair, "target": "t", "method": "draft_model", "max_k": 3},
            "sweep": {"name": "nightly", "workloads": ["w"]},
            "arms": [
                {"name": a, "kind": "static", "k": int(a[-1]), "supported": True} for a in arms
            ],
            "started_at": "2026-12-01T00:00:00+00:00",
            "ended_at": "2026-12-01T00:10:00+00:00",
        },
    )
    for arm in arms:
        k = int(arm[-1])
        for c in (1, 4):
            row = {
                "cell_id": f"{arm}__w__c{c}__rep0",
                "run_id": run_id,
                "arm": arm,
                "arm_kind": "static",
                "k": k,
                "pair": pair,
                "workload": "w",
                "concurrency": c,
                "rate": None,
                "repeat": 0,
                "output_tok_s": tput * c,
                "output_tok_s_per_gpu": tput * c,
                "interactivity_tok_s_user": tput,
                "tpot_ms_median": 1000 / tput,
                "ttft_ms_median": 20.0,
                "acceptance_length": 1 + 0.5 * k,
            }
            records = [
                RequestRecord(
                    conversation_id=str(i), turn=0, ttft=0.02, e2e=0.5, completion_tokens=9
                )
                for i in range(3)
            ]
            store.write_cell(row, records, {"before": "# before\n", "after": "# after\n"})
    store.arm_dir(arms[-1]).mkdir(parents=True, exist_ok=True)
    (store.arm_dir(arms[-1]) / "server.log").write_text(f"log of {run_id}\n")
    store.write_failure(
        CellFailure(cell_id=f"{arms[-1]}__w__c64__rep0", reason="server died", kind="server_died")
    )
    return store


def test_merge_keeps_every_cell_record_and_source(tmp_path):
    a = make_run(tmp_path / "a", "night-a", "pair-a")
    b = make_run(tmp_path / "b", "night-b", "pair-b", tput=50.0)
    res = merge_runs([a.root, b.root], tmp_path / "merged")
    merged = RunStore.open(res.store.root)
    cells = merged.cells_frame()
    assert res.cells == len(cells) == 8
    # The two runs share cell ids: merged ids carry the pair, the origin is kept.
    assert set(cells["cell_id"]) == {
        f"{p}__static-k{k}__w__c{c}__rep0"
        for p in ("pair-a", "pair-b")
        for k in (1, 3)
        for c in (1, 4)
    }
    assert set(cells["source_run"]) == {"night-a", "night-b"}
    row = cells[cells["cell_id"] == "pair-b__static-k3__w__c4__rep0"].iloc[0]
    assert row["source_cell_id"] == "static-k3__w__c4__rep0"
    assert row["output_tok_s"] == 200.0
    records = merged.records_frame("pair-b__static-k3__w__c4__rep0")
    assert len(records) == 3 and set(records["cell_id"]) == {"pair-b__static-k3__w__c4__rep0"}
    assert merged.scrape_path("pair-a__static-k1__w__c1__rep0", "after").read_text() == "# after\n"
    assert {f.cell_id for f in merged.failures()} == {
        "pair-a__static-k3__w__c64__rep0",
        "pair-b__static-k3__w__c64__rep0",
    }
    assert (
        merged.root / "sources/night-b/arms/static-k3/server.log"
    ).read_text() == "log of night-b\n"
    m = merged.read_manifest()
    assert m.merged_from == ["night-a", "night-b"] and m.pairs == ["pair-a", "pair-b"]
    assert source_manifest(m, "night-b").pair["name"] == "pair-b"


def test_report_reads_a_run_spread_over_two_machines(tmp_path):
    """One pair, its arms split over two runners, merged back into one report."""
    from avbench.report import write_report

    a = make_run(tmp_path / "a", "night-a", "pair-a", arms=("static-k1",))
    b = make_run(tmp_path / "b", "night-b", "pair-a", arms=("static-k3",))
    merged = merge_runs([a.root, b.root], tmp_path / "merged").store
    files = write_report([merged.root], static_figures=False)
    md = files.markdown.read_text()
    assert "static-k1" in md and "static-k3" in md


def test_report_and_recommendation_of_two_pairs_merged(tmp_path):
    """The nightly matrix: one runner per pair, merged into one report with an answer per pair."""
    from avbench.report import write_report
    from avbench.report.answer import answers
    from avbench.report.runs import load_runs

    a = make_run(tmp_path / "a", "night-a", "pair-a")
    b = make_run(tmp_path / "b", "night-b", "pair-b", tput=50.0)
    merged = merge_runs([a.root, b.root], tmp_path / "merged").store
    got = {ans.pooled.pair: ans for ans in answers(load_runs([merged.root]))}
    assert set(got) == {"pair-a", "pair-b"}
    for ans in got.values():
        assert ans.pooled.schedule is not None
        (config,) = ans.deploy.values()
        assert config["method"] == "draft_model"
    md = write_report([merged.root], static_figures=False).markdown.read_text()
    assert "pair-a" in md and "pair-b" in md


def test_disjoint_cell_ids_keep_their_names(tmp_path):
    a = make_run(tmp_path / "a", "night-a", "pair-a")
    merged = merge_runs([a.root], tmp_path / "merged").store
    assert set(merged.finished_cells()) == set(a.finished_cells())
    pd.testing.assert_frame_equal(
        merged.records_frame("static-k1__w__c1__rep0"), a.records_frame("static-k1__w__c1__rep0")
    )


def test_the_same_cell_of_one_pair_twice_is_refused(tmp_path):
    a = make_run(tmp_path / "a", "night-a", "pair-a")
    b = make_run(tmp_path / "b", "night-b", "pair-a")
    with pytest.raises(AvbenchError, match="static-k1__w__c1__rep0 of pair pair-a is in both"):
        merge_runs([a.root, b.root], tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_cli_merge_errors_are_one_line(tmp_path):
    a = make_run(tmp_path / "a", "night-a", "pair-a")
    out = tmp_path / "merged"
    out.mkdir()
    (out / "x").write_text("taken")
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "merge", str(a.root), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: {out}: output directory exists and is not empty"
    ]


def test_every_merged_row_is_on_disk_before_the_next(tmp_path, monkeypatch):
    """Each row merge appends is fsynced (a power cut loses at most the row being written),
    as the sweep's own appends are. os.fsync is wrapped to note which file it flushed (the
    disk cannot be cut here)."""
    import os

    a = make_run(tmp_path / "a", "run-a", "pair-a")
    b = make_run(tmp_path / "b", "run-b", "pair-b")
    flushed: list[str] = []
    fsync = os.fsync

    def noting(fd: int) -> None:
        flushed.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", noting)
    res = merge_runs([a.root, b.root], tmp_path / "merged")
    assert flushed.count("cells.jsonl") == res.cells == 8
    assert flushed.count("failures.jsonl") == res.failures == 2
