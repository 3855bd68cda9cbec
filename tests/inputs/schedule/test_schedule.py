import pytest

from avbench.inputs.schedule import check_dyn, k_at, schedule_from_best_k, validate_schedule


def test_boundaries_sit_at_the_geometric_mean_and_equal_ks_merge():
    assert schedule_from_best_k({1: 3, 4: 1}) == [(1, 2, 3), (3, 4, 1)]
    assert schedule_from_best_k({1: 3, 2: 3, 4: 1, 16: 1, 64: 0}) == [
        (1, 2, 3),
        (3, 32, 1),
        (33, 64, 0),
    ]
    assert schedule_from_best_k({1: 0, 4: 0}) is None


def test_k_at_follows_vllm_gap_and_tail_rules():
    s = [(1, 2, 3), (5, 8, 1)]
    assert [k_at(s, b) for b in (1, 2, 3, 4, 5, 8, 100)] == [3, 3, 3, 3, 1, 1, 1]


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([], "at least one"),
        ([[2, 4, 1]], "start at batch size 1"),
        ([[1, 4, 3], [4, 8, 1]], "not overlap"),
        ([[1, 4, -1]], "K >= 0"),
        ([[1, 4]], "expected [first_batch, last_batch, K]"),
        ([[1, 4, 0]], "no speculation"),
    ],
)
def test_validate_names_the_problem(schedule, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate_schedule(schedule)


def test_dyn_check_nearest_scheduled_k_and_zero_k():
    schedule = [(1, 2, 3), (3, 64, 1), (65, 128, 0)]
    measured = {1: 3.0, 4: 1.03, 8: 1.6, 16: 2.2, 100: None}
    checks = check_dyn(schedule, measured)
    assert [(c.scheduled_k, c.matches) for c in checks] == [
        (3, True), (1, True), (1, True), (1, False), (0, True),
    ]  # fmt: skip
    assert not check_dyn(schedule, {100: 1.0})[0].matches  # K 0 must not draft


def test_single_k_schedule_must_measure_its_k():
    assert check_dyn([(1, 4, 1)], {4: 1.2})[0].matches
    assert not check_dyn([(1, 4, 1)], {4: 1.3})[0].matches
