import pytest

from avbench.plan import Arm, arms_for, build_plan
from avbench.suite import load_suite


@pytest.fixture(scope="module")
def suite():
    return load_suite()


def test_demo_arms_are_baseline_static_and_av_at_largest_k(suite):
    arms = arms_for(suite.pair("tiny-cpu"), suite.sweep("demo"))
    assert [a.name for a in arms] == ["baseline", "static-k1", "static-k3", "av-k3"]


def test_k_values_capped_at_pair_max_k(suite):
    pair = suite.pair("inkling-mtp").model_copy(update={"k_values": None})
    arms = arms_for(pair, suite.sweep("default"))  # sweep K list 1,3,5,8; max_k 3
    assert [a.name for a in arms] == ["baseline", "static-k1", "static-k3", "av-k3"]


def test_plan_interleaves_arms_across_repeats(suite):
    pair, sweep = suite.pair("mimo-dflash"), suite.sweep("default")
    cells = build_plan(pair, sweep)
    arms = arms_for(pair, sweep)
    per_arm = len(sweep.workloads) * len(sweep.concurrencies)
    assert len(cells) == sweep.repeats * len(arms) * per_arm
    order = [c.arm for c in cells[::per_arm]]
    assert order == [a.name for a in arms] * sweep.repeats  # A/B/A/B, not A/A/B/B
    assert len({c.id for c in cells}) == len(cells)
    c64 = next(c for c in cells if c.concurrency == 64)
    assert c64.num_requests == max(8 * 64, 32)


def test_arm_name_roundtrip():
    for arm in (Arm("baseline"), Arm("static", 3), Arm("av", 8)):
        assert Arm.parse(arm.name) == arm
    with pytest.raises(ValueError, match="expected baseline"):
        Arm.parse("fast")
