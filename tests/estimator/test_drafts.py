"""The labeled-draft schema: round trip and one-line errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest

from avbench.estimator.drafts import DraftsError, read_drafts, validate_drafts, write_drafts
from avbench.estimator.synthetic import AcceptanceModel, simulate


@pytest.fixture
def df():
    return simulate(AcceptanceModel(0.5, np.array([0.5, 0.0, -0.5])), steps=20, requests=3, seed=0)


def test_round_trip(tmp_path, df):
    path = write_drafts(df, tmp_path / "x.drafts.parquet")
    back = read_drafts(path, structure=True)
    assert len(back) == len(df)
    np.testing.assert_array_equal(back["label"].to_numpy(), df["label"].to_numpy())
    assert back["estimator_pred"].isna().all()
    assert not (tmp_path / "x.drafts.parquet.tmp").exists()


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.drop(columns=["q_max"]), "q_max"),
        (lambda d: d.assign(label=np.where(d.index == 0, 2, d["label"])), "label"),
        (lambda d: d.assign(q_sampled=d["q_sampled"] * 0.0), "q_sampled"),
        (lambda d: d.assign(head_score=1.5), "head_score"),
        (lambda d: d.assign(step=d["step"].astype(float) + 0.5), "step"),
    ],
)
def test_bad_values_name_the_field(df, mutate, field):
    with pytest.raises(DraftsError, match=f"field '{field}'") as exc:
        validate_drafts(mutate(df), "run/x.drafts.parquet")
    assert "run/x.drafts.parquet" in str(exc.value) and "\n" not in str(exc.value)


def test_labeled_prefix_rule(df):
    rej = df.index[(df["label"] == 0) & (df["position"] == 1)][0]
    bad = df.copy()
    bad.loc[rej, "label"] = 0
    # Add a draft after the first rejection: it must have been unlabeled.
    extra = bad.loc[[rej]].assign(position=2, label=1)
    import pandas as pd

    with pytest.raises(DraftsError, match="field 'label'"):
        validate_drafts(pd.concat([bad, extra], ignore_index=True))
    gap = df[~(df["position"] == 2)]
    with pytest.raises(DraftsError, match="field 'position'"):
        validate_drafts(gap)
