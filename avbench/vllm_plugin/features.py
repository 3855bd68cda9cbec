"""Draft features computed inside the server, the way vLLM's estimator computes them.

logit(q_max) is vLLM's float32 feature (per 4096-logit block max and sum of exponentials,
f = -log(max(total - 1, 0)) clamped to ±40, so above f ≈ 16 it is the clamp 40): on a GPU
vLLM's own Triton kernels compute it on the device; on CPU (where the CPU build has no Triton)
it is avbench's transcription of those kernels, ``avbench.vllm_feature.vllm_logit_qmax``, which
Triton's interpreter reproduces bit for bit. One definition, no third copy.
q is the drafter's distribution after temperature scaling; temperature <= 0 (greedy) leaves the
logits unscaled, as the kernel does.

Every function takes logits of one draft position per request, (n, V), or of a whole step,
(n, K, V), with one temperature per request: a step's features are computed in one pass over
all its positions (a handful of device operations, not a handful per position).
"""

from __future__ import annotations

from types import ModuleType

import torch

from avbench.vllm_feature import vllm_logit_qmax
from avbench.vllm_plugin.runtime import ESTIMATOR_MODULE


def _per_request(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` (one value per request) shaped to broadcast against ``like`` (n, ...)."""
    return t.reshape(t.shape + (1,) * (like.dim() - t.dim()))


def scaled(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """float32 logits divided by each request's temperature (temperature <= 0 kept)."""
    z = logits.float()
    if temperature is None:
        return z
    t = temperature.float()
    t = torch.where(t > 0, t, torch.ones_like(t))
    return z / _per_request(t, z)


def logit_qmax(
    logits: torch.Tensor, temperature: torch.Tensor | None, kernels: ModuleType | None = None
) -> torch.Tensor:
    """vLLM's float32 logit(q_max) of unscaled ``logits`` (n, V) or (n, K, V): shape (n,) or
    (n, K).

    CPU tensors use the numpy transcription unless ``kernels`` (vLLM's estimator module) is
    given; device tensors always use vLLM's kernels."""
    if logits.device.type == "cpu" and kernels is None:
        t = (
            0.0
            if temperature is None
            else _per_request(temperature.float(), logits[..., 0]).numpy()
        )
        return torch.from_numpy(vllm_logit_qmax(logits.float().numpy(), t))
    if kernels is None:
        import importlib

        kernels = importlib.import_module(ESTIMATOR_MODULE)
    z = logits if logits.dim() == 3 else logits[:, None, :]
    n, k, vocab = z.shape
    dev = z.device
    temp = torch.zeros(n, device=dev) if temperature is None else temperature.float()
    # A scratch estimator with one row per request: one predict() with a per-row draft step
    # runs the feature kernels over every (request, position) into its own buffers.
    est = kernels.OnlineAcceptanceEstimator(n, k, dev)
    rows = torch.arange(n, device=dev, dtype=torch.int64)
    est.predict(
        z.reshape(n * k, vocab).contiguous(),
        rows.repeat_interleave(k),
        torch.arange(k, device=dev, dtype=torch.int64).repeat(n),
        torch.zeros(n, k, device=dev),
        temp.contiguous(),
    )
    f = est.features.clone()
    return f if logits.dim() == 3 else f[:, 0]


def draft_features(
    logits: torch.Tensor,
    temperature: torch.Tensor | None,
    with_f: bool = True,
    kernels: ModuleType | None = None,
) -> dict[str, torch.Tensor]:
    """q_max, entropy (nats) and log q of each draft distribution, and f (vLLM's float32
    logit(q_max)) unless ``with_f`` is False (the estimator computed it already)."""
    logq = torch.log_softmax(scaled(logits, temperature), dim=-1)
    q = logq.exp()
    out = {"q_max": q.amax(-1), "entropy": torch.special.entr(q).sum(-1), "logq": logq}
    if with_f:
        out["f"] = logit_qmax(logits, temperature, kernels).to(logits.device)
    return out


def sampled_prob(
    logq: torch.Tensor, tokens: torch.Tensor, greedy: torch.Tensor | None
) -> torch.Tensor:
    """Probability of the drafted token under the distribution it was drawn from: q[token], or
    1 for requests drafted by argmax (greedy drafting or a greedy request)."""
    p = logq.gather(-1, tokens.long()[..., None])[..., 0].exp()
    if greedy is None:
        return p
    return torch.where(_per_request(greedy, p), torch.ones_like(p), p)
