"""vLLM's float32 draft feature f = logit(q_max), as its online acceptance estimator computes it.

One definition for the two places that need vLLM's rounding rather than the exact logit: the
vLLM plugin on CPU (where the CPU build has no Triton to run vLLM's own kernels) and the
estimator lab's replays (``avbench.estimator.features``). numpy only, so a vLLM worker that
imports it loads nothing else of avbench.
"""

from __future__ import annotations

import numpy as np

F_CLAMP = 40.0  # vLLM clamps f to ±F_CLAMP

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
