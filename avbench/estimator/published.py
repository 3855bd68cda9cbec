"""Published numbers to print beside ours (docs/published-numbers.md: the AV blog post and vLLM PR #52228).

DeepSeek-V4-Flash + DSpark, temperature 1.0, top-p 0.95, concurrency 64, AV off, about 4.5M
labeled drafts over SPEED-Bench 2k low/high entropy, GSM8K, HumanEval and MT-Bench. These are
facts for comparison only: tests never assert our data against them.
"""

from __future__ import annotations

SOURCE = "AV blog post / vLLM PR #52228 (DeepSeek-V4-Flash + DSpark, ~4.5M drafts)"

# Feature table: feature key -> {metric: value}; text values are qualitative statements.
FEATURES: dict[str, dict[str, float | str]] = {
    "logit_qmax_fitted": {"lossless": "yes", "ece": 0.0100},
    "qmax_nofit": {
        "lossless": "yes",
        "auc": 0.8259,
        "ece": 0.0736,
        "mean_pred": 0.784,
        "observed": 0.723,
    },
    "logit_qsampled_fitted": {"lossless": "no", "auc": "higher than q_max"},
    "gumbel_qsampled_fitted": {"lossless": "no", "auc": "higher than q_max"},
    "entropy_fitted": {"lossless": "yes"},
    "head": {"lossless": "yes", "auc": 0.8191},
}

ESTIMATOR_VS_HEAD = {
    "all": "estimator better in AUC and log-loss, worse in ECE",
    "excl1": "about tied in calibration",
}

PER_POSITION = (
    "head better at position 1, estimator from position 2 on (up to +0.08 AUC at the last "
    "position); both degrade past position 5 (that drafter's block size)"
)

SLOPE_RANGE_WORKLOADS = (0.51, 0.55)
R_SLOPE_ENTROPY = -0.08
R_BETA1_ENTROPY = -0.89
BETA1_TEXT = "about 0.5-0.6 on predictable workloads, below 0 on the least predictable"
SLOPE_RANGE_PAIRS = (0.45, 0.59)
