"""Draft features computed inside the server, on the device, the way vLLM computes them.

logit(q_max) follows vLLM's feature kernel (``acceptance_estimator.py``: per-block max and sum
of exponentials over blocks of 4096 vocabulary entries, in float32, then
f = -log(max(total - 1, 0)) clamped to ±40), so above f ≈ 16 it returns the clamp 40 and
between 10 and 15 it is off from the exact value by up to ~0.25, as vLLM's is (docs/adaptive-verification.md).
q is the drafter's distribution after temperature scaling; temperature <= 0 (greedy) leaves the
logits unscaled, as the kernel does.
"""

from __future__ import annotations

import math

import torch

VOCAB_BLOCK = 4096  # the kernel's VOCAB_BLOCK_SIZE
MAX_LOG_ODDS = 40.0


def scaled(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """float32 logits divided by each row's temperature (rows with temperature <= 0 kept)."""
    z = logits.float()
    if temperature is None:
        return z
    t = temperature.float()
    t = torch.where(t > 0, t, torch.ones_like(t))
    return z / t[:, None]


def logit_qmax_kernel(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(f, total) of scaled float32 logits ``z`` (rows, vocab), as the kernel reduces them."""
    rows, vocab = z.shape
    nb = math.ceil(vocab / VOCAB_BLOCK)
    pad = nb * VOCAB_BLOCK - vocab
    if pad:
        z = torch.nn.functional.pad(z, (0, pad), value=float("-inf"))
    zb = z.view(rows, nb, VOCAB_BLOCK)
    bmax = zb.amax(dim=-1)
    finite = bmax > float("-inf")
    bsum = torch.where(
        finite, torch.exp(zb - bmax.masked_fill(~finite, 0.0)[..., None]).sum(-1), 0.0
    )
    gmax = bmax.amax(dim=-1, keepdim=True)
    total = torch.where(finite, bsum * torch.exp(bmax - gmax), 0.0).sum(-1)
    f = -torch.log(torch.clamp(total - 1.0, min=0.0))
    return f.clamp(-MAX_LOG_ODDS, MAX_LOG_ODDS), total


def draft_features(
    logits: torch.Tensor, temperature: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """f (kernel float32), q_max, entropy (nats) of each row's scaled distribution."""
    z = scaled(logits, temperature)
    f, total = logit_qmax_kernel(z)
    logq = torch.log_softmax(z, dim=-1)
    q = logq.exp()
    ent = -torch.where(q > 0, q * logq, torch.zeros_like(q)).sum(-1)
    return {"f": f, "q_max": 1.0 / total, "entropy": ent.clamp_min(0.0), "logq": logq}


def sampled_prob(
    logq: torch.Tensor, tokens: torch.Tensor, greedy: torch.Tensor | None
) -> torch.Tensor:
    """Probability of the drafted token under the distribution it was drawn from: q[token], or
    1 for rows drafted by argmax (greedy drafting or a greedy request)."""
    p = logq.gather(-1, tokens.long()[:, None])[:, 0].exp()
    if greedy is None:
        return p
    return torch.where(greedy, torch.ones_like(p), p)
