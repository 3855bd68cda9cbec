"""Per-cell metrics (docs/measurement.md): one small registered unit per metric.

Entry point: :func:`compute_cell_metrics` (records + /metrics scrapes -> flat columns).
"""

from avbench.metrics.base import (
    REGISTRY,
    ColumnDefinition,
    Metric,
    MetricsError,
    NoValue,
    Summary,
    ordered_metrics,
)
from avbench.metrics.cell import (
    CellMetrics,
    all_definitions,
    compute_cell_metrics,
    compute_from_data,
)
from avbench.metrics.data import KNOWN_ERROR_KINDS, CellData
from avbench.metrics.prometheus import (
    CounterReset,
    SpecDecodeCounters,
    delta,
    parse_counters,
    window_counters,
)

__all__ = [
    "KNOWN_ERROR_KINDS",
    "REGISTRY",
    "CellData",
    "CellMetrics",
    "ColumnDefinition",
    "CounterReset",
    "Metric",
    "MetricsError",
    "NoValue",
    "SpecDecodeCounters",
    "Summary",
    "all_definitions",
    "compute_cell_metrics",
    "compute_from_data",
    "delta",
    "ordered_metrics",
    "parse_counters",
    "window_counters",
]
