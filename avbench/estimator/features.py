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

from avbench.estimator.online import (
    F_CLAMP,
    EstimatorConfig,
    ReplayResult,
    logit_from_prob,
    replay,
)

ScoreOfQ = Callable[[np.ndarray], np.ndarray]  # q (M, V) -> score (M, V) if token v is drawn
# "exact": features as stored; "vllm": logit(q_max) as vLLM's float32 feature kernel rounds it.
FeatureMode = Literal["exact", "vllm"]
FEATURE_MODES: tuple[str, ...] = ("exact", "vllm")

# vLLM's feature kernel reduces the vocabulary in blocks of this many logits.
_VLLM_VOCAB_BLOCK = 4096


def vllm_logit_qmax(logits, temperature) -> np.ndarray:
    """logit(q_max) exactly as vLLM's estimator computes it (float32), per row of ``logits``.

    Mirrors ``_local_max_sumexp_kernel`` + ``_predict_kernel``: logits / temperature (left
    unscaled at temperature 0), per 4096-token block the max and the sum of exp(z - max),
    blocks rescaled to the global max and summed, then f = -log(max(total - 1, 0)) clamped to
    ±40. Because ``total`` holds the top token's 1 in float32, the complement keeps only ~7
    digits: above f ≈ 16 it rounds to 0 (f = 40) and from f ≈ 10 to 15 it is off by up to
    ~0.25 (~0.4 on small vocabularies) from the exact logit (docs/adaptive-verification.md). ``logits``: numpy array or torch tensor (…, V);
    ``temperature``: a scalar or one value per row. Matches the kernel bit for bit in Triton's
    interpreter (same reduction order); on a GPU the exp and sum differ in the last bits.
    """
    if hasattr(logits, "detach"):
        logits = logits.detach().float().cpu().numpy()
    z = np.asarray(logits, dtype=np.float32)
    shape, vocab = z.shape[:-1], z.shape[-1]
    z = z.reshape(-1, vocab)
    t = np.broadcast_to(np.asarray(temperature, dtype=np.float32), shape).reshape(-1, 1)
    z = z / np.where(t > 0, t, np.float32(1.0))
    n_blocks = -(-vocab // _VLLM_VOCAB_BLOCK)
    padded = np.full((z.shape[0], n_blocks * _VLLM_VOCAB_BLOCK), -np.inf, dtype=np.float32)
    padded[:, :vocab] = z
    blocks = padded.reshape(z.shape[0], n_blocks, _VLLM_VOCAB_BLOCK)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        bmax = blocks.max(axis=-1)
        bsum = np.stack(
            [
                np.where(
                    bmax[:, b] > -np.inf,
                    np.sum(np.exp(blocks[:, b] - bmax[:, b, None]), axis=-1),
                    np.float32(0.0),
                )
                for b in range(n_blocks)
            ],
            axis=-1,
        ).astype(np.float32)
        gmax = bmax.max(axis=-1, keepdims=True)
        scaled = bsum * np.exp(bmax - gmax)
        # The kernel pads the block list to a power of two with zeros; the padding decides
        # how the float32 sum is split, so it is kept.
        pad = (1 << (n_blocks - 1).bit_length()) - n_blocks
        scaled = np.concatenate([scaled, np.zeros((len(z), pad), dtype=np.float32)], axis=-1)
        total = np.sum(scaled, axis=-1, dtype=np.float32)
        f = -np.log(np.maximum(total - np.float32(1.0), np.float32(0.0)))
    return np.clip(f, -F_CLAMP, F_CLAMP).astype(np.float32).reshape(shape)


def vllm_logit_qmax_from_f(f: np.ndarray) -> np.ndarray:
    """vLLM's float32 rounding applied to an exact logit(q_max): the complement e^-f added to
    the top token's 1 in float32. Drafts traced offline store only the exact f; this follows
    vLLM's dominant rounding (not the last bits of its vocabulary sum) so a replay of them takes
    vLLM's slope path. Idempotent (to one float32 unit) on values vLLM produced."""
    with np.errstate(over="ignore", divide="ignore"):
        comp = np.exp(-np.asarray(f, dtype=np.float64)).astype(np.float32)
        total = np.float32(1.0) + comp
        out = -np.log(np.maximum(total - np.float32(1.0), np.float32(0.0)))
    return np.clip(out, -F_CLAMP, F_CLAMP).astype(np.float32)


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
