"""Fair arms: within a sweep the speculative arms differ only in the switch under test."""

import json

import pytest
from pydantic import ValidationError

from avbench.inputs.suite import Sweep, load_suite
from avbench.plan.cells import Arm, arms_for
from avbench.serving.server import build_command, speculative_config


def _sweep(**kw) -> Sweep:
    return Sweep(name="s", workloads=["w"], **kw)


def _spec(cmd: list[str]) -> dict:
    return json.loads(cmd[cmd.index("--speculative-config") + 1])


def test_static_and_av_differ_only_in_adaptive_verification():
    pair = load_suite().pair("tiny-cpu")
    sweep = _sweep(attention_backend="FLASH_ATTN")
    static = _spec(build_command(pair, Arm("static", 3), port=1, sweep=sweep))
    av = _spec(build_command(pair, Arm("av", 3), port=1, sweep=sweep))
    assert av.pop("enable_adaptive_verification") is True
    assert static == av
    assert static["draft_sample_method"] == "probabilistic"  # the sweep has an AV arm
    assert static["attention_backend"] == "FLASH_ATTN"  # drafter pinned ...
    for arm in (Arm("baseline"), Arm("static", 1)):  # ... and the target, in every arm
        cmd = build_command(pair, arm, port=1, sweep=sweep)
        assert cmd[cmd.index("--attention-backend") + 1] == "FLASH_ATTN"


def test_without_av_arm_static_keeps_vllm_default_unless_set():
    pair = load_suite().pair("tiny-cpu")
    assert "draft_sample_method" not in speculative_config(
        pair, Arm("static", 3), _sweep(arms=["baseline", "static"])
    )
    greedy = _sweep(arms=["static"], draft_sample_method="greedy")
    assert speculative_config(pair, Arm("static", 3), greedy)["draft_sample_method"] == "greedy"


def test_dyn_arm_runs_the_schedule_with_its_largest_k():
    suite = load_suite()
    pair = suite.pair("tiny-cpu")
    sweep = _sweep(arms=["static", "dyn"], schedule=[[1, 2, 3], [3, 64, 1]])
    arms = arms_for(pair, sweep)
    assert arms[-1] == Arm("dyn", 3) and Arm.parse("dyn-k3") == arms[-1]
    cfg = speculative_config(pair, arms[-1], sweep)
    assert cfg["num_speculative_tokens"] == 3
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, 64, 1]]
    static = speculative_config(pair, Arm("static", 3), sweep)
    assert {k: v for k, v in cfg.items() if k != "num_speculative_tokens_per_batch_size"} == static


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"arms": ["dyn"]}, "a dyn arm needs a schedule"),
        ({"schedule": [[1, 4, 3]]}, "a schedule needs 'dyn' in arms"),
        ({"arms": ["dyn"], "schedule": [[2, 4, 3]]}, "start at batch size 1"),
        ({"draft_sample_method": "greedy"}, "needs 'probabilistic'"),
    ],
)
def test_sweep_settings_are_validated(kw, message):
    with pytest.raises(ValidationError, match=message):
        _sweep(**kw)


def test_schedule_beyond_the_drafters_max_k_is_refused():
    from avbench.errors import SuiteError

    sweep = _sweep(arms=["dyn"], schedule=[[1, 4, 5]])
    with pytest.raises(SuiteError, match="asks for K 5 but pair tiny-cpu drafts at most 3"):
        arms_for(load_suite().pair("tiny-cpu"), sweep)


def test_the_nightly_pins_a_backend_per_pair_in_both_arms():
    """mimo-dflash runs FLASH_ATTN for target and drafter in its AV arm and its OFF twin, as PR
    #52228 did; pairs the sweep does not name keep vLLM's choice."""
    suite = load_suite()
    nightly = suite.sweep("nightly")
    mimo, inkling = suite.pair("mimo-dflash"), suite.pair("inkling-mtp")
    for arm in (Arm("static", 8), Arm("av", 8)):
        cmd = build_command(mimo, arm, port=1, sweep=nightly)
        assert cmd[cmd.index("--attention-backend") + 1] == "FLASH_ATTN"
        assert _spec(cmd)["attention_backend"] == "FLASH_ATTN"
        cmd = build_command(inkling, Arm(arm.kind, 3), port=1, sweep=nightly)
        assert "--attention-backend" not in cmd and "attention_backend" not in _spec(cmd)


def test_a_backend_pinned_for_an_unknown_pair_is_one_line(suites_copy):
    from avbench.errors import SuiteError

    path = suites_copy / "sweeps.toml"
    text = path.read_text().replace('{ mimo-dflash = "FLASH_ATTN" }', '{ mimo = "FLASH_ATTN" }')
    path.write_text(text)
    with pytest.raises(
        SuiteError, match=r"sweeps\.nightly\.attention_backend: unknown pair 'mimo'"
    ):
        load_suite(suites_copy)
