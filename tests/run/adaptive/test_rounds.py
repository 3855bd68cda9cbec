"""The adaptive sweep's rounds without a server: what round 0 runs, which cells a round adds,
and the state file a resume reads back."""

import json

import pytest

from avbench.analysis.adaptive import Uncertainty, Wanted
from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm, arms_for, build_plan
from avbench.run.adaptive import (
    AdaptivePolicy,
    AdaptiveState,
    AdaptiveStopped,
    _targets,
    cells_for,
    complete_adaptive,
    first_round,
)
from avbench.store.artefacts import ADAPTIVE


@pytest.fixture(scope="module")
def suite():
    return load_suite()


def test_round_0_is_the_baseline_and_the_max_k_arm_once_with_captures(suite):
    pair, sweep = suite.pair("tiny-cpu"), suite.sweep("predict-cpu-t1")
    first = first_round(pair, sweep)
    assert [a.name for a in arms_for(pair, first)] == ["baseline", "static-k3"]
    assert first.repeats == 1 and {"steps", "drafts"} <= set(first.capture)
    assert (first.workloads, first.concurrencies) == (sweep.workloads, sweep.concurrencies)
    assert first.sampling == sweep.sampling and first.draft_method == sweep.draft_method
    # The sweep's K schedule goes with its dyn arm: a manifest holding one without the other
    # would not open again (resume validates it).
    assert sweep.schedule is not None and first.schedule is None
    assert type(first).model_validate(first.model_dump()) == first


def test_round_0_drafts_as_the_av_arm_it_predicts_when_the_sweep_leaves_the_method_unset(suite):
    """Issue 30, item 2: a sweep with an AV arm and no draft_sample_method drafts
    probabilistically on every speculative arm; round 0 drops the AV arm but its static arm
    must still draft that way (AV's OFF twin), or it measures greedy drafting and V2's drafts
    capture (probabilistic only) records no confidences to predict AV from."""
    pair = suite.pair("tiny-gpu")
    sweep = suite.sweep("nightly").model_copy(update={"pairs": [], "attention_backend": None})
    assert sweep.draft_sample_method is None and "av" in sweep.arms
    assert sweep.draft_method == "probabilistic"
    first = first_round(pair, sweep)
    assert "av" not in first.arms and first.draft_method == "probabilistic"
    from avbench.serving.server import speculative_config

    static = next(a for a in arms_for(pair, first) if a.kind == "static")
    twin = speculative_config(pair, Arm("av", static.k), sweep)
    assert (
        speculative_config(pair, static, first)["draft_sample_method"]
        == twin["draft_sample_method"]
    )


def test_the_predicted_arms_are_the_smaller_static_k_and_av_only_where_it_runs(suite):
    pair, sweep = suite.pair("tiny-cpu"), suite.sweep("demo")  # baseline, K 1 and 3, AV
    assert _targets(pair, sweep, Arm("static", 3), av_runs=False) == ("static-k1",)
    assert _targets(pair, sweep, Arm("static", 3), av_runs=True) == ("static-k1", "av")


def test_a_round_measures_every_workload_of_a_wanted_arm_and_load(suite):
    pair, sweep = suite.pair("tiny-cpu"), suite.sweep("predict-cpu-t1")
    cells = cells_for([Wanted("static-k1", 2, 0), Wanted("baseline", 4, 1)], pair, sweep)
    assert sorted(c.id for c in cells) == sorted(
        [
            "static-k1__gsm8k-tiny__c2__rep0", "static-k1__humaneval-tiny__c2__rep0",
            "baseline__gsm8k-tiny__c4__rep1", "baseline__humaneval-tiny__c4__rep1",
        ]
    )  # fmt: skip
    full = {c.id: c for c in build_plan(pair, sweep)}
    assert all(c == full[c.id] for c in cells)  # the fixed protocol's own cells, sized alike


def test_a_repeat_past_the_sweeps_repeats_is_sized_like_the_others(suite):
    pair, sweep = suite.pair("tiny-cpu"), suite.sweep("demo")  # one repeat
    (a, b) = cells_for([Wanted("static-k1", 1, 1)], pair, sweep)
    assert {a.repeat, b.repeat} == {1} and a.num_requests == build_plan(pair, sweep)[0].num_requests


def test_the_state_file_round_trips_and_a_bad_one_is_one_line(tmp_path):
    policy = AdaptivePolicy(Uncertainty(0.12, 0.04), max_repeats=2, budget_cells=40)
    state = AdaptiveState(
        policy, {"name": "s"}, [{"round": 0, "cells": ["a", "b"], "seconds": 3.5}]
    )
    state.write(tmp_path)
    back = AdaptiveState.read(tmp_path)
    assert (back.policy, back.sweep, back.cells, back.seconds) == (policy, {"name": "s"}, 2, 3.5)
    assert json.loads((tmp_path / ADAPTIVE).read_text())["server_seconds"] == 3.5
    (tmp_path / ADAPTIVE).write_text('{"policy": {"uncertainty": 1}}')
    with pytest.raises(AdaptiveStopped, match="not an adaptive state file"):
        AdaptiveState.read(tmp_path)
    with pytest.raises(AdaptiveStopped, match="not an adaptive run"):
        AdaptiveState.read(tmp_path / "elsewhere")


def test_a_completion_round_trips_beside_the_rounds(tmp_path):
    completion = {"cells": ["c"], "seconds": 7.0, "standings": []}
    rounds = [{"round": 0, "cells": ["a", "b"], "seconds": 3.5}]
    AdaptiveState(AdaptivePolicy(), {"name": "s"}, rounds, "budget", completion).write(tmp_path)
    back = AdaptiveState.read(tmp_path)
    assert (back.completion, back.cells, back.seconds) == (completion, 2, 3.5)
    AdaptiveState(AdaptivePolicy(), {"name": "s"}, rounds, "decided").write(tmp_path)
    assert "completion" not in json.loads((tmp_path / ADAPTIVE).read_text())


@pytest.mark.parametrize("status", ["running", "failed"])
def test_complete_refuses_rounds_that_have_not_finished(tmp_path, status):
    rounds = [{"round": 0, "cells": ["a"], "seconds": 1.0}]
    AdaptiveState(AdaptivePolicy(), {"name": "s"}, rounds, status).write(tmp_path)
    with pytest.raises(AdaptiveStopped, match=f"have not finished \\(status {status}\\)"):
        complete_adaptive(tmp_path, {})
