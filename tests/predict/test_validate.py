"""Predicted against measured (avbench.predict.validate) on hand-made cells: the tolerance is
max(5%, the arm's repeat spread and the replayed source cells' in quadrature)."""

import math

import pandas as pd
import pytest

from avbench.predict.validate import compare


def _cell(arm, repeat, tput, tpot=10.0, al=None):
    return {
        "cell_id": f"{arm}__gsm8k__c4__rep{repeat}", "pair": "p", "workload": "gsm8k",
        "arm": arm, "concurrency": 4, "rate": None, "output_tok_s_per_gpu": tput,
        "tpot_ms_median": tpot, "acceptance_length": al,
    }  # fmt: skip


def _frames(source_tputs, measured_tputs, predicted_tputs):
    measured = [_cell("static-k3", i, t, al=2.5) for i, t in enumerate(source_tputs)]
    measured += [_cell("static-k1", i, t, al=1.7) for i, t in enumerate(measured_tputs)]
    predicted = [
        _cell("static-k1", i, t, al=1.7) | {"predicted_from": f"static-k3__gsm8k__c4__rep{i}"}
        for i, t in enumerate(predicted_tputs)
    ]
    return pd.DataFrame(measured), pd.DataFrame(predicted)


def _tput(compared):
    (c,) = [c for c in compared if c.metric == "output_tok_s_per_gpu"]
    return c


def test_a_noisy_source_widens_the_tolerance_by_its_spread():
    # The arm measured 100 and 102 (spread 2%); predicted 92 from a source that measured 95/105.
    c = _tput(compare(*_frames([95, 105], [100, 102], [92, 92])))
    assert c.spread == pytest.approx(2 / 101)
    assert c.source_spread == pytest.approx(0.1)
    assert c.tolerance == pytest.approx(math.hypot(2 / 101, 0.1))
    assert c.error == pytest.approx(92 / 101 - 1) and c.within


def test_a_quiet_source_leaves_the_five_percent_floor():
    c = _tput(compare(*_frames([100, 100.5], [100, 102], [92, 92])))
    assert c.tolerance == pytest.approx(0.05) and not c.within


def test_the_interval_covers_with_both_spreads():
    measured, predicted = _frames([95, 105], [100, 102], [92, 92])
    predicted["output_tok_s_per_gpu_ci95"] = 2.0  # ±2%
    c = _tput(compare(measured, predicted))
    assert c.interval == pytest.approx(2 / 101)
    # |error| 8.9% against hypot(2%, hypot(2%, 10%) / 2) = 5.5%: not covered
    assert c.covered is False
    predicted["output_tok_s_per_gpu_ci95"] = 8.0
    assert _tput(compare(measured, predicted)).covered is True
