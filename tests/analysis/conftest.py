"""Hand-made cells whose answers are known, for the analysis tests."""

from __future__ import annotations

import pandas as pd
import pytest

from avbench.analysis.points import build_points


def make_cell(arm: str, c: int, y: float | list[float], *, workload: str = "w", x: float | None = None,
         tpot: float | None = None, accept_len: float | None = None,
         accept_rate: float | None = None, rate: float | None = None) -> list[dict]:  # fmt: skip
    """One cell row per repeat (a list of throughputs = interleaved repeats)."""
    kind, _, k = arm.partition("-k")
    ys = y if isinstance(y, list) else [y]
    return [
        {
            "cell_id": f"{arm}__{workload}__{f'r{rate}' if rate else f'c{c}'}__rep{rep}",
            "pair": "p",
            "arm": arm,
            "arm_kind": kind,
            "k": int(k or 0),
            "workload": workload,
            "concurrency": None if rate else c,
            "rate": rate,
            "repeat": rep,
            "output_tok_s_per_gpu": v,
            # Default: interactivity follows throughput at fixed concurrency (Little's law).
            "interactivity_tok_s_user": x if x is not None else v / c,
            "tpot_ms_median": tpot if tpot is not None else 1000 * c / v,
            "acceptance_length": accept_len,
            "acceptance_rate": accept_rate,
        }
        for rep, v in enumerate(ys)
    ]


@pytest.fixture
def points():
    def build(*groups: list[dict]) -> pd.DataFrame:
        return build_points(pd.DataFrame([row for g in groups for row in g]))

    return build


@pytest.fixture
def cell():
    return make_cell
