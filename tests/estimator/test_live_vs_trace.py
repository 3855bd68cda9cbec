"""Live per-position acceptance against a trace: the comparison and the run it reads."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from avbench.cli import app
from avbench.estimator.live_vs_trace import (
    LiveCheckError,
    TraceAcceptance,
    captured_acceptance,
    compare,
    load_live_run,
)


def _trace(expected, se=0.01):
    k = len(expected)
    return TraceAcceptance(
        1000, np.array(expected), np.array(expected), np.full(k, se), np.full(k, 0.01)
    )


def test_compare_uses_the_live_rate_and_a_tolerance_from_the_drafts():
    res = compare(400, np.array([200, 80]), _trace([0.5, 0.2]))
    assert [p.live for p in res] == [0.5, 0.2]
    # 4 standard errors: binomial over 400 drafts combined with the trace's.
    assert res[0].tolerance == pytest.approx(4 * np.hypot(np.sqrt(0.25 / 400), 0.01))
    assert all(p.passed for p in res)
    off = compare(400, np.array([200, 80]), _trace([0.5, 0.3]))
    assert off[0].passed and not off[1].passed and off[1].diff == pytest.approx(-0.1)
    loose = compare(400, np.array([200, 80]), _trace([0.5, 0.3]), tolerance=0.15)
    assert all(p.passed for p in loose)


def test_a_trace_whose_labels_disagree_with_its_expectation_fails_the_self_check():
    tr = TraceAcceptance(1000, np.array([0.6]), np.array([0.5]), np.array([0.01]), np.array([0.01]))
    (p,) = compare(1000, np.array([500]), tr)
    assert p.live_ok and not p.self_ok and not p.passed


def test_captured_acceptance_counts_as_the_counters_do():
    import pandas as pd

    df = pd.DataFrame({"position": [1, 2, 3, 1, 2, 1], "label": [1, 1, 0, 1, 0, 0]})
    np.testing.assert_allclose(captured_acceptance(df, 3), [2 / 3, 1 / 3, 0.0])
    assert captured_acceptance(df.iloc[:0], 3) is None


def _run(tmp_path, cells, **pair_fields):
    from avbench.inputs.suite import load_suite

    run = tmp_path / "run"
    run.mkdir()
    pair = load_suite().pair("tiny-cpu").model_dump(mode="json") | pair_fields
    (run / "manifest.json").write_text(json.dumps({"run_id": "run", "pair": pair}))
    base = {"run_id": "run", "pair": "tiny-cpu", "arm": "static-k3", "arm_kind": "static",
            "workload": "gsm8k-tiny", "warmup": 0, "num_requests": 4, "k": 3, "temperature": 1.0,
            "top_p": 0.95, "max_tokens": 32, "ignore_eos": False, "api": "chat",
            "chat_template_kwargs": None, "num_drafts": 100.0, "accept_pos_0": 0.5,
            "accept_pos_1": 0.25, "accept_pos_2": 0.1, "concurrency": 4, "repeat": 0}  # fmt: skip
    rows = [base | {"cell_id": f"c{i}"} | c for i, c in enumerate(cells)]
    (run / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_live_run_sums_counts_over_cells(tmp_path):
    run = load_live_run(_run(tmp_path, [{}, {"num_drafts": 300.0, "accept_pos_0": 0.3}]))
    assert run.drafts == 400 and run.k == 3
    np.testing.assert_allclose(run.accepted, [50 + 90, 25 + 75, 10 + 30])


@pytest.mark.parametrize(
    "cells, message",
    [
        ([{"top_p": 1.0}, {}], "top_p: the run's speculative cells differ"),
        ([{"arm_kind": "av"}], "no finished static speculative cells"),
        ([{"accept_pos_2": None}], "no per-position acceptance"),
    ],
)
def test_runs_that_cannot_be_compared_are_one_line_errors(tmp_path, cells, message):
    with pytest.raises(LiveCheckError, match=message):
        load_live_run(_run(tmp_path, cells))


def test_a_pair_that_drafts_inside_its_target_is_a_one_line_error(tmp_path):
    with pytest.raises(LiveCheckError, match="pair tiny-cpu: no separate drafter model"):
        load_live_run(_run(tmp_path, [{}], drafter=None))


def test_cli_against_bad_inputs(tmp_path):
    """The CLI prints an AvbenchError as one line (exit 2); here the error itself is checked."""
    from avbench.errors import AvbenchError

    def error(*args: str) -> str:
        res = CliRunner().invoke(app, ["trace", *args])
        assert isinstance(res.exception, AvbenchError), res.output
        return str(res.exception)

    assert "no manifest.json" in error("--against", str(tmp_path / "nope"))
    run = _run(tmp_path, [{"arm_kind": "baseline"}])
    out = str(tmp_path / "o")
    assert "no finished static speculative cells" in error("--against", str(run), "--out", out)
    assert "--passes" in error("--against", str(run), "--passes", "0", "--out", out)
