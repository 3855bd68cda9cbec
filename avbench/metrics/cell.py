"""Compute every registered metric for one cell into flat, named columns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from avbench.loadgen.records import RequestRecord

# Imported for their registrations (each module adds its metrics to REGISTRY).
from avbench.metrics import acceptance, latency, throughput  # noqa: F401
from avbench.metrics.base import (
    REGISTRY,
    STATS,
    ColumnDefinition,
    Metric,
    NoValue,
    Summary,
    ordered_metrics,
)
from avbench.metrics.data import CellData
from avbench.metrics.prometheus import CounterReset, window_counters

# Column order of a row: counts and throughput, then latency, then acceptance.
_MODULE_ORDER = (throughput.__name__, latency.__name__, acceptance.__name__)


def _row_order() -> list[Metric]:
    def rank(tag: str) -> int:
        module = REGISTRY[tag].fn.__module__
        return _MODULE_ORDER.index(module) if module in _MODULE_ORDER else len(_MODULE_ORDER)

    return ordered_metrics({tag: REGISTRY[tag] for tag in sorted(REGISTRY, key=rank)})


@dataclass
class CellMetrics:
    """One cell's metrics: ``values`` is the flat row (None where a metric had no inputs)."""

    values: dict[str, float | None]
    missing: dict[str, str] = field(default_factory=dict)  # metric tag -> why it has no value
    notes: list[str] = field(default_factory=list)  # things a reader of the row must know
    column_metric: dict[str, str] = field(default_factory=dict)  # column -> metric tag

    def definitions(self) -> dict[str, ColumnDefinition]:
        """Unit and definition of every column in ``values``, for reports."""
        out = {}
        for column in self.values:
            m = REGISTRY[self.column_metric[column]]
            out[column] = ColumnDefinition(column, m.tag, m.unit, m.column_definition(column))
        return out


def all_definitions() -> dict[str, ColumnDefinition]:
    """Every column any cell can have; indexed metrics appear once as ``<tag>_<key>``."""
    out = {}
    for m in _row_order():
        for column in m.columns(("<key>",)):
            out[column] = ColumnDefinition(column, m.tag, m.unit, m.column_definition(column))
    return out


def _expand(m: Metric, raw: Any) -> dict[str, float | None]:
    if m.kind == "distribution":
        summary: Summary = raw
        return {f"{m.tag}_{s}": getattr(summary, s) for s in STATS}
    if m.kind == "indexed":
        return {f"{m.tag}_{key}": value for key, value in raw.items()}
    return {m.tag: raw}


def compute_from_data(data: CellData) -> CellMetrics:
    """Run every registered metric, in dependency order, on prepared cell data."""
    result = CellMetrics(values={})
    computed: dict[str, Any] = {}
    for m in _row_order():
        try:
            absent = [dep for dep in m.requires if dep not in computed]
            if absent:
                raise NoValue(f"needs {', '.join(absent)}")
            raw = m.fn(data, {dep: computed[dep] for dep in m.requires})
            if m.kind == "distribution":
                raw = Summary.of(raw)
            computed[m.tag] = raw
            columns = _expand(m, raw)
        except NoValue as why:
            result.missing[m.tag] = str(why)
            # An indexed metric with no value has no keys, hence no columns.
            columns = dict.fromkeys(m.columns(), None) if m.kind != "indexed" else {}
        result.values.update(columns)
        result.column_metric.update(dict.fromkeys(columns, m.tag))
    return result


def compute_cell_metrics(
    records: Sequence[RequestRecord],
    *,
    window_s: float,
    gpus: int,
    counters_before: str | None,
    counters_after: str | None,
    model_name: str | None = None,
) -> CellMetrics:
    """Every metric of one cell.

    ``records``: the cell's request records (warmup ones are dropped here). ``window_s``: the
    measured window in seconds. ``gpus``: GPUs per server (TP × PP × DP). ``counters_before`` /
    ``counters_after``: raw ``/metrics`` text scraped after warmup and after the run (None if
    not scraped: counter-based metrics are then None). ``model_name``: keep only counters with
    this ``model_name`` label (None: sum over all).

    Malformed ``/metrics`` text, or a ``model_name`` the scrape does not have, raises
    :class:`~avbench.metrics.base.MetricsError`; a counter that went backwards (server restart)
    leaves counter metrics None with a note.
    """
    notes = []
    try:
        counters = window_counters(counters_before, counters_after, model_name=model_name)
    except CounterReset as exc:
        counters = None
        notes.append(str(exc))
    data = CellData.from_records(records, window_s=window_s, gpus=gpus, counters=counters)
    result = compute_from_data(data)
    result.notes.extend(notes)
    return result
