"""Labeled drafts simulated from a known logistic acceptance model (tests and benchmark)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class AcceptanceModel:
    """The known truth drafts are drawn from: q_max ~ Beta(*qmax_beta) per draft, label ~
    Bernoulli(sigmoid(omega * logit(q_max) + beta[pos])); ``head_noise``: the standard deviation
    of a confidence head's logit around the true one (None: no head scores)."""

    omega: float
    beta: np.ndarray
    qmax_beta: tuple[float, float] = (2.0, 1.0)
    head_noise: float | None = None


def simulate(
    model: AcceptanceModel,
    steps: int,
    requests: int,
    seed: int = 0,
    workload: str = "sim",
) -> pd.DataFrame:
    """Drafts of ``requests`` concurrent requests for ``steps`` engine steps, drawn from
    ``model``; a draft is stored only if every earlier draft of its step was accepted (labeled
    prefix)."""
    omega, beta, qmax_beta, head_noise = model.omega, model.beta, model.qmax_beta, model.head_noise
    rng = np.random.default_rng(seed)
    k = len(beta)
    parts: dict[str, list[np.ndarray]] = {}
    for lo in range(
        0, steps, 2000
    ):  # chunks of steps keep the (steps, requests, K) temporaries small
        n_steps = min(2000, steps - lo)
        q = np.clip(rng.beta(*qmax_beta, size=(n_steps, requests, k)), 1e-6, 1 - 1e-6)
        f = np.log(q) - np.log1p(-q)
        p = 1.0 / (1.0 + np.exp(-(omega * f + beta)))
        y = rng.random(p.shape) < p
        prev_all = np.concatenate(
            [np.ones((n_steps, requests, 1), bool), np.cumprod(y, axis=2)[..., :-1].astype(bool)],
            axis=2,
        )
        s, r, pos = np.nonzero(prev_all)
        qm = q[s, r, pos]
        # Sampled token: the top token with probability q_max, else a smaller probability.
        top = rng.random(len(qm)) < qm
        cols = {
            "request_id": r.astype(np.int32),
            "step": (s + lo).astype(np.int64),
            "position": (pos + 1).astype(np.int16),
            "label": y[s, r, pos].astype(np.int8),
            "q_max": qm,
            "logit_q_max": f[s, r, pos],
            "q_sampled": np.where(top, qm, rng.random(len(qm)) * np.minimum(qm, 1 - qm) + 1e-9),
            "entropy": -(qm * np.log(qm) + (1 - qm) * np.log1p(-qm)),
        }
        if head_noise is not None:
            pt = p[s, r, pos]
            z = np.log(pt) - np.log1p(-pt) + rng.normal(0, head_noise, len(s))
            cols["head_score"] = 1.0 / (1.0 + np.exp(-z))
        for key, v in cols.items():
            parts.setdefault(key, []).append(v)
    data = {key: np.concatenate(v) for key, v in parts.items()}
    n = len(data["step"])

    def const(value: str) -> pd.Categorical:
        return pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), [value])

    rid = data.pop("request_id")
    return pd.DataFrame(
        {
            "run_id": const("sim"),
            "pair_id": const("sim-pair"),
            "workload_id": const(workload),
            "request_id": pd.Categorical.from_codes(rid, [str(i) for i in range(requests)]),
            "step": data["step"],
            "position": data["position"],
            "label": data["label"],
            "q_max": data["q_max"],
            "logit_q_max": data["logit_q_max"],
            "q_sampled": data["q_sampled"],
            "entropy": data["entropy"],
            "estimator_pred": np.full(n, np.nan),
            "head_score": data.get("head_score", np.full(n, np.nan)),
            "temperature": np.ones(n),
        }
    )
