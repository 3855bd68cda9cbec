"""Filing live captures per cell: drafts by response id, refit ranges by time."""

import json
import time

import numpy as np
import pytest
import torch

from avbench.estimator.drafts import read_drafts
from avbench.report.refits import render_estimator
from avbench.run.cell_captures import file_cell
from avbench.serving.capture import ArmCapture, CaptureSettings
from avbench.store.run_store import RunStore
from avbench.testing.captures import write_refit_lines
from avbench.vllm_plugin.runtime import Health
from avbench.vllm_plugin.sink import HostCopy, Proposal, ShardWriter, Verdict


def _capture_some(directory, rid, step, labels_accepted):
    w = ShardWriter(directory, Health(directory), tick_s=0.1, max_age_s=0.1)
    eid = f"{rid}-0-0badc0de"
    data = {
        "tokens": torch.tensor([[1, 2, 3]]), "f": torch.tensor([[1.0, 2.0, 3.0]]),
        "q_max": torch.full((1, 3), 0.6), "q_sampled": torch.ones(1, 3),
        "entropy": torch.ones(1, 3), "temperature": torch.zeros(1),
    }  # fmt: skip
    w.submit(Proposal(step, [eid], [rid], HostCopy(data)))
    w.submit(Verdict(step + 1, time.time(), [eid], [3], np.array([labels_accepted])))
    w.close()


@pytest.mark.slow
def test_file_cell_writes_the_cells_drafts_and_refits(tmp_path):
    store = RunStore.create(tmp_path, "run", {"run_id": "run"})
    cap = tmp_path / "cap"
    cap.mkdir()
    _capture_some(cap, "cmpl-mine", 1, 1)
    _capture_some(cap, "cmpl-other", 5, 3)  # another cell's request
    now = time.time()
    write_refit_lines(cap / f"refits.{7}.jsonl", 7, [now - 5, now - 1])
    ac = ArmCapture(cap, CaptureSettings(("drafts", "refits")), "run", "tiny-cpu", "av-k3", 3,
                    now - 10)  # fmt: skip
    row = file_cell(store.root, "c1", "gsm8k-tiny", ac, now - 2, ["cmpl-mine"])
    drafts = read_drafts(store.root / "drafts" / "c1.drafts.parquet", structure=True)
    assert drafts["label"].tolist() == [1, 0] and set(drafts["request_id"]) == {"cmpl-mine"}
    assert drafts["run_id"].iloc[0].startswith("run/av-k3/pid")
    assert row["capture_draft_rows"] == 2 and row["capture_requests"] == 1
    assert row["estimator"] == "online"
    assert row["refits"] == 1 and row["slope_start"] == 0.5 and row["slope_end"] == 0.6
    assert row["capture_errors"] == 0 and row["capture_flushed"]

    assert row["capture_dir"] == str(cap)  # outside the run (an attached server): as given
    (store.root / "cells.jsonl").write_text(json.dumps({"cell_id": "c1", **row}) + "\n")
    text = render_estimator(store.root)
    assert "refits #1..#1 (1)" in text and "start: slope 0.5000" in text
    assert "end:   slope 0.6000" in text


@pytest.mark.slow
def test_no_coefficients_where_no_estimator_ran(tmp_path):
    """A static arm has no estimator, whatever lines its directory holds; an AV arm has one
    only when the plugin saw it step (a DSpark confidence head decides without one); an AV arm
    whose estimator has not refit yet runs on the cold start, shown as such."""
    store = RunStore.create(tmp_path, "run", {"run_id": "run"})
    now = time.time()
    settings = CaptureSettings(("refits",))
    static_dir, av_dir = tmp_path / "static", tmp_path / "av"
    static_dir.mkdir()
    av_dir.mkdir()
    write_refit_lines(static_dir / "refits.7.jsonl", 7, [now - 5])
    static = ArmCapture(static_dir, settings, "run", "p", "static-k3", 3, now - 10)
    head = ArmCapture(av_dir, settings, "run", "p", "av-k3", 3, now - 10)
    for ac in (static, head):
        row = file_cell(store.root, "c", "w", ac, now - 2, [])
        assert row["estimator"] == "none" and "slope_start" not in row and "refits" not in row
    (store.root / "cells.jsonl").write_text(json.dumps({"cell_id": "c", **row}) + "\n")
    write_refit_lines(av_dir / "refits.8.jsonl", 8, [now - 60])  # an earlier server's estimator
    assert "no estimator ran in this arm's server" in render_estimator(store.root)
    (av_dir / "estimator.9.json").write_text(json.dumps({"time": now - 9, "pid": 9}))
    row = file_cell(store.root, "c", "w", head, now - 2, [])
    assert row["estimator"] == "online" and row["refits"] == 0
    assert row["slope_end"] == 0.5 and row["intercepts_end"] == [-0.2] * 3  # in force: cold
