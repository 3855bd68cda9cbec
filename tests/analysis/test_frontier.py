import numpy as np

from avbench.analysis.frontier import frontier_count, pareto_mask, static_envelope, with_frontier


def test_pareto_mask_matches_brute_force():
    rng = np.random.default_rng(0)
    x, y = rng.random(200).round(1), rng.random(200).round(1)  # rounding makes ties
    mask = pareto_mask(x, y)
    for i in range(200):
        dominated = any(
            x[j] >= x[i] and y[j] >= y[i] and (x[j] > x[i] or y[j] > y[i]) for j in range(200)
        )
        assert mask[i] == (not dominated)


def test_identical_points_are_both_on_the_frontier_and_nan_is_never():
    mask = pareto_mask(np.array([1.0, 1.0, 0.5, np.nan]), np.array([2.0, 2.0, 1.0, 9.0]))
    assert mask.tolist() == [True, True, False, False]


def test_dominated_av_is_on_the_frontier_at_zero_loads(points, cell):
    view = points(
        cell("static-k3", 1, 100), cell("static-k3", 4, 300),
        cell("av-k3", 1, 90), cell("av-k3", 4, 280),
    )  # fmt: skip
    view = view[view["workload"] == "w"]
    count = frontier_count(view, "av-k3")
    assert (count.n, count.m) == (0, 2)
    assert "on the frontier at 0 of 2 loads" in count.sentence()
    assert with_frontier(view).query("arm == 'static-k3'")["on_frontier"].all()


def test_tie_with_static_counts_av_on_the_frontier(points, cell):
    view = points(cell("static-k3", 1, 100), cell("av-k3", 1, 100), cell("baseline", 1, 50))
    count = frontier_count(view[view["workload"] == "w"], "av-k3")
    assert (count.n, count.m) == (1, 1)


def test_arm_missing_at_a_concurrency_is_named_not_counted(points, cell):
    view = points(
        cell("static-k1", 1, 80), cell("static-k1", 4, 300), cell("static-k1", 16, 900),
        cell("av-k3", 1, 120), cell("av-k3", 4, 250),
    )  # fmt: skip
    count = frontier_count(view[view["workload"] == "w"], "av-k3")
    assert count.on == ("c=1",) and count.measured == ("c=1", "c=4")
    assert count.missing == ("c=16",)
    assert count.sentence().endswith("(c=1); not measured at c=16")


def test_static_envelope_takes_the_best_k_per_load_smaller_k_on_ties(points, cell):
    view = points(
        cell("static-k1", 1, 80), cell("static-k3", 1, 100),
        cell("static-k1", 4, 300), cell("static-k3", 4, 300),
        cell("av-k3", 4, 999),
    )  # fmt: skip
    env = static_envelope(view[view["workload"] == "w"])
    assert env[["load", "arm"]].values.tolist() == [["c=1", "static-k3"], ["c=4", "static-k1"]]
