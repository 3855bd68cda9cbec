import pytest

from avbench.errors import SuiteError
from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm, arms_for, build_plan


@pytest.fixture(scope="module")
def suite():
    return load_suite()


@pytest.mark.parametrize("pair,sweep", [("tiny-cpu", "demo"), ("tiny-cpu-wide", "demo-wide")])
def test_demo_arms_are_baseline_static_and_av_at_largest_k(suite, pair, sweep):
    arms = arms_for(suite.pair(pair), suite.sweep(sweep))
    assert [a.name for a in arms] == ["baseline", "static-k1", "static-k3", "av-k3"]


def test_the_wide_demo_is_the_wide_pairs_default_and_spans_its_crossover(suite):
    pair = suite.pair("tiny-cpu-wide")
    assert pair.default_sweep == "demo-wide"
    assert suite.sweep("demo-wide").concurrencies == [1, 4, 128]  # pays at 1 and 4, not at 128


@pytest.mark.parametrize("pair,sweep", [("tiny-cpu", "demo"), ("tiny-cpu-wide", "demo-wide")])
def test_demo_samples_as_the_study_and_checks_identity_at_temperature_0(suite, pair, sweep):
    """make demo: the study's sampling (every speculative arm drafting probabilistically, the
    CPU sampler fix on) beside a temperature-0 run whose speculative arm meets its baseline."""
    from avbench.serving.server import ENV_CPU_FIX, ENV_CPU_SEED_FIX, build_env

    pair = suite.pair(pair)
    study, greedy = suite.sweep(sweep), suite.sweep("demo-temp0")
    assert (study.sampling.temperature, study.sampling.top_p) == (1.0, 0.95)
    assert study.draft_method == greedy.draft_method == "probabilistic"
    for arm in arms_for(pair, study):
        env = build_env(pair, arm, None, study)
        assert (env.get(ENV_CPU_FIX) == "1") == (arm.kind != "baseline")
        assert env[ENV_CPU_SEED_FIX] == "1"  # seeded at T = 1: every arm
        assert ENV_CPU_SEED_FIX not in build_env(pair, arm, None, study, cpu_seed_fix=False)
        assert ENV_CPU_SEED_FIX not in build_env(pair, arm, None, greedy)  # no generator at T 0
    assert greedy.sampling.temperature == 0.0
    assert [a.name for a in arms_for(pair, greedy)] == ["baseline", "static-k3"]
    assert set(greedy.workloads) <= set(study.workloads)


def test_k_values_capped_at_pair_max_k(suite):
    pair = suite.pair("inkling-mtp").model_copy(update={"k_values": None})
    arms = arms_for(pair, suite.sweep("default"))  # sweep K list 1,3,5,8; max_k 3
    assert [a.name for a in arms] == ["baseline", "static-k1", "static-k3", "av-k3"]


@pytest.mark.parametrize("pair", ["tiny-cpu", "mimo-dflash", "dsv4-dspark", "inkling-mtp"])
def test_nightly_runs_av_and_its_off_twin_only(suite, pair):
    p = suite.pair(pair)
    arms = arms_for(p, suite.sweep("nightly"))
    assert [a.name for a in arms] == [f"static-k{p.max_k}", f"av-k{p.max_k}"]


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


@pytest.mark.parametrize(
    ("update", "says"),
    [
        ({"concurrencies": [4, 4]}, "concurrencies lists 4 more than once"),
        ({"workloads": ["gsm8k-tiny", "gsm8k-tiny"]}, "workloads lists gsm8k-tiny more than once"),
        ({"rates": [2.0, 2.0]}, "rates lists 2.0 more than once"),
        ({"rates": [1.0, 0.0]}, "rates must be a non-empty list of positive req/s"),
        ({"rates": [-3.0]}, "rates must be a non-empty list of positive req/s"),
        ({"rates": [1.0, 1.0000001]}, "duplicate cell id baseline__gsm8k-tiny__r1__rep0"),
        ({"arms": []}, "arms is empty: nothing to run"),
    ],
)
def test_a_plan_that_would_hide_or_skip_cells_is_refused(suite, update, says):
    sweep = suite.sweep("demo").model_copy(update=update)
    with pytest.raises(SuiteError) as exc:
        build_plan(suite.pair("tiny-cpu"), sweep)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_pair_k_values_above_max_k_are_refused(suite):
    pair = suite.pair("tiny-cpu").model_copy(update={"k_values": [1, 5]})
    with pytest.raises(SuiteError, match=r"pair tiny-cpu: k_values \[5\] above its max_k 3"):
        build_plan(pair, suite.sweep("demo"))


def test_capture_sweep_runs_the_largest_k_only(suite):
    arms = arms_for(suite.pair("tiny-cpu"), suite.sweep("capture"))  # the pair lists K 1 and 3
    assert [a.name for a in arms] == ["static-k3"]
