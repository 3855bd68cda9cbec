"""The metric unit and its registry.

Each metric is one small :class:`Metric`: a tag, a unit, a definition sentence, the cell inputs
it reads, the other metrics it needs, and a pure function. The function raises :class:`NoValue`
when its inputs are absent (no spec-decode counters on a baseline arm, no successful request,
...), and the cell then stores ``None`` for its columns instead of failing.

A metric's *kind* says how its value becomes flat columns:

- ``scalar``: one column named by the tag;
- ``distribution``: the function returns the samples (a numpy array); the columns are
  ``<tag>_mean``, ``<tag>_median``, ``<tag>_p90``, ``<tag>_p99`` (numpy's default linear
  interpolation between order statistics);
- ``indexed``: the function returns ``{key: value}``; one column ``<tag>_<key>`` per key
  (per-position acceptance, error counts by kind).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from avbench.errors import AvbenchError

Kind = Literal["scalar", "distribution", "indexed"]
STATS: tuple[str, ...] = ("mean", "median", "p90", "p99")
_STAT_TEXT = {
    "mean": "Mean",
    "median": "Median",
    "p90": "90th percentile",
    "p99": "99th percentile",
}


class MetricsError(AvbenchError):
    """Inputs to the metrics are malformed (bad /metrics text, inconsistent record)."""


class NoValue(Exception):  # a signal ("no value here"), not an error condition
    """The metric's inputs are absent for this cell; its columns are stored as None."""


@dataclass(frozen=True)
class Summary:
    """Mean, median, p90 and p99 of a metric's samples."""

    mean: float
    median: float
    p90: float
    p99: float
    count: int

    @classmethod
    def of(cls, samples: np.ndarray) -> Summary:
        samples = np.asarray(samples, dtype=float)
        if samples.size == 0:
            raise NoValue("no samples")
        p50, p90, p99 = np.percentile(samples, [50.0, 90.0, 99.0])
        return cls(float(samples.mean()), float(p50), float(p90), float(p99), int(samples.size))


@dataclass(frozen=True)
class Metric:
    tag: str
    unit: str
    definition: str
    kind: Kind
    inputs: tuple[str, ...]  # fields of CellData the function reads
    requires: tuple[str, ...]  # tags of metrics whose values it reads
    fn: Callable[[Any, Mapping[str, Any]], Any]  # (CellData, values of `requires`) -> value

    def columns(self, keys: tuple = ()) -> list[str]:
        if self.kind == "distribution":
            return [f"{self.tag}_{s}" for s in STATS]
        if self.kind == "indexed":
            return [f"{self.tag}_{k}" for k in keys]
        return [self.tag]

    def column_definition(self, column: str) -> str:
        if self.kind == "distribution":
            stat = column[len(self.tag) + 1 :]
            return f"{_STAT_TEXT[stat]} of: {self.definition}"
        if self.kind == "indexed":
            key = column[len(self.tag) + 1 :]
            return f"[{key}] {self.definition}"
        return self.definition


@dataclass(frozen=True)
class ColumnDefinition:
    column: str
    metric: str  # the tag of the metric that produced it
    unit: str
    definition: str


REGISTRY: dict[str, Metric] = {}


def metric(
    tag: str,
    *,
    unit: str,
    definition: str,
    kind: Kind = "scalar",
    inputs: tuple[str, ...] = (),
    requires: tuple[str, ...] = (),
) -> Callable[[Callable], Callable]:
    """Register the decorated pure function as a metric (the function itself is returned)."""

    def register(fn: Callable) -> Callable:
        if tag in REGISTRY:
            raise ValueError(f"metric {tag!r} registered twice")
        REGISTRY[tag] = Metric(tag, unit, " ".join(definition.split()), kind, inputs, requires, fn)
        return fn

    return register


def ordered_metrics(registry: Mapping[str, Metric] | None = None) -> list[Metric]:
    """Metrics ordered so that each comes after the metrics it requires (stable otherwise)."""
    registry = REGISTRY if registry is None else registry
    order: list[Metric] = []
    state: dict[str, str] = {}

    def visit(tag: str, path: tuple[str, ...]) -> None:
        if state.get(tag) == "done":
            return
        if state.get(tag) == "visiting":
            raise ValueError(f"metric dependency cycle: {' -> '.join((*path, tag))}")
        if tag not in registry:
            raise ValueError(f"metric {path[-1]!r} requires unknown metric {tag!r}")
        state[tag] = "visiting"
        for dep in registry[tag].requires:
            visit(dep, (*path, tag))
        state[tag] = "done"
        order.append(registry[tag])

    for tag in registry:
        visit(tag, ())
    return order


def need(value: Any, what: str) -> Any:
    """Return ``value``, or raise NoValue naming ``what`` when it is None or empty."""
    if value is None:
        raise NoValue(f"{what} absent")
    if isinstance(value, np.ndarray) and value.size == 0:
        raise NoValue(f"no {what}")
    return value


def ratio(numerator: float | None, denominator: float | None, what: str) -> float:
    """numerator / denominator, or NoValue when either is absent or the denominator is 0."""
    if numerator is None or denominator is None:
        raise NoValue(f"{what}: counters absent")
    if denominator == 0:
        raise NoValue(f"{what}: zero denominator")
    return float(numerator) / float(denominator)
