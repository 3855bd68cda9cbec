"""Confidence features of a draft and the acceptance prediction each one yields.

"Fitted" features go through the online estimator's model and update rule (shared slope,
per-position intercepts, rounds of N steps), replayed prequentially: every draft is scored
with the parameters in force when it was drafted, as in vLLM. Each feature is oriented so
that larger means "more likely accepted" (entropy enters negated), because the estimator's
guard refuses a negative slope. Feature mode "vllm" rounds logit(q_max) as vLLM's float32
kernel does, so a replay follows vLLM's own slope path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from avbench.estimator.online import EstimatorConfig, ReplayResult, logit_from_prob, replay
from avbench.vllm_feature import F_CLAMP, vllm_logit_qmax_from_f

ScoreOfQ = Callable[[np.ndarray], np.ndarray]  # q (M, V) -> score (M, V) if token v is drawn
# "exact": features as stored; "vllm": logit(q_max) as vLLM's float32 feature kernel rounds it.
FeatureMode = Literal["exact", "vllm"]
FEATURE_MODES: tuple[str, ...] = ("exact", "vllm")


def _logit(q: np.ndarray) -> np.ndarray:
    return logit_from_prob(q)


def _gumbel(q: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        v = -np.log(-np.log(np.asarray(q, dtype=np.float64)))
    return np.clip(
        np.nan_to_num(v, nan=-F_CLAMP, posinf=F_CLAMP, neginf=-F_CLAMP), -F_CLAMP, F_CLAMP
    )


def _entropy(q: np.ndarray) -> np.ndarray:
    q = np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(q > 0, q * np.log(q), 0.0)
    return -t.sum(axis=-1)


def _bcast(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.broadcast_to(v[..., None], q.shape)


@dataclass(frozen=True)
class Feature:
    key: str
    label: str
    fitted: bool  # True: through the online estimator; False: used directly as a probability
    column: Callable[[pd.DataFrame], np.ndarray | None]  # raw feature per stored draft
    score_of_q: ScoreOfQ | None  # trim score given q and the drawn token (lossless check)
    note: str = ""
    # How vLLM's kernel would have rounded the raw column (feature mode "vllm"), if it computes it.
    as_vllm: Callable[[np.ndarray], np.ndarray] | None = None

    def raw(self, df: pd.DataFrame, mode: FeatureMode = "exact") -> np.ndarray | None:
        v = self.column(df)
        if v is None or mode == "exact" or self.as_vllm is None:
            return v
        return self.as_vllm(v).astype(np.float64)


def _f(df: pd.DataFrame) -> np.ndarray:
    f = df["logit_q_max"].to_numpy(dtype=np.float64)
    miss = np.isnan(f)
    if miss.any():
        f = f.copy()
        f[miss] = logit_from_prob(df["q_max"].to_numpy(dtype=np.float64)[miss])
    return f


def _head(df: pd.DataFrame) -> np.ndarray | None:
    h = df["head_score"].to_numpy(dtype=np.float64)
    # NaN where a draft has no head score (a pair without a head): callers mask those rows.
    return None if np.isnan(h).all() else h


FEATURES: tuple[Feature, ...] = (
    Feature(
        "logit_qmax_fitted",
        "logit(q_max), fitted",
        True,
        _f,
        lambda q: _bcast(q, _logit(q.max(axis=-1))),
        as_vllm=vllm_logit_qmax_from_f,
    ),
    Feature(
        "qmax_nofit",
        "q_max, no fit",
        False,
        lambda df: df["q_max"].to_numpy(dtype=np.float64),
        lambda q: _bcast(q, q.max(axis=-1)),
    ),
    Feature(
        "logit_qsampled_fitted",
        "logit(q_sampled), fitted",
        True,
        lambda df: _logit(df["q_sampled"].to_numpy(dtype=np.float64)),
        _logit,
    ),
    Feature(
        "gumbel_qsampled_fitted",
        "-log(-log(q_sampled)), fitted",
        True,
        lambda df: _gumbel(df["q_sampled"].to_numpy(dtype=np.float64)),
        _gumbel,
    ),
    Feature(
        "entropy_fitted",
        "entropy, fitted",
        True,
        lambda df: -df["entropy"].to_numpy(dtype=np.float64),
        lambda q: _bcast(q, -_entropy(q)),
        note="negated: lower entropy, higher acceptance",
    ),
    Feature(
        "head",
        "confidence head",
        False,
        _head,
        None,
        note="a function of the drafter's hidden state before the token is drawn",
    ),
)

GROUP_KEYS = ["run_id", "pair_id", "workload_id"]

StreamKey = tuple[str, str, str]  # (run_id, pair_id, workload_id) of one estimator stream


def stream_key(values: Iterable[object]) -> StreamKey:
    run, pair, workload = (str(v) for v in values)
    return run, pair, workload


def fitted_predictions(
    df: pd.DataFrame, raw: np.ndarray, round_steps: int = 100
) -> tuple[np.ndarray, dict[StreamKey, ReplayResult]]:
    """Prequential online-estimator predictions for one raw feature, one estimator per
    (run, pair, workload) stream. Returns predictions in row order and replay results by group."""
    pred = np.empty(len(df), dtype=np.float64)
    results: dict[StreamKey, ReplayResult] = {}
    if len(df) == 0:
        return pred, results
    k = int(df["position"].max())
    cfg = EstimatorConfig(num_positions=k, round_steps=round_steps)
    codes = df.groupby(GROUP_KEYS, sort=True, observed=True).ngroup().to_numpy()
    step = df["step"].to_numpy()
    pos0 = df["position"].to_numpy().astype(np.int64) - 1
    lab = df["label"].to_numpy()
    if codes.max() == 0:
        groups = [(np.arange(len(df)), stream_key(df.iloc[0][GROUP_KEYS]))]
    else:
        order = np.argsort(codes, kind="stable")
        cuts = np.flatnonzero(np.diff(codes[order])) + 1
        groups = [(ix, stream_key(df.iloc[ix[0]][GROUP_KEYS])) for ix in np.split(order, cuts)]
    for ix, key in groups:
        res = replay(step[ix], pos0[ix], lab[ix], raw[ix], cfg)
        pred[ix] = res.pred
        results[key] = res
    return pred, results


def predictions(
    df: pd.DataFrame, round_steps: int = 100, mode: FeatureMode = "exact"
) -> dict[str, np.ndarray | None]:
    """Prediction of every feature for every draft (None when the feature is absent)."""
    out: dict[str, np.ndarray | None] = {}
    for feat in FEATURES:
        raw = feat.raw(df, mode)
        if raw is None:
            out[feat.key] = None
        elif feat.fitted:
            out[feat.key], _ = fitted_predictions(df, raw, round_steps)
        else:
            out[feat.key] = raw
    return out
