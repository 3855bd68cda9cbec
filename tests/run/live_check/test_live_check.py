"""A live run read for the check against a trace: its cells' counts summed, and the runs that
cannot be compared refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from avbench.cli import app
from avbench.estimator.live_vs_trace import LiveCheckError
from avbench.run.live_check import load_live_run


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
