"""Labeling and shard writing of the capture thread, fed directly (no server)."""

import json
import time
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from avbench.capture_protocol import capture_schema
from avbench.serving.capture import read_captured
from avbench.vllm_plugin.runtime import Health
from avbench.vllm_plugin.sink import HostCopy, Labeler, Proposal, ShardWriter, Verdict


def proposal(step, eids, tokens, f=None):
    tokens = torch.tensor(tokens)
    n, k = tokens.shape
    f = torch.arange(n * k, dtype=torch.float32).view(n, k) if f is None else f
    data = {
        "tokens": tokens, "f": f, "q_max": torch.full((n, k), 0.5),
        "q_sampled": torch.ones(n, k), "entropy": torch.ones(n, k), "temperature": torch.zeros(n),
    }  # fmt: skip
    return Proposal(step, eids, [e.rsplit("-", 1)[0] for e in eids], HostCopy(data))


def test_labels_accepted_rejected_after_and_trimmed():
    lab = Labeler(pid=1, dp_rank=0)
    lab.proposal(proposal(4, ["cmpl-a-0-00000000", "cmpl-b-0-00000000"], [[5, 6, 7, 8]] * 2))
    out = defaultdict(list)
    # a: 1 of 4 accepted, all verified; b (AV): 1 accepted, 3 admitted, 4 scheduled
    v = Verdict(5, 0.0, ["cmpl-a-0-00000000", "cmpl-b-0-00000000"], [4, 4],
                np.array([1, 1]), np.array([4, 3]))  # fmt: skip
    assert lab.verdict(v, out) == 8
    assert out["label"] == [1, 0, -1, -1, 1, 0, -1, -2]
    assert out["position"] == [1, 2, 3, 4] * 2
    assert out["request_id"][:1] == ["cmpl-a-0"] and set(out["step"]) == {5}
    assert out["logit_q_max"][:4] == [0.0, 1.0, 2.0, 3.0]


def test_verdict_takes_the_latest_earlier_proposal_and_checks_tokens():
    lab = Labeler(pid=1, dp_rank=0)
    lab.proposal(proposal(1, ["r-0"], [[1, 2, 3]]))
    lab.proposal(proposal(2, ["r-0"], [[4, 5, 6]]))  # proposed in the step being verified
    out = defaultdict(list)
    v = Verdict(2, 0.0, ["r-0"], [3], np.array([3]), scheduled_tokens=[[1, 2, 3]])
    assert lab.verdict(v, out) == 3 and out["label"] == [1, 1, 1]
    v = Verdict(3, 0.0, ["r-0"], [2], np.array([0]), scheduled_tokens=[[9, 9]])
    assert lab.verdict(v, out) == 0 and lab.stats["token_mismatch"] == 1
    v = Verdict(4, 0.0, ["r-0"], [2], np.array([0]))
    assert lab.verdict(v, out) == 0 and lab.stats["verdict_without_proposal"] == 1


def test_writer_writes_shards_and_status(tmp_path):
    w = ShardWriter(tmp_path, Health(tmp_path), tick_s=0.2, max_age_s=0.2)
    w.submit(proposal(1, ["cmpl-x-0-00000000"], [[3, 4]]))
    w.submit(Verdict(2, time.time(), ["cmpl-x-0-00000000"], [2], np.array([2])))
    t_sent = time.time()
    time.sleep(0.6)
    status = json.loads(next(tmp_path.glob("status-*.json")).read_text())
    assert status["rows_written"] == 2 and status["flushed_at"] >= t_sent and not status["errors"]
    shard = next(tmp_path.glob("*.capture.parquet"))
    assert pq.read_schema(shard).names == capture_schema().names
    w.submit(["cmpl-x-0-00000000"])  # finished
    w.close()
    assert w.labeler.pending == {}


def test_a_failed_write_is_counted_and_retried_without_loss(tmp_path):
    w = ShardWriter(tmp_path, Health(tmp_path), tick_s=0.2, max_age_s=0.2)
    # A directory where the first shard's temporary file goes: the write fails for real.
    blocker = tmp_path / f".drafts-{w.labeler.pid}-{w._token}-000001.capture.parquet.tmp"
    blocker.mkdir()
    w.submit(proposal(1, ["cmpl-y-0-00000000"], [[3, 4]]))
    w.submit(Verdict(2, time.time(), ["cmpl-y-0-00000000"], [2], np.array([1])))
    time.sleep(0.6)
    assert w.health.errors["writer"] >= 1
    blocker.rmdir()
    w.close()
    df = read_captured(tmp_path)
    assert df["label"].tolist() == [1, 0]


def test_torn_temporary_files_are_never_read(tmp_path):
    (tmp_path / ".drafts-9-000001.capture.parquet.tmp").write_bytes(b"PAR1 torn")
    assert read_captured(tmp_path).empty


@pytest.mark.parametrize("bad", ["drafts-9-000001.capture.parquet"])
def test_a_corrupt_final_shard_is_one_line_error(tmp_path, bad):
    from avbench.errors import AvbenchError

    (tmp_path / bad).write_bytes(b"not parquet")
    with pytest.raises(AvbenchError, match="unreadable capture shard"):
        read_captured(tmp_path)


def test_the_sweeps_flush_request_writes_what_waits(tmp_path):
    from avbench.serving.capture import wait_flushed

    w = ShardWriter(tmp_path, Health(tmp_path), tick_s=0.1, max_age_s=3600)
    w.submit(proposal(1, ["cmpl-z-0-00000000"], [[3, 4]]))
    w.submit(Verdict(2, time.time(), ["cmpl-z-0-00000000"], [2], np.array([0])))
    time.sleep(0.5)
    assert not list(tmp_path.glob("*.capture.parquet"))  # batched, not one file per tick
    assert wait_flushed(tmp_path, time.time(), 0.0, timeout_s=5)
    assert read_captured(tmp_path)["label"].tolist() == [0, -1]
    w.close()
