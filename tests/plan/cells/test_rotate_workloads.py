from avbench.inputs.suite import load_suite
from avbench.plan.cells import build_plan


def test_rotate_workloads_shifts_the_order_each_repeat():
    suite = load_suite()
    pair = suite.pair("tiny-cpu")
    base = suite.sweep("demo").model_copy(
        update={"workloads": ["gsm8k-tiny", "humaneval-tiny"], "repeats": 3, "arms": ["static"]}
    )

    def order(sweep, repeat, arm):
        cells = [c for c in build_plan(pair, sweep) if c.repeat == repeat and c.arm == arm]
        return list(dict.fromkeys(c.workload for c in cells))

    rotated = base.model_copy(update={"rotate_workloads": True})
    for arm in ("static-k1", "static-k3"):
        assert [order(base, r, arm) for r in range(3)] == [["gsm8k-tiny", "humaneval-tiny"]] * 3
        assert [order(rotated, r, arm) for r in range(3)] == [
            ["gsm8k-tiny", "humaneval-tiny"],
            ["humaneval-tiny", "gsm8k-tiny"],
            ["gsm8k-tiny", "humaneval-tiny"],
        ]
    # Same cells, only the order moves.
    assert {c.id for c in build_plan(pair, base)} == {c.id for c in build_plan(pair, rotated)}
