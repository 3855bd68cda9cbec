import pytest

from avbench.analysis.points import POOLED
from avbench.analysis.recommend import recommend
from avbench.report.tables import recommendation_text


def _rec(p, scope="w"):
    return recommend(p[p["workload"] == scope], "p", scope)


def test_verdicts_schedule_and_ranges(points, cell):
    p = points(
        # c=1: AV best beyond noise; c=4: static K3 best; c=16: K1 best; c=64: baseline best.
        cell("baseline", 1, [50, 50]), cell("static-k1", 1, [70, 70]),
        cell("static-k3", 1, [90, 91]), cell("av-k3", 1, [110, 111]),
        cell("baseline", 4, [200, 200]), cell("static-k1", 4, [250, 250]),
        cell("static-k3", 4, [300, 303]), cell("av-k3", 4, [280, 280]),
        cell("baseline", 16, [700, 700]), cell("static-k1", 16, [900, 910]),
        cell("static-k3", 16, [850, 850]), cell("av-k3", 16, [860, 860]),
        cell("baseline", 64, [2000, 2000]), cell("static-k1", 64, [1900, 1900]),
        cell("static-k3", 64, [1500, 1500]), cell("av-k3", 64, [1600, 1600]),
    )  # fmt: skip
    rec = _rec(p)
    assert [(d.concurrency, d.verdict, d.schedule_k) for d in rec.decisions] == [
        (1, "AV", 3), (4, "schedule", 3), (16, "schedule", 1), (64, "no speculation", 0),
    ]  # fmt: skip
    d1 = rec.decisions[0]
    assert d1.runner_up.label == "static-k3"
    assert d1.margin_pct == pytest.approx((110.5 - 90.5) / 90.5 * 100)
    assert d1.beyond_noise is True
    assert rec.decisions[2].runner_up.label == "av-k3"  # the best option of another verdict
    assert rec.schedule == [(1, 8, 3), (9, 64, 1)]  # best static K, for a dyn arm
    assert rec.deploy_schedule == [(1, 8, 3), (9, 32, 1), (33, 64, 0)]  # K 0: no speculation
    assert [(r.first, r.last, r.verdict) for r in rec.ranges] == [
        (1, 1, "AV"), (4, 16, "schedule"), (64, 64, "no speculation"),
    ]  # fmt: skip


def test_tie_goes_to_the_simpler_option_and_is_not_beyond_noise(points, cell):
    p = points(
        cell("baseline", 1, [100, 100]), cell("static-k3", 1, [100, 100]),
        cell("av-k3", 1, [100, 100]),
        cell("static-k1", 4, [300, 300]), cell("static-k3", 4, [300, 300]),
    )  # fmt: skip
    d1, d4 = _rec(p).decisions
    assert (d1.verdict, d1.schedule_k, d1.margin_pct, d1.beyond_noise) == (
        "no speculation", 0, 0.0, False,
    )  # fmt: skip
    assert (d4.verdict, d4.schedule_k) == ("schedule", 1)


def test_dominated_av_is_never_recommended(points, cell):
    p = points(
        cell("baseline", 1, 50), cell("static-k3", 1, 100), cell("av-k3", 1, 90),
        cell("baseline", 4, 150), cell("static-k3", 4, 300), cell("av-k3", 4, 290),
    )  # fmt: skip
    rec = _rec(p)
    assert {d.verdict for d in rec.decisions} == {"schedule"}
    assert all(d.runner_up.label == "av-k3" for d in rec.decisions)
    assert rec.decisions[0].beyond_noise is None  # one repeat: noise unknown


def test_gain_smaller_than_noise_is_not_beyond_noise(points, cell):
    p = points(cell("static-k3", 4, [100, 110]), cell("av-k3", 4, [108, 110]))
    (d,) = _rec(p).decisions
    assert d.verdict == "AV" and 0 < d.margin_pct < d.noise_pct and d.beyond_noise is False


def test_arm_missing_at_a_concurrency(points, cell):
    p = points(
        cell("baseline", 1, 50), cell("static-k3", 1, 100), cell("av-k3", 1, 120),
        cell("baseline", 4, 150), cell("static-k3", 4, 300),
    )  # fmt: skip
    d1, d4 = _rec(p).decisions
    assert d1.verdict == "AV"
    assert d4.verdict == "schedule" and "AV not measured" in d4.notes
    assert d4.runner_up.label == "baseline"


def test_pooled_needs_every_workload_and_open_loop_is_ignored(points, cell):
    p = points(
        cell("baseline", 1, 50, workload="a"), cell("static-k3", 1, 100, workload="a"),
        cell("baseline", 1, 70, workload="b"), cell("static-k3", 1, 60, workload="b"),
        cell("static-k3", 4, 300, workload="a"),  # b lacks c=4: no pooled point there
        cell("baseline", 2, 999, workload="a", rate=2.0),  # open loop: its own point
        cell("baseline", 2, 999, workload="b", rate=2.0),
    )  # fmt: skip
    assert set(p.loc[p["workload"] == POOLED, "load"]) == {"c=1", "r=2/s"}
    rec = _rec(p, POOLED)
    assert [(d.concurrency, d.verdict) for d in rec.decisions] == [(1, "schedule")]
    assert rec.decisions[0].winner.tput == pytest.approx(80.0)
    assert rec.schedule == rec.deploy_schedule == [(1, 1, 3)]


def test_a_burst_delivered_option_keeps_its_verdict_with_the_caveat(points, cell):
    def burst(rows, frac):
        return [r | {"stream_burst_frac": frac} for r in rows]

    from avbench.analysis.points import BURST_SUSPECT_FRAC

    p = points(
        cell("baseline", 1, 100), burst(cell("static-k3", 1, 150), 0.31),
        burst(cell("baseline", 4, 300), BURST_SUSPECT_FRAC), cell("static-k3", 4, 400),
    )  # fmt: skip
    d1, d4 = _rec(p).decisions
    assert (d1.verdict, d1.winner.label, d1.winner.burst_frac) == ("schedule", "static-k3", 0.31)
    assert [o.label for o in d1.burst_delivered] == ["static-k3"]
    (note,) = [n for n in d1.notes if "burst" in n]
    assert note.startswith("burst-delivered streams (static-k3 31% in one burst)")
    # At the threshold itself a cell is not suspect.
    assert d4.burst_delivered == () and not any("burst" in n for n in d4.notes)


def test_a_deploy_schedule_with_a_k0_range_says_it_is_not_the_baseline(points, cell):
    p = points(
        cell("baseline", 1, [50, 50]), cell("static-k3", 1, [90, 91]),
        cell("baseline", 64, [2000, 2000]), cell("static-k3", 64, [1500, 1500]),
    )  # fmt: skip
    rec = _rec(p)
    assert rec.deploy_schedule == [(1, 8, 3), (9, 64, 0)]
    text = recommendation_text(rec, {})
    assert "A K 0 range is not a server without speculation" in text
    everywhere = _rec(points(cell("baseline", 1, [50, 50]), cell("static-k3", 1, [90, 91])))
    assert "A K 0 range" not in recommendation_text(everywhere, {})
