"""The host's GPUs shared by a sweep's arms (avbench/plan/gpus.py), on hand-made inventories."""

import pytest

from avbench.plan.gpus import GpuError, GpuSet, Session, check_inventory, plan_waves, visible_gpus

EIGHT = GpuSet.parse("0-7")
ARMS = ["baseline", "static-k1", "static-k3", "static-k5", "av-k5"]


def _sessions(tp: int, arms=ARMS, repeats: int = 1, isolate=()) -> list[Session]:
    return [Session(a, r, tp, a in isolate) for r in range(repeats) for a in arms]


def _layout(waves) -> list[list[tuple[str, tuple[int, ...]]]]:
    return [[(p.session.arm, p.gpus.ids) for p in w.placements] for w in waves]


def _disjoint(waves) -> None:
    for w in waves:
        ids = [i for p in w.placements for i in p.gpus.ids]
        assert len(ids) == len(set(ids)), ids


def test_eight_gpus_one_tp1_pair_of_five_arms_runs_five_servers_at_once_on_gpus_0_to_4():
    waves = plan_waves(_sessions(1), EIGHT)
    assert _layout(waves) == [[(a, (i,)) for i, a in enumerate(ARMS)]]
    assert waves[0].co_tenants(waves[0].placements[0]) == ARMS[1:]


def test_tp4_with_three_arms_runs_two_at_once_then_one():
    waves = plan_waves(_sessions(4, ARMS[:3]), EIGHT)
    assert _layout(waves) == [
        [("baseline", (0, 1, 2, 3)), ("static-k1", (4, 5, 6, 7))],
        [("static-k3", (0, 1, 2, 3))],
    ]
    _disjoint(waves)


@pytest.mark.parametrize("tp,sizes", [(1, [5, 5]), (2, [4, 4, 2]), (4, [2] * 5), (8, [1] * 10)])
def test_every_tp_fills_waves_in_plan_order_on_disjoint_gpus(tp, sizes):
    sessions = _sessions(tp, repeats=2)
    waves = plan_waves(sessions, EIGHT)
    assert [len(w.placements) for w in waves] == sizes
    assert [p.session for w in waves for p in w.placements] == sessions  # order kept
    _disjoint(waves)
    for w in waves:  # each server gets exactly its TP of the host's GPUs, one arm at most once
        assert all(len(p.gpus) == tp and set(p.gpus.ids) <= set(EIGHT.ids) for p in w.placements)
        assert len({p.session.arm for p in w.placements}) == len(w.placements)


def test_uneven_leftovers_stay_idle_rather_than_split_a_server():
    # 6 GPUs at TP 4: one server at a time, GPUs 4 and 5 idle.
    waves = plan_waves(_sessions(4, ARMS[:2]), GpuSet.parse("0-5"))
    assert _layout(waves) == [[("baseline", (0, 1, 2, 3))], [("static-k1", (0, 1, 2, 3))]]
    # GPUs 0,2,5 at TP 2: one server on 0 and 2, 5 left over.
    waves = plan_waves(_sessions(2, ARMS[:2]), GpuSet.parse("0,2,5"))
    assert _layout(waves) == [[("baseline", (0, 2))], [("static-k1", (0, 2))]]
    # 7 GPUs at TP 3: two servers, the seventh GPU idle.
    waves = plan_waves(_sessions(3, ARMS[:3]), GpuSet.parse("1-7"))
    assert _layout(waves) == [
        [("baseline", (1, 2, 3)), ("static-k1", (4, 5, 6))],
        [("static-k3", (1, 2, 3))],
    ]


def test_an_isolated_arm_runs_alone_and_the_others_share_around_it():
    waves = plan_waves(_sessions(1, isolate={"static-k3"}), EIGHT)
    assert _layout(waves) == [
        [("baseline", (0,)), ("static-k1", (1,))],
        [("static-k3", (0,))],
        [("static-k5", (0,)), ("av-k5", (1,))],
    ]


def test_fewer_gpus_than_two_servers_need_is_the_sequential_sweep():
    one_at_a_time = [[(a, (0, 1, 2, 3))] for a in ARMS]
    assert _layout(plan_waves(_sessions(4), GpuSet.parse("0-6"))) == one_at_a_time
    # No GPU at all (a CPU host) or fewer than one server takes: unpinned, one at a time.
    assert _layout(plan_waves(_sessions(1), GpuSet())) == [[(a, ())] for a in ARMS]
    assert _layout(plan_waves(_sessions(8), GpuSet((0, 1)))) == [[(a, ())] for a in ARMS]


@pytest.mark.parametrize(
    "text,ids",
    [("0-7", tuple(range(8))), ("0,2,5", (0, 2, 5)), ("3", (3,)), (" 0-1, 6 ", (0, 1, 6))],
)
def test_gpu_lists_parse(text, ids):
    assert GpuSet.parse(text).ids == ids


@pytest.mark.parametrize(
    "text,says",
    [
        ("a", "--gpus 'a': expected GPU ids and ranges, e.g. 0-7 or 0,2,5"),
        ("", "expected GPU ids and ranges"),
        ("3-1", "range 3-1 is not low-high up to 4095"),
        ("0-9999", "is not low-high"),
        ("0-3,2", "GPU 2 given twice"),
        ("-1", "expected GPU ids"),
    ],
)
def test_a_bad_gpu_list_is_one_line_naming_the_option(text, says):
    with pytest.raises(GpuError, match="^--gpus ") as got:
        GpuSet.parse(text)
    assert says in str(got.value) and "\n" not in str(got.value)


def test_the_visible_gpus_follow_cuda_visible_devices():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}).ids == (2, 3)
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}).ids == ()
    with pytest.raises(GpuError, match="CUDA_VISIBLE_DEVICES .*pass --gpus"):
        visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-8f2c"})


def test_a_hand_given_list_too_small_for_one_server_is_refused():
    check_inventory(EIGHT, 8, "pair big")
    with pytest.raises(GpuError, match=r"^--gpus 0,1: pair big needs 4 GPUs per server, got 2$"):
        check_inventory(GpuSet((0, 1)), 4, "pair big")
