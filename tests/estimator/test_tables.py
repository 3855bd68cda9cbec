"""Tables from synthetic drafts with a confidence head and several workloads."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from avbench.estimator.drafts import DraftsError
from avbench.estimator.synthetic import AcceptanceModel, simulate
from avbench.estimator.tables import (
    Context,
    Inputs,
    all_tables,
    estimator_vs_head_table,
    feature_table,
    load_inputs,
    per_position_table,
    refit_table,
    to_markdown,
    workload_table,
    write_tables,
)

BETA = np.array([0.6, 0.2, -0.2, -0.5])


@pytest.fixture(scope="module")
def drafts():
    # Three workloads, from predictable (q_max near 1) to unpredictable.
    parts = [
        simulate(
            AcceptanceModel(0.5, BETA + shift, head_noise=0.8, qmax_beta=ab),
            steps=400,
            requests=8,
            seed=i,
            workload=w,
        )
        for i, (w, shift, ab) in enumerate(
            [("easy", 0.4, (4.0, 1.0)), ("mid", 0.0, (2.0, 1.0)), ("hard", -0.6, (1.0, 1.5))]
        )
    ]
    return pd.concat(parts, ignore_index=True)


def test_estimator_vs_head_has_cis(drafts):
    ctx = Context.build(drafts)
    t = estimator_vs_head_table(ctx, n_boot=30)
    assert [r[0] for r in t.rows] == ["all positions", "excluding position 1"]
    assert t.rows[0][1] == len(drafts) and t.rows[1][1] == int((drafts["position"] > 1).sum())
    ci = t.rows[0][4]
    lo, hi = (float(x) for x in ci[ci.index("[") + 1 : -1].split(","))
    assert lo <= float(ci.split()[0]) <= hi
    assert "published" in t.columns
    md = to_markdown(t)
    assert "published" in md and "95% CI" in md


def test_per_position_and_workload_tables(drafts):
    ctx = Context.build(drafts)
    pp = per_position_table(ctx)
    assert [r[0] for r in pp.rows] == [1, 2, 3, 4]
    assert all(0.5 < r[3] < 1.0 for r in pp.rows)  # estimator AUC: informative
    wt = workload_table(ctx, None)
    rows = {r[1]: r for r in wt.rows}
    assert set(rows) == {"easy", "mid", "hard", "all"}
    # The position-1 intercept follows the simulated shift (0.6 + 0.4, 0.6, 0.6 - 0.6).
    assert rows["easy"][8] > rows["mid"][8] > rows["hard"][8]
    assert wt.extra["r_beta1_entropy"] < -0.5  # lower entropy, higher intercept
    assert not np.isnan(wt.extra["r_slope_entropy"])


def test_stored_estimator_prediction_is_used(drafts):
    d = drafts.assign(estimator_pred=0.5)
    ctx = Context.build(d)
    assert np.all(ctx.preds["estimator"] == 0.5)
    assert not np.all(ctx.preds["logit_qmax_fitted"] == 0.5)


def test_write_and_reload(drafts, tmp_path):
    from avbench.estimator.drafts import write_drafts

    write_drafts(drafts, tmp_path / "run" / "drafts" / "sim.drafts.parquet")
    inputs = load_inputs([tmp_path / "run"])
    assert isinstance(inputs, Inputs) and len(inputs.drafts) == len(drafts)
    md = write_tables(all_tables(inputs, n_boot=10), tmp_path / "out")
    text = md.read_text()
    assert text.count("### ") == 6 and "ECE (10 bins)" in text
    feats = pd.read_csv(tmp_path / "out" / "features.csv")
    assert list(feats["feature"])[-1] == "confidence head" and feats["published AUC"].notna().any()
    with pytest.raises(DraftsError, match="no \\*.drafts.parquet"):
        load_inputs([tmp_path / "out"])


def test_partial_head_scores_compare_on_the_scored_drafts(drafts):
    d = drafts.copy()
    d.loc[d["workload_id"] == "hard", "head_score"] = np.nan  # a pair without a head
    ctx = Context.build(d)
    t = estimator_vs_head_table(ctx, n_boot=5)
    assert t.rows[0][1] == int((d["workload_id"] != "hard").sum())


def _inverted(workload: str, seed: int, qmax_beta: tuple[float, float]) -> pd.DataFrame:
    """A stream whose acceptance falls as the drafter grows confident: every slope step would
    turn the slope negative, so vLLM's guard masks it, while the intercepts keep moving."""
    return simulate(
        AcceptanceModel(-0.6, BETA, qmax_beta=qmax_beta),
        steps=400,
        requests=8,
        seed=seed,
        workload=workload,
    )


def test_masked_slope_steps_count_as_refits_that_moved():
    df = pd.concat(
        [
            _inverted(w, i, ab)
            for i, (w, ab) in enumerate(
                [("easy", (4.0, 1.0)), ("mid", (2.0, 1.0)), ("hard", (1.0, 1.5))]
            )
        ],
        ignore_index=True,
    )
    ctx = Context.build(df)
    wt = workload_table(ctx, None)
    rows = {r[1]: r for r in wt.rows if r[1] != "all"}
    for r in rows.values():
        assert r[6] == "4/4" and r[7] == 0.5 and r[8] != -0.2  # slope held, intercepts moved
    # Every stream's parameters moved, so the intercept correlation is computed over all three.
    assert not np.isnan(wt.extra["r_beta1_entropy"])
    rt = refit_table(ctx)
    assert [r[3:7] for r in rt.rows] == [[4, 4, 4, 0]] * 3


def test_refit_table_counts_rounds_without_labels(drafts):
    d = drafts[drafts["workload_id"] == "mid"]
    d = d[(d["step"] < 100) | (d["step"] >= 200)]  # calls 100-199 graded nothing
    rt = refit_table(Context.build(d))
    assert [r[3:8] for r in rt.rows] == [[4, 3, 0, 0, 1]]


def test_vllm_feature_mode_rounds_confident_drafts(drafts):
    d = drafts.copy()
    conf = d.index % 7 == 0
    d.loc[conf, "logit_q_max"] = 17.5  # exact logit; vLLM's float32 kernel returns 40
    exact = Context.build(d)
    vllm = Context.build(d, feature_mode="vllm")
    p_e, p_v = exact.preds["logit_qmax_fitted"], vllm.preds["logit_qmax_fitted"]
    first = conf & (d["step"].to_numpy() < 100)  # cold start: sigmoid(0.5 f - 0.2)
    assert np.all(p_v[first] > p_e[first])
    np.testing.assert_allclose(p_v[first], 1.0 / (1.0 + np.exp(-(0.5 * 40.0 - 0.2))))
    key = ("sim", "sim-pair", "mid")
    assert not np.allclose(exact.replays[key].beta, vllm.replays[key].beta)
    assert "feature mode 'vllm'" in to_markdown(feature_table(vllm, lossless_n=20))
