"""The pair and sweep a command runs: the suite's, with the command line's typed overrides
applied and validated as the suite file's own fields are (`avbench plan`, `avbench sweep`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from avbench.commands.request import invalid
from avbench.errors import AvbenchError
from avbench.inputs.suite import Pair, Suite, Sweep, load_suite

# Fields of the sweep's nested tables: the command line's replace the file's one by one.
NESTED = ("sampling", "timeouts")


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
) -> dict[str, Any]:
    """--workloads, --concurrencies (closed loop) or --rates (open loop, requests per second,
    like `vllm bench serve --request-rate`), --k."""
    if concurrencies is not None and rates is not None:
        raise AvbenchError(
            "--rates and --concurrencies: give one (a cell runs open loop at a rate or closed "
            "loop at a concurrency)"
        )
    update: dict[str, Any] = {"workloads": workloads, "k_values": k_values}
    if rates is not None:
        return update | {"rates": rates}
    if concurrencies:  # closed loop asked for: the file's rates step aside
        update["rates"] = None
    return update | {"concurrencies": concurrencies}


def updated_sweep(sweep: Sweep, update: dict[str, Any]) -> Sweep:
    """``sweep`` with the command line's values (None: not given) over it, validated as one
    sweep so an error names the field as the suite file's would."""
    data = sweep.model_dump()
    for nested in NESTED:
        data[nested] |= {k: v for k, v in (update.get(nested) or {}).items() if v is not None}
    data["sequential"] = merge_sequential(data.get("sequential"), update.get("sequential"))
    skip = {*NESTED, "sequential"}
    data |= {k: v for k, v in update.items() if k not in skip and (v is not None or k == "rates")}
    try:
        return Sweep.model_validate(data)
    except ValidationError as exc:
        raise invalid(exc, "command-line override") from None


def resolve(
    suites: Path | None, pair_name: str, sweep_name: str | None, update: dict[str, Any]
) -> Resolved:
    """Load the suite, pick pair and sweep, apply the command line's update."""
    suite = load_suite(suites)
    pair = suite.pair(pair_name)
    sweep = updated_sweep(suite.sweep(sweep_name or pair.default_sweep), update)
    for w in sweep.workloads:
        suite.workload(w)
    if update.get("k_values"):  # --k wins over the pair's own k_values
        too_big = [k for k in sweep.k_values if k > pair.max_k]
        if too_big:
            raise AvbenchError(
                f"--k: {', '.join(map(str, too_big))} above max_k {pair.max_k} of pair {pair.name}"
            )
        pair = pair.model_copy(update={"k_values": sweep.k_values})
    return Resolved(suite, pair, sweep)


def merge_sequential(stored: dict | None, given: dict | None) -> dict | None:
    """The sweep file's sequential setting with the command line's fields over it."""
    if not given:
        return stored
    if stored is None and "target" not in given:
        raise AvbenchError(
            "--cell-min-requests/--cell-max-requests/--cell-min-time/--cell-max-time bound "
            "sequential cells: give --target-half-width too (or a sweep with a `sequential` table)"
        )
    return (stored or {}) | given
