"""The pair and sweep a command runs: the suite's, with the command line's typed overrides
applied and validated as the suite file's own fields are (`avbench plan`, `avbench sweep`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from avbench.commands.request import invalid
from avbench.errors import AvbenchError
from avbench.inputs.suite import Pair, Suite, Sweep, SweepUpdate, load_suite


@dataclass(frozen=True)
class Resolved:
    suite: Suite
    pair: Pair
    sweep: Sweep


def load_update(
    workloads: list[str] | None,
    concurrencies: list[int] | None,
    rates: list[float] | None,
    k_values: list[int] | None,
) -> SweepUpdate:
    """--workloads, --concurrencies (closed loop) or --rates (open loop, requests per second,
    like `vllm bench serve --request-rate`), --k."""
    if concurrencies is not None and rates is not None:
        raise AvbenchError(
            "--rates and --concurrencies: give one (a cell runs open loop at a rate or closed "
            "loop at a concurrency)"
        )
    return SweepUpdate(
        workloads=workloads, concurrencies=concurrencies, rates=rates, k_values=k_values
    )


def updated_sweep(sweep: Sweep, update: SweepUpdate) -> Sweep:
    """``sweep`` with the command line's values over it, validated as one sweep."""
    try:
        return Sweep.model_validate(update.over(sweep.model_dump()))
    except ValidationError as exc:
        raise invalid(exc, "command-line override") from None


def resolve(
    suites: Path | None, pair_name: str, sweep_name: str | None, update: SweepUpdate
) -> Resolved:
    """Load the suite, pick pair and sweep, apply the command line's update."""
    suite = load_suite(suites)
    pair = suite.pair(pair_name)
    sweep = updated_sweep(suite.sweep(sweep_name or pair.default_sweep), update)
    for w in sweep.workloads:
        suite.workload(w)
    if update.k_values:  # --k wins over the pair's own k_values
        too_big = [k for k in sweep.k_values if k > pair.max_k]
        if too_big:
            raise AvbenchError(
                f"--k: {', '.join(map(str, too_big))} above max_k {pair.max_k} of pair {pair.name}"
            )
        pair = pair.model_copy(update={"k_values": sweep.k_values})
    return Resolved(suite, pair, sweep)
