"""Draft features computed inside the server, the way vLLM's estimator computes them.

logit(q_max) is vLLM's float32 feature (per 4096-logit block max and sum of exponentials,
f = -log(max(total - 1, 0)) clamped to ±40, so above f ≈ 16 it is the clamp 40): on a GPU
vLLM's own Triton kernels compute it on the device; on CPU (where the CPU build has no Triton)
it is avbench's transcription of those kernels, ``estimator.features.vllm_logit_qmax``, which
Triton's interpreter reproduces bit for bit. One definition, no third copy.
q is the drafter's distribution after temperature scaling; temperature <= 0 (greedy) leaves the
logits unscaled, as the kernel does.
"""

from __future__ import annotations

from types import ModuleType

import torch

from avbench.vllm_plugin.runtime import ESTIMATOR_MODULE


def scaled(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """float32 logits divided by each row's temperature (rows with temperature <= 0 kept)."""
    z = logits.float()
    if temperature is None:
        return z
    t = temperature.float()
    t = torch.where(t > 0, t, torch.ones_like(t))
    return z / t[:, None]


def logit_qmax(
    logits: torch.Tensor, temperature: torch.Tensor | None, kernels: ModuleType | None = None
) -> torch.Tensor:
    """vLLM's float32 logit(q_max) of each row of unscaled ``logits`` (rows, vocab).

    CPU tensors use the numpy transcription unless ``kernels`` (vLLM's estimator module) is
    given; device tensors always use vLLM's kernels."""
    if logits.device.type == "cpu" and kernels is None:
        from avbench.estimator.features import vllm_logit_qmax

        t = 0.0 if temperature is None else temperature.float().numpy()
        return torch.from_numpy(vllm_logit_qmax(logits.float().numpy(), t))
    if kernels is None:
        import importlib

        kernels = importlib.import_module(ESTIMATOR_MODULE)
    rows, dev = logits.shape[0], logits.device
    temp = torch.zeros(rows, device=dev) if temperature is None else temperature.float()
    # A scratch estimator: its predict() runs the feature kernels into its own buffers.
    est = kernels.OnlineAcceptanceEstimator(rows, 1, dev)
    est.predict(
        logits.float().contiguous(),
        torch.arange(rows, device=dev, dtype=torch.int64),
        torch.zeros((), device=dev, dtype=torch.int64),
        torch.zeros(rows, 1, device=dev),
        temp.contiguous(),
    )
    return est.features[:, 0].clone()


def draft_features(
    logits: torch.Tensor, temperature: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """f (vLLM's float32 logit(q_max)), q_max, entropy (nats) and log q of each row."""
    logq = torch.log_softmax(scaled(logits, temperature), dim=-1)
    q = logq.exp()
    ent = -torch.where(q > 0, q * logq, torch.zeros_like(q)).sum(-1)
    return {
        "f": logit_qmax(logits, temperature).to(logits.device),
        "q_max": q.amax(-1),
        "entropy": ent.clamp_min(0.0),
        "logq": logq,
    }


def sampled_prob(
    logq: torch.Tensor, tokens: torch.Tensor, greedy: torch.Tensor | None
) -> torch.Tensor:
    """Probability of the drafted token under the distribution it was drawn from: q[token], or
    1 for rows drafted by argmax (greedy drafting or a greedy request)."""
    p = logq.gather(-1, tokens.long()[:, None])[:, 0].exp()
    if greedy is None:
        return p
    return torch.where(greedy, torch.ones_like(p), p)
