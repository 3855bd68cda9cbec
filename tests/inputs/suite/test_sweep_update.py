"""A command line's update over a sweep: None keeps the sweep's value, a nested table's given
fields replace the sweep's one by one, and a closed loop asked for drops the sweep's rates."""

import pytest

from avbench.errors import AvbenchError
from avbench.inputs.suite import Sweep, SweepUpdate

SWEEP = Sweep(
    name="s",
    workloads=["a"],
    warmup=3,
    sampling={"temperature": 0.0, "max_tokens": 64},
    timeouts={"read_s": 60.0},
    sequential={"target": 0.05, "max_requests": 300},
)


def _over(update: SweepUpdate) -> Sweep:
    return Sweep.model_validate(update.over(SWEEP.model_dump()))


def test_an_empty_update_keeps_the_sweep():
    assert _over(SweepUpdate()) == SWEEP


def test_given_fields_replace_the_sweeps_and_nested_ones_field_by_field():
    got = _over(
        SweepUpdate(
            warmup=0,
            sampling={"max_tokens": 8},
            timeouts={"stall_s": 5.0},
            sequential={"max_requests": 50},
        )
    )
    assert got.warmup == 0 and got.workloads == ["a"]
    assert (got.sampling.temperature, got.sampling.max_tokens) == (0.0, 8)
    assert (got.timeouts.read_s, got.timeouts.stall_s) == (60.0, 5.0)
    assert got.sequential is not None and got.sequential.target == 0.05
    assert got.sequential.max_requests == 50


def test_concurrencies_given_drop_the_sweeps_rates():
    open_loop = Sweep(name="o", workloads=["a"], rates=[2.0])
    got = Sweep.model_validate(SweepUpdate(concurrencies=[1, 4]).over(open_loop.model_dump()))
    assert got.rates is None and got.concurrencies == [1, 4]
    kept = Sweep.model_validate(SweepUpdate(warmup=0).over(open_loop.model_dump()))
    assert kept.rates == [2.0]


def test_sequential_bounds_without_a_target_are_refused_in_one_line():
    new = {"name": "n", "workloads": ["a"]}
    with pytest.raises(AvbenchError, match="give --target-half-width too"):
        SweepUpdate(sequential={"max_time_s": 10.0}).over(new)
