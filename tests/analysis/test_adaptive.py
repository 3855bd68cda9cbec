import pandas as pd
import pytest

from avbench.analysis.adaptive import Uncertainty, Wanted, replay, standings
from avbench.analysis.points import POOLED, build_points


def _points(*groups, predicted=()):
    rows = [r for g in groups for r in g]
    for r in rows:
        r["predicted"] = r["arm"] in predicted
    p = build_points(pd.DataFrame(rows))
    return p[p["workload"] == POOLED]


UNC = Uncertainty(predicted=0.10, single=0.05)


def test_a_lead_beyond_both_intervals_is_decided_without_measuring_the_prediction(cell):
    view = _points(
        cell("baseline", 1, 100), cell("static-k3", 1, 60), cell("static-k1", 1, 80),
        predicted={"static-k1"},
    )  # fmt: skip
    (s,) = standings(view, UNC, max_repeats=2)
    # baseline 100 ± 5, k1 80 ± 8: a lead of 20 against hypot(5, 8) = 9.4: decided on a prediction.
    assert (s.verdict, s.state, s.wanted) == ("no speculation", "decided", ())
    assert s.margin == pytest.approx(0.25)


def test_a_predicted_contender_is_measured_first(cell):
    view = _points(
        cell("baseline", 2, 100), cell("static-k3", 2, 70), cell("static-k1", 2, 90),
        predicted={"static-k1"},
    )  # fmt: skip
    (s,) = standings(view, UNC, max_repeats=2)
    # a lead of 10 against hypot(5, 9) = 10.3: a tie is inside the difference's interval.
    assert s.state == "measure"
    assert [o.arm for o in s.contenders] == ["static-k1"]
    assert s.wanted == (Wanted("static-k1", 2, 0),)
    assert s.rests_on_prediction


def test_measured_contenders_get_one_more_repeat_then_inside_noise(cell):
    one = _points(cell("baseline", 4, 100), cell("static-k1", 4, 97))
    (s,) = standings(one, UNC, max_repeats=2)
    assert s.state == "repeat"
    assert set(s.wanted) == {Wanted("baseline", 4, 1), Wanted("static-k1", 4, 1)}
    two = _points(cell("baseline", 4, [100, 101]), cell("static-k1", 4, [97, 96]))
    (s,) = standings(two, UNC, max_repeats=2)
    assert (s.state, s.wanted, s.verdict) == ("inside noise", (), "no speculation")


def test_the_repeat_spread_widens_a_measured_interval(cell):
    # Two repeats 20% apart: their mean 101 ± 19.8% / sqrt(2) = ± 14.1 ties with a rival 13 below
    # (88 ± 5% / sqrt(2): hypot(14.1, 3.1) = 14.5); with 5% alone (hypot(3.6, 3.1) = 4.7) it
    # would not.
    view = _points(cell("static-k1", 8, [111, 91]), cell("baseline", 8, [88, 88]))
    (s,) = standings(view, UNC, max_repeats=3)
    assert s.verdict == "static K=1"
    assert s.state == "repeat"
    assert {w.repeat for w in s.wanted} == {2}


def test_each_concurrency_stands_alone_and_a_tie_goes_to_the_smaller_k(cell):
    view = _points(
        cell("baseline", 1, 50), cell("static-k3", 1, 100), cell("static-k1", 1, 100),
        cell("baseline", 4, 400), cell("static-k3", 4, 100), cell("static-k1", 4, 150),
        predicted={"static-k1"},
    )  # fmt: skip
    s1, s4 = standings(view, UNC, max_repeats=2)
    assert (s1.concurrency, s1.verdict, s1.state) == (1, "static K=1", "measure")
    assert (s4.concurrency, s4.verdict, s4.state) == (4, "no speculation", "decided")


FIRST = {"baseline", "static-k3"}


def test_replay_of_a_clear_run_takes_no_round_after_the_first(cell):
    view = _points(
        cell("baseline", 1, [100, 100]), cell("static-k3", 1, [60, 61]),
        cell("static-k1", 1, [80, 81]),
    )  # fmt: skip
    assert replay(view, FIRST, UNC, max_repeats=2) == []


def test_replay_measures_a_near_prediction_then_repeats_then_stops_inside_noise(cell):
    view = _points(
        cell("baseline", 1, [100, 101]), cell("static-k3", 1, [60, 61]),
        cell("static-k1", 1, [96, 97]), cell("baseline", 4, [100, 100]),
        cell("static-k3", 4, [50, 50]), cell("static-k1", 4, [70, 70]),
    )  # fmt: skip
    rounds = replay(view, FIRST, UNC, max_repeats=2)
    # c=1: k1 (predicted, 96.5 ± 9.7) ties with the baseline (100.5 ± 5.0), is measured, then
    # the lead of 4 is inside hypot(5.0, 4.8) with one repeat and with two: inside noise.
    # c=4: decided.
    assert rounds == [
        (Wanted("static-k1", 1, 0),),
        (Wanted("baseline", 1, 1), Wanted("static-k1", 1, 1)),
    ]


def test_replay_repeats_tied_measured_options_until_decided_or_spent(cell):
    def rounds(k3: float):
        view = _points(
            cell("baseline", 2, [100, 100, 100]), cell("static-k3", 2, [k3, k3, k3]),
            cell("static-k1", 2, [40, 40, 40]),
        )  # fmt: skip
        return replay(view, FIRST, UNC, max_repeats=3)

    once = (Wanted("baseline", 2, 1), Wanted("static-k3", 2, 1))
    # A lead of 6: inside hypot(5, 4.7) = 6.9 with one repeat each, beyond hypot(3.5, 3.3) = 4.9
    # with two (each the mean of two cells): one round of repeats decides it.
    assert rounds(94) == [once]
    # A lead of 3 ties at two repeats and at three (hypot(2.9, 2.8) = 4.0): spent, two rounds.
    assert rounds(97) == [once, (Wanted("baseline", 2, 2), Wanted("static-k3", 2, 2))]


def test_a_predicted_runner_up_decides_only_when_its_own_interval_excludes_a_tie(cell):
    """The runner-up predicted 10% below the winner: with a tight interval (±2%, and 5% for the
    one cell it replays) the verdict is decided; with the cost model's unidentified part
    widening it to ±10% a tie is inside the difference's interval and the prediction is
    measured instead."""

    def view(half: float):
        runner_up = cell("static-k1", 16, 90.0)
        runner_up[0]["output_tok_s_per_gpu_ci95"] = half * 90.0
        return _points(cell("baseline", 16, 100.0), runner_up, predicted={"static-k1"})

    (tight,) = standings(view(0.02), UNC, max_repeats=2)
    # a lead of 10 against hypot(100 * 0.05, 90 * hypot(0.02, 0.05)) = 7.0: no tie.
    assert (tight.verdict, tight.state) == ("no speculation", "decided")
    (wide,) = standings(view(0.10), UNC, max_repeats=2)
    # hypot(100 * 0.05, 90 * hypot(0.10, 0.05)) = 11.2 >= 10: a tie is inside the interval.
    assert wide.state == "measure" and wide.wanted == (Wanted("static-k1", 16, 0),)
    assert [o.interval for o in wide.contenders] == [pytest.approx(0.10)]


def test_a_lead_beyond_the_difference_interval_is_decided_though_the_intervals_overlap(cell):
    # 100 ± 5 and 92 ± 4.6 overlap, but the lead of 8 is beyond hypot(5, 4.6) = 6.8.
    (s,) = standings(_points(cell("static-k3", 2, 100), cell("static-k1", 2, 92)), UNC, 2)
    assert (s.verdict, s.state, s.contenders) == ("static K=3", "decided", ())
    (s,) = standings(_points(cell("static-k3", 2, 100), cell("static-k1", 2, 94)), UNC, 2)
    assert s.state == "repeat"  # a lead of 6 is not


def test_one_cells_noise_is_raised_to_the_runs_median_repeat_spread(cell):
    c2 = (cell("baseline", 2, 100), cell("static-k3", 2, 90))
    (alone,) = standings(_points(*c2), UNC, max_repeats=2)
    # a lead of 10 against hypot(5, 4.5) = 6.7 at the 5% floor: decided on single cells.
    assert (alone.state, alone.cell_noise) == ("decided", 0.05)
    # c = 1 measured twice shows the machine: spreads 20/90 and 1/60.5, median 11.9%.
    c1 = (cell("baseline", 1, [100, 80]), cell("static-k3", 1, [60, 61]))
    s1, s2 = standings(_points(*c1, *c2), UNC, max_repeats=2)
    assert s2.cell_noise == pytest.approx((20 / 90 + 1 / 60.5) / 2)
    # hypot(100, 90) * 11.9% = 16.1 >= 10: a tie now, both single cells repeated.
    assert s2.state == "repeat" and {w.arm for w in s2.wanted} == {"baseline", "static-k3"}
    assert s1.state == "decided"  # 29.5 ahead: beyond any of it
    # A floor already above what the repeats show stays.
    (s,) = standings(_points(*c1[:1]), Uncertainty(single=0.3), 2)
    assert s.cell_noise == 0.3
