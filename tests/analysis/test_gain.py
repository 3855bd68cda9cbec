import pytest

from avbench.analysis.gain import comparisons, gain_tables


def test_gain_beyond_noise_with_mean_row(points, cell):
    p = points(
        cell("static-k3", 64, [100, 102], workload="a", tpot=20, accept_len=3.4, accept_rate=0.60),
        cell("av-k3", 64, [120, 122], workload="a", tpot=16, accept_len=3.1, accept_rate=0.70),
        cell("static-k3", 64, [200, 200], workload="b", tpot=10, accept_len=3.0, accept_rate=0.5),
        cell("av-k3", 64, [220, 220], workload="b", tpot=9, accept_len=2.9, accept_rate=0.55),
    )
    (t,) = gain_tables(p, "p", "static-k3", "av-k3")
    a, b = t.rows
    assert a.tput_off == 101 and a.tput_on == 121
    assert a.tput_delta_pct == pytest.approx(20 / 101 * 100)
    assert a.noise_pct == pytest.approx(2 / 101 * 100)  # the larger spread: OFF's 2/101
    assert a.tpot_delta_pct == pytest.approx(-20.0)
    assert a.accept_rate_delta_pp == pytest.approx(10.0)
    assert (a.accept_len_off, a.accept_len_on) == (3.4, 3.1)
    assert a.verdict == "ON faster" and b.verdict == "ON faster" and b.noise_pct == 0
    assert t.mean.tput_delta_pct == pytest.approx((a.tput_delta_pct + 10.0) / 2)
    assert t.losses == ()


def test_gain_smaller_than_noise_is_marked(points, cell):
    p = points(cell("static-k3", 8, [100, 110]), cell("av-k3", 8, [106, 110]))
    (t,) = gain_tables(p, "p", "static-k3", "av-k3")
    (r,) = t.rows
    assert 0 < r.tput_delta_pct < r.noise_pct
    assert r.verdict == "within noise"


def test_loss_beyond_noise_is_a_loss(points, cell):
    p = points(cell("static-k7", 4, [100, 101]), cell("av-k7", 4, [80, 81]))
    (t,) = gain_tables(p, "p", "static-k7", "av-k7")
    assert t.rows[0].verdict == "ON slower" and t.losses == t.rows


def test_one_repeat_leaves_noise_unknown(points, cell):
    p = points(cell("static-k3", 4, 100), cell("av-k3", 4, 101))
    (t,) = gain_tables(p, "p", "static-k3", "av-k3")
    assert t.rows[0].noise_pct is None and not t.rows[0].noise_known
    assert t.rows[0].verdict == "ON faster"  # direction only; the report adds "noise unknown"


def test_arm_missing_at_a_load_lists_the_workload(points, cell):
    p = points(
        cell("static-k3", 1, 100, workload="a"), cell("av-k3", 1, 110, workload="a"),
        cell("static-k3", 1, 100, workload="b"),
        cell("static-k3", 4, 300, workload="a"),
    )  # fmt: skip
    t1, t4 = gain_tables(p, "p", "static-k3", "av-k3")
    assert [r.workload for r in t1.rows] == ["a"] and t1.missing == ("b",)
    assert t4.rows == () and t4.mean is None and t4.missing == ("a", "b")


def test_comparisons_pair_each_switch_with_its_fixed_k(points, cell):
    p = points(
        cell("static-k1", 1, 1), cell("static-k3", 1, 1), cell("av-k3", 1, 1),
        cell("dyn-k3", 1, 1), cell("av-k5", 1, 1),
    )  # fmt: skip
    arms = p[["pair", "arm", "arm_kind"]].drop_duplicates()
    assert comparisons(arms) == [("static-k3", "av-k3"), ("static-k3", "dyn-k3")]


def test_av_acceptance_is_compared_per_verified_draft_when_captured(points, cell):
    """AV's counters count scheduled drafts: with captures the table compares per verified
    draft; without, it keeps the counters' figure and says it is per scheduled draft."""
    off = cell("static-k4", 8, [100, 100], accept_rate=0.50)
    on = cell("av-k4", 8, [110, 110], accept_rate=0.30)  # trims counted as not accepted
    (t,) = gain_tables(points(off, on), "p", "static-k4", "av-k4")
    assert t.rows[0].accept_rate_delta_pp == pytest.approx(-20.0)
    assert not t.rows[0].accept_rate_per_verified and t.rows[0].trimmed_on is None
    for row in on:
        row |= {"verified_acceptance_rate": 0.60, "trimmed_share": 0.5}
    (t,) = gain_tables(points(off, on), "p", "static-k4", "av-k4")
    assert t.rows[0].accept_rate_delta_pp == pytest.approx(10.0)
    assert t.rows[0].accept_rate_per_verified and t.rows[0].trimmed_on == 0.5
