"""Offline labeled drafts from a real target + drafter pair through transformers.

Each step drafts K tokens by sampling from the drafter's distribution q, scores them with one
target forward pass and runs standard rejection sampling. Every draft up to the first rejection
is recorded with its features and its exact expected acceptance sum_x min(p(x), q(x)).

As in vLLM's rejection sampler (the default, ``draft_top_p`` off): q is the drafter's softmax
at the request temperature only, drafts are drawn from that q, and the target's p gets
temperature and top-p (vLLM's top-k too; sweeps send none, so the trace has no top-k). With
``draft_top_p`` the drafter's distribution is cut by top-p too.

Up to `concurrency` requests are decoded as one batch: each step runs one batched drafter
forward per draft position and one batched target forward, with KV caches kept across steps
(`SpecBatch`). Rows have different lengths and accept different numbers of drafts, so a row's
left padding and its rejected drafts stay in the cache as masked holes. Drafts verified in the
same step share a step id, like drafts of one engine step in vLLM, which is what the
estimator's rounds count. Finished requests leave the batch and queued ones join it.

Features (q_max, f, entropy) come from the drafter's temperature-scaled distribution before
top-p (docs/adaptive-verification.md); q_sampled is the drawn token's probability under the
distribution it was actually sampled from, which is also the q of rejection sampling.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from avbench.errors import AvbenchError

if TYPE_CHECKING:
    from torch import Tensor

    from avbench.estimator.online import ReplayResult

F_CLAMP = 40.0


class TraceError(AvbenchError):
    """A trace cannot run (unknown pair or workload, unloadable model)."""


@dataclass(frozen=True)
class TraceConfig:
    num_draft: int = 4  # K
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    num_prompts: int = 16
    concurrency: int = 4  # requests decoded as one batch (one engine step)
    max_prompt_tokens: int = 512
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"  # model weights; probabilities are always computed in float32+
    # Cut the drafter's q by top-p as well. Off = vLLM: q is the temperature softmax only.
    draft_top_p: bool = False

    def __post_init__(self) -> None:
        if self.num_draft < 1:
            raise TraceError(f"num_draft: expected >= 1, got {self.num_draft}")
        if self.temperature < 0:
            raise TraceError(f"temperature: expected >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise TraceError(f"top_p: expected in (0, 1], got {self.top_p}")
        if self.concurrency < 1 or self.num_prompts < 1 or self.max_new_tokens < 1:
            raise TraceError("concurrency, num_prompts and max_new_tokens must be >= 1")


# ----------------------------------------------------------------------------- distributions


def scaled_logits(logits, temperature: float):
    """Temperature scaling; temperature 0 (greedy) leaves logits unscaled (docs/adaptive-verification.md)."""
    return logits.float() if temperature == 0 else logits.float() / temperature


def sampling_probs(logits, temperature: float, top_p: float):
    """The distribution tokens are actually drawn from: greedy one-hot, or softmax + top-p."""
    import torch

    z = logits.float()
    if temperature == 0:
        out = torch.zeros_like(z)
        out.scatter_(-1, z.argmax(-1, keepdim=True), 1.0)
        return out
    probs = torch.softmax(z / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sp, si = probs.sort(dim=-1, descending=True)
    # Keep the smallest prefix whose mass reaches top_p (the top token is always kept).
    drop = (sp.cumsum(-1) - sp) >= top_p
    sp = sp.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter_(-1, si, sp)
    return out / out.sum(-1, keepdim=True)


def draft_probs(logits, cfg: TraceConfig):
    """The drafter's q: what drafts are drawn from and what rejection sampling divides by."""
    return sampling_probs(logits, cfg.temperature, cfg.top_p if cfg.draft_top_p else 1.0)


def expected_acceptance(p, q):
    """Probability that rejection sampling accepts a draft drawn from q against p:
    sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x)), over the last axis (torch or numpy)."""
    import torch

    if isinstance(p, torch.Tensor):
        return torch.minimum(p, q).sum(-1)
    return np.minimum(p, q).sum(-1)


def draft_features(logits, temperature: float) -> dict[str, Tensor]:
    """q_max, f = m* - logsumexp(others) (clamped), entropy of the scaled distribution."""
    import torch

    z = scaled_logits(logits, temperature).double()
    m, idx = z.max(-1)
    others = z.scatter(-1, idx[..., None], float("-inf"))
    f = (m - torch.logsumexp(others, -1)).clamp(-F_CLAMP, F_CLAMP)
    logq = torch.log_softmax(z, -1)
    q = logq.exp()
    ent = -(torch.where(q > 0, q * logq, torch.zeros_like(q))).sum(-1)
    return {"q_max": q.max(-1).values, "f": f, "entropy": ent.clamp_min(0.0)}


# ----------------------------------------------------------------------------- one step


def _device(model):
    return next(model.parameters()).device


def _crop_to(cache, length: int) -> None:
    if cache is None:
        return
    cur = cache.get_seq_length()
    if cur <= length:
        return
    # A negative argument removes that many tokens in transformers 4.x and 5.x alike.
    cache.crop(-(cur - length))


def _run(model, new_ids, cache, keep: int = 1):
    """Run the model on ``new_ids`` after what ``cache`` holds; returns the logits of the last
    ``keep`` positions and the cache."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=new_ids, past_key_values=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[:, -keep:], out.past_key_values


def _forward(model, ids, cache, keep: int = 1):
    """Run the model on the tokens of ``ids`` the cache does not hold yet (the prompt's logits
    are never needed)."""
    from transformers import DynamicCache

    if cache is None:
        cache = DynamicCache()
    return _run(model, ids[:, cache.get_seq_length() :], cache, keep)


def prefix_caches(target, drafter, ids, rows: int) -> tuple:
    """(target, drafter) caches of ``ids`` (1, L) minus its last token, repeated ``rows`` times:
    many runs from one context share its prefill."""
    caches = []
    for model in (target, drafter):
        _, cache = _forward(model, ids[:, :-1], None)
        cache.batch_repeat_interleave(rows)
        caches.append(cache)
    return tuple(caches)


@dataclass
class StepResult:
    drafts: Tensor  # LongTensor (B, K)
    n_accepted: Tensor  # LongTensor (B,)
    final: Tensor  # LongTensor (B,) the resampled or bonus token
    q_max: Tensor  # (B, K) float64
    f: Tensor
    entropy: Tensor
    q_sampled: Tensor
    expected: Tensor  # (B, K) sum_x min(p, q) of each draft position


def spec_step(
    target, drafter, ids, cfg: TraceConfig, gen, caches: tuple | None = None
) -> tuple[StepResult, tuple]:
    """One speculative decoding step on a batch of equal-length sequences ``ids`` (B, L).

    Caches (target, drafter) may cover any prefix of ``ids``; they come back covering the
    committed prefix of a single-row batch (callers with B > 1 must drop them).
    """
    import torch

    k = cfg.num_draft
    t_cache, d_cache = caches if caches is not None else (None, None)
    logits, d_cache = _forward(drafter, ids, d_cache)
    drafts, q_all, feats = draw_drafts(
        logits[:, -1], lambda d: _run(drafter, d, d_cache)[0][:, -1], cfg, gen
    )
    t_logits, t_cache = _forward(target, torch.cat([ids, drafts], dim=1), t_cache, keep=k + 1)
    res = verify_drafts(drafts, q_all, feats, t_logits, cfg, gen)
    if ids.shape[0] == 1:
        base = ids.shape[1]
        a = int(res.n_accepted[0])
        _crop_to(t_cache, base + a)
        _crop_to(d_cache, base + min(a, k - 1))
    return res, (t_cache, d_cache)


def draw_drafts(
    logits, next_logits: Callable[[Tensor], Tensor], cfg: TraceConfig, gen
) -> tuple[Tensor, Tensor, list[dict[str, Tensor]]]:
    """K drafts per row sampled from the drafter's q: ``logits`` (B, V) give the first,
    ``next_logits(d)`` the drafter's logits after drafts ``d`` (B, 1). Returns the drafts
    (B, K), their q (B, K, V) and each position's features."""
    import torch

    drafts, qdist, feats = [], [], []
    for i in range(cfg.num_draft):
        feats.append(draft_features(logits, cfg.temperature))
        q = draft_probs(logits, cfg)
        d = torch.multinomial(q, 1, generator=gen)
        drafts.append(d)
        qdist.append(q)
        if i < cfg.num_draft - 1:
            logits = next_logits(d)
    return torch.cat(drafts, dim=1), torch.stack(qdist, dim=1), feats


def verify_drafts(
    drafts, q_all, feats: list[dict[str, Tensor]], t_logits, cfg: TraceConfig, gen
) -> StepResult:
    """Rejection sampling of ``drafts`` (B, K) drawn from ``q_all`` (B, K, V) against the
    target's logits ``t_logits`` (B, K+1, V) at the drafts' positions and the bonus one."""
    import torch

    k = cfg.num_draft
    p_all = sampling_probs(t_logits, cfg.temperature, cfg.top_p)  # (B, K+1, V)
    # q's vocabulary may be padded differently from p's; compare on the shared prefix.
    v = min(p_all.shape[-1], q_all.shape[-1])
    p_all, q_all = p_all[..., :v], q_all[..., :v]
    p_d = p_all[:, :k].gather(-1, drafts[..., None])[..., 0]
    q_d = q_all.gather(-1, drafts[..., None])[..., 0]
    u = torch.rand(p_d.shape, generator=gen, dtype=p_d.dtype, device=p_d.device)
    ok = u * q_d < p_d  # u < min(1, p/q) without dividing
    n_acc = ok.long().cumprod(dim=1).sum(dim=1)  # (B,)
    # Resample at the first rejection from norm(max(0, p - q)); after K acceptances the bonus
    # token comes from p_K, i.e. the same formula with q = 0.
    q_ext = torch.cat([q_all, torch.zeros_like(q_all[:, :1])], dim=1)
    rows = torch.arange(drafts.shape[0], device=drafts.device)
    resid = (p_all[rows, n_acc] - q_ext[rows, n_acc]).clamp_min(0.0)
    z = resid.sum(-1, keepdim=True)
    # p == q leaves no residual mass; the draft is then always accepted, but keep it sane.
    resid = torch.where(z > 0, resid / z.clamp_min(1e-30), p_all[rows, n_acc])
    final = torch.multinomial(resid, 1, generator=gen)[:, 0]
    return StepResult(
        drafts,
        n_acc,
        final,
        torch.stack([x["q_max"] for x in feats], 1),
        torch.stack([x["f"] for x in feats], 1),
        torch.stack([x["entropy"] for x in feats], 1),
        q_d.double(),
        expected_acceptance(p_all[:, :k].double(), q_all.double()),
    )


def emitted_tokens(res: StepResult, row: int) -> list[int]:
    a = int(res.n_accepted[row])
    return [int(t) for t in res.drafts[row, :a]] + [int(res.final[row])]


# ----------------------------------------------------------------------------- batched decoding


def _kv(cache) -> list[tuple[Tensor, Tensor]]:
    """Per layer (keys, values), each (B, heads, slots, head_dim); [] for a cache with no slots."""
    if cache.get_seq_length() == 0:
        return []
    return [(layer.keys, layer.values) for layer in cache.layers]


def _pad_slots(t, width: int):
    """Left-pad the slot axis (dim -2 of K/V, -1 of a mask) of ``t`` with zeros to ``width``."""
    import torch.nn.functional as F

    if t.dim() == 2:
        return F.pad(t, (width - t.shape[-1], 0))
    return F.pad(t, (0, 0, width - t.shape[-2], 0))


def _slotless(like: list[tuple[Tensor, Tensor]], rows: int) -> list[tuple[Tensor, Tensor]]:
    """Empty K/V of ``rows`` rows shaped like the layers ``like``."""

    def none(t: Tensor) -> Tensor:
        return t.new_zeros(rows, t.shape[1], 0, t.shape[3])

    return [(none(k), none(v)) for k, v in like]


@dataclass
class BatchCache:
    """One model's KV cache of a batch of rows of different lengths.

    Every forward appends the same number of slots to every row, so a row's left padding and
    its rejected drafts stay in the cache as holes (``valid`` False): the cache can only be cut
    for all rows at once. Position ids count a row's valid slots only.
    """

    model: Any
    cache: Any  # transformers DynamicCache
    valid: Tensor  # bool (B, slots)

    @classmethod
    def empty(cls, model, rows: int) -> BatchCache:
        import torch
        from transformers import DynamicCache

        return cls(
            model, DynamicCache(), torch.zeros(rows, 0, dtype=torch.bool, device=_device(model))
        )

    def forward(self, ids, new, keep: int = 1):
        """Run ``ids`` (B, n), real where ``new`` (B, n) is True; rows are left-padded so the last
        column is always real. Returns the logits (B, keep, V) of the last ``keep`` columns.

        A padding column of a row with no valid slot yet attends to nothing; torch's attention
        still gives it finite values, not NaN (tests/estimator/test_trace_batch.py checks it)."""
        import torch

        pos = self.valid.sum(1, keepdim=True) + new.long().cumsum(1) - 1
        mask = torch.cat([self.valid, new], dim=1)
        with torch.inference_mode():
            out = self.model(
                input_ids=ids,
                attention_mask=mask.long(),
                # Padding columns before a row's first token would get -1.
                position_ids=pos.clamp_min(0),
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=keep,
            )
        self.valid = mask
        return out.logits[:, -keep:]

    def keep_last(self, n: int, kept) -> None:
        """Of the last ``n`` slots, row b keeps the first ``kept[b]``; the rest become holes."""
        import torch

        if n == 0:
            return
        cols = torch.arange(n, device=self.valid.device)
        self.valid[:, -n:] &= cols[None, :] < kept[:, None]

    def select(self, rows) -> None:
        """Keep the rows ``rows`` (LongTensor), and drop the slots no remaining row uses."""
        from transformers import DynamicCache

        valid = self.valid[rows]
        used = valid.any(0)
        kv = [(k[rows][:, :, used], v[rows][:, :, used]) for k, v in _kv(self.cache)]
        self.cache = DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()
        self.valid = valid[:, used]

    def extend(self, other: BatchCache) -> None:
        """Append ``other``'s rows; the side with fewer slots is left-padded with zero K/V in
        masked slots (zeros, as a NaN there would still poison attention: 0 x NaN)."""
        import torch
        from transformers import DynamicCache

        width = max(self.valid.shape[1], other.valid.shape[1])
        mine, theirs = _kv(self.cache), _kv(other.cache)
        if mine or theirs:
            mine = mine or _slotless(theirs, self.valid.shape[0])
            theirs = theirs or _slotless(mine, other.valid.shape[0])
            pad = partial(_pad_slots, width=width)
            self.cache = DynamicCache(
                ddp_cache_data=[
                    (torch.cat([pad(ka), pad(kb)]), torch.cat([pad(va), pad(vb)]))
                    for (ka, va), (kb, vb) in zip(mine, theirs, strict=True)
                ]
            )
        self.valid = torch.cat([_pad_slots(self.valid, width), _pad_slots(other.valid, width)])


def _left_pad(segments: Sequence[Sequence[int]], device) -> tuple[Tensor, Tensor]:
    """(ids, real) (B, longest): each row's tokens right-aligned, padding id 0 where not real."""
    import torch

    width = max(len(s) for s in segments)
    ids = torch.zeros(len(segments), width, dtype=torch.long)
    real = torch.zeros(len(segments), width, dtype=torch.bool)
    for i, seg in enumerate(segments):
        if seg:
            ids[i, width - len(seg) :] = torch.tensor(list(seg))
            real[i, width - len(seg) :] = True
    return ids.to(device), real.to(device)


@dataclass
class BatchRow:
    """A request in the batch: its committed tokens and what the drafter has not seen yet (the
    target has always seen all but the last committed token)."""

    rid: str
    tokens: list[int]
    prompt_len: int
    draft_pending: list[int]


@dataclass
class SpecBatch:
    """Speculative decoding of several requests as one batch: per step one batched drafter
    forward per draft position and one batched target forward, caches kept across steps."""

    target: BatchCache
    drafter: BatchCache
    rows: list[BatchRow]

    @classmethod
    def empty(cls, models: Models) -> SpecBatch:
        return cls(BatchCache.empty(models.target, 0), BatchCache.empty(models.drafter, 0), [])

    def admit(self, rid: str, prompt: Sequence[int]) -> None:
        """Add a request: its prompt but the last token prefilled on its own, then grafted."""
        import torch

        if not prompt:
            raise TraceError(f"{rid}: empty prompt")
        prefix = torch.tensor([list(prompt[:-1])], device=self.target.valid.device)
        for side in (self.target, self.drafter):
            own = BatchCache.empty(side.model, 1)
            if len(prompt) > 1:
                own.forward(prefix, torch.ones_like(prefix, dtype=torch.bool))
            side.extend(own)
        self.rows.append(BatchRow(rid, list(prompt), len(prompt), [prompt[-1]]))

    def step(self, cfg: TraceConfig, gen) -> StepResult:
        """One speculative step of every row; each row's emitted tokens are committed."""
        import torch

        k, dev = cfg.num_draft, self.target.valid.device
        ids, real = _left_pad([r.draft_pending for r in self.rows], dev)
        one = torch.ones(len(self.rows), 1, dtype=torch.bool, device=dev)
        drafts, q_all, feats = draw_drafts(
            self.drafter.forward(ids, real)[:, -1],
            lambda d: self.drafter.forward(d, one)[:, -1],
            cfg,
            gen,
        )
        last = torch.tensor([[r.tokens[-1]] for r in self.rows], device=dev)
        t_ids = torch.cat([last, drafts], dim=1)
        t_logits = self.target.forward(t_ids, one.expand(-1, k + 1), keep=k + 1)
        res = verify_drafts(drafts, q_all, feats, t_logits, cfg, gen)
        self.target.keep_last(k, res.n_accepted)
        self.drafter.keep_last(k - 1, res.n_accepted.clamp(max=k - 1))
        for i, r in enumerate(self.rows):
            new = emitted_tokens(res, i)
            # The drafter never ran its K-th draft: when accepted, it goes in with the final one.
            r.draft_pending = new[-2:] if len(new) > k else new[-1:]
            r.tokens += new
        return res

    def retire(self, keep: Sequence[int]) -> None:
        """Keep only the rows at indices ``keep``."""
        import torch

        idx = torch.tensor(list(keep), dtype=torch.long, device=self.target.valid.device)
        for side in (self.target, self.drafter):
            side.select(idx)
        self.rows = [self.rows[i] for i in keep]


# ----------------------------------------------------------------------------- trace loop


_LABEL_COLUMNS = ("request_id", "step", "position", "label", "q_max", "f", "q_sampled", "entropy",
                  "expected")  # fmt: skip


class Models(NamedTuple):
    """The traced pair's loaded models (transformers causal LMs on one device)."""

    target: Any
    drafter: Any


def trace_pair(
    models: Models,
    prompts: Sequence[Sequence[int]],
    cfg: TraceConfig,
    ids: dict[str, str],
    eos_token_ids: Sequence[int] = (),
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Labeled drafts (schema of `drafts.DRAFT_SCHEMA`) for ``prompts`` (token id lists).

    ``ids`` gives run_id, pair_id and workload_id. The estimator prediction column is filled
    by `run_trace` (a replay over the finished stream), here left null.
    """
    import torch

    if not prompts:
        raise TraceError("no prompts to trace")
    gen = torch.Generator(device=_device(models.target)).manual_seed(cfg.seed)
    queue = deque(
        (f"{ids['workload_id']}/{i}", list(p)[-cfg.max_prompt_tokens :])
        for i, p in enumerate(prompts)
    )
    cols: dict[str, list] = {k: [] for k in _LABEL_COLUMNS}
    eos = set(int(e) for e in eos_token_ids)
    batch = SpecBatch.empty(models)
    step = 0
    t0 = time.monotonic()
    while queue or batch.rows:
        while queue and len(batch.rows) < cfg.concurrency:
            batch.admit(*queue.popleft())
        res = batch.step(cfg, gen)
        labels = _Labels(cols, step)
        keep = []
        for i, r in enumerate(batch.rows):
            labels.add(r.rid, res, i, cfg.num_draft)
            ended = any(t in eos for t in emitted_tokens(res, i))
            if not ended and len(r.tokens) - r.prompt_len < cfg.max_new_tokens:
                keep.append(i)
        if len(keep) < len(batch.rows):
            batch.retire(keep)
        step += 1
        if progress and step % 50 == 0:
            progress(
                f"{ids['workload_id']}: step {step}, {len(cols['step'])} labeled drafts, {time.monotonic() - t0:.0f}s"
            )
    return _drafts_frame(cols, ids, cfg.temperature)


@dataclass
class _Labels:
    """Where one engine step's labeled drafts go."""

    cols: dict[str, list]
    step: int

    def add(self, rid: str, res: StepResult, row: int, num_draft: int) -> None:
        """Positions 1..a accepted, position a+1 rejected (when within K): K labels at most."""
        n_accepted = int(res.n_accepted[row])
        n_lab = min(n_accepted + 1, num_draft)
        self.cols["request_id"] += [rid] * n_lab
        self.cols["step"] += [self.step] * n_lab
        self.cols["position"] += list(range(1, n_lab + 1))
        self.cols["label"] += [1] * n_accepted + [0] * (n_lab - n_accepted)
        for key in ("q_max", "f", "q_sampled", "entropy", "expected"):
            self.cols[key] += getattr(res, key)[row, :n_lab].tolist()


def _drafts_frame(cols: dict[str, list], ids: dict[str, str], temperature: float) -> pd.DataFrame:
    n = len(cols["step"])
    return pd.DataFrame(
        {
            "run_id": ids["run_id"],
            "pair_id": ids["pair_id"],
            "workload_id": ids["workload_id"],
            "request_id": cols["request_id"],
            "step": np.asarray(cols["step"], dtype=np.int64),
            "position": np.asarray(cols["position"], dtype=np.int16),
            "label": np.asarray(cols["label"], dtype=np.int8),
            "q_max": np.asarray(cols["q_max"], dtype=np.float64),
            "logit_q_max": np.asarray(cols["f"], dtype=np.float64),
            "q_sampled": np.asarray(cols["q_sampled"], dtype=np.float64),
            "entropy": np.asarray(cols["entropy"], dtype=np.float64),
            "estimator_pred": np.full(n, np.nan),
            "head_score": np.full(n, np.nan),
            "temperature": np.full(n, float(temperature)),
            "expected_accept": np.asarray(cols["expected"], dtype=np.float64),
        }
    )


# ----------------------------------------------------------------------------- distribution test


@dataclass(frozen=True)
class ChiSquare:
    statistic: float
    dof: int
    p_value: float
    alpha: float
    n: int

    @property
    def passed(self) -> bool:
        return self.p_value >= self.alpha


def chi_square(
    counts: np.ndarray, probs: np.ndarray, alpha: float = 0.01, min_expected: float = 5.0
) -> ChiSquare:
    """Pearson goodness of fit; categories with expected count < ``min_expected`` are pooled."""
    from scipy.stats import chi2

    counts = np.asarray(counts, dtype=np.float64)
    n = counts.sum()
    exp = np.asarray(probs, dtype=np.float64) * n
    if np.any((exp == 0) & (counts > 0)):
        return ChiSquare(math.inf, 0, 0.0, alpha, int(n))  # a token the target never emits
    big = exp >= min_expected
    obs_b, exp_b = list(counts[big]), list(exp[big])
    if (~big).any():
        obs_b.append(counts[~big].sum())
        exp_b.append(exp[~big].sum())
    obs_a, exp_a = np.array(obs_b), np.array(exp_b)
    keep = exp_a > 0
    stat = float(np.sum((obs_a[keep] - exp_a[keep]) ** 2 / exp_a[keep]))
    dof = int(keep.sum()) - 1
    return ChiSquare(stat, dof, float(chi2.sf(stat, dof)) if dof > 0 else 1.0, alpha, int(n))


@dataclass(frozen=True)
class DistributionTest:
    first: ChiSquare  # first emitted token vs p(. | context)
    second: ChiSquare  # second emitted token vs sum_t p(t | ctx) p(. | ctx, t)
    mean_accepted: float  # drafts accepted in the first step (the test exercises acceptance)

    @property
    def passed(self) -> bool:
        return self.first.passed and self.second.passed


def target_marginals(
    target, context: Sequence[int], cfg: TraceConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Exact distributions of the first and second generated token under the target alone."""
    import torch

    dev = _device(target)
    ctx = torch.tensor([list(context)], device=dev)
    logits, cache = _forward(target, ctx, None)
    p1 = sampling_probs(logits[:, -1], cfg.temperature, cfg.top_p)[0]
    v = p1.shape[-1]
    cache.batch_repeat_interleave(v)
    batch = torch.cat([ctx.repeat(v, 1), torch.arange(v, device=dev)[:, None]], dim=1)
    logits2, _ = _forward(target, batch, cache)
    p2_given = sampling_probs(logits2[:, -1], cfg.temperature, cfg.top_p)
    p2 = (p1[:, None] * p2_given).sum(0)
    return p1.double().cpu().numpy(), p2.double().cpu().numpy()


def sample_two_tokens(
    target, drafter, context: Sequence[int], cfg: TraceConfig, trials: int, chunk: int = 1024
) -> tuple[np.ndarray, np.ndarray, float]:
    """First two tokens emitted by speculative decoding in ``trials`` independent runs.

    Runs go in batches of ``chunk`` rows: (rows x K x vocabulary) probability tensors of a
    real vocabulary would not fit in memory all at once."""
    import torch

    dev = _device(target)
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)
    firsts, seconds, accepted = [], [], []
    for lo in range(0, trials, chunk):
        n = min(chunk, trials - lo)
        ctx = torch.tensor([list(context)], device=dev)
        ids = ctx.repeat(n, 1)
        res, _ = spec_step(target, drafter, ids, cfg, gen, prefix_caches(target, drafter, ctx, n))
        acc = res.n_accepted
        first = torch.where(acc >= 1, res.drafts[:, 0], res.final)
        second = torch.full_like(first, -1)
        has2 = acc >= 2
        second[has2] = res.drafts[has2, 1]
        two = acc == 1  # emitted exactly two tokens: draft 1 and the final token
        second[two] = res.final[two]
        # Runs that emitted one token continue with a fresh step from context + that token:
        # all those sequences have the same length, so they go as one batch.
        need = (second < 0).nonzero()[:, 0]
        if len(need):
            sub = torch.cat([ids[need], first[need][:, None]], dim=1)
            # The shared context is cached; each row's own first token goes in with the tail.
            caches = prefix_caches(target, drafter, torch.cat([ctx, ctx[:, :1]], dim=1), len(need))
            r2, _ = spec_step(target, drafter, sub, cfg, gen, caches)
            second[need] = torch.where(r2.n_accepted >= 1, r2.drafts[:, 0], r2.final)
        firsts.append(first.cpu().numpy())
        seconds.append(second.cpu().numpy())
        accepted.append(acc.double().cpu().numpy())
    return np.concatenate(firsts), np.concatenate(seconds), float(np.concatenate(accepted).mean())


def distribution_test(
    target,
    drafter,
    context: Sequence[int],
    cfg: TraceConfig,
    trials: int = 20000,
    alpha: float = 0.01,
) -> DistributionTest:
    """Chi-square tests (level ``alpha``) that emitted tokens follow the target distribution."""
    p1, p2 = target_marginals(target, context, cfg)
    t1, t2, mean_acc = sample_two_tokens(target, drafter, context, cfg, trials)
    v = len(p1)
    c1 = np.bincount(t1, minlength=v)[:v]
    c2 = np.bincount(t2, minlength=v)[:v]
    return DistributionTest(chi_square(c1, p1, alpha), chi_square(c2, p2, alpha), mean_acc)


# ----------------------------------------------------------------------------- models and prompts


@dataclass(frozen=True)
class PairPaths:
    pair_id: str
    target: Path
    drafter: Path


def resolve_pair(
    pair: str | None,
    target: Path | None = None,
    drafter: Path | None = None,
    suites: Path | None = None,
) -> PairPaths:
    """Explicit model dirs when given (``pair`` is then a label), else the suite's pair."""
    if target is not None or drafter is not None:
        if target is None or drafter is None:
            raise TraceError("--target and --drafter must be given together")
        for part, p in (("target", target), ("drafter", drafter)):
            # A path that does not exist locally may be a hub id ("org/name", needs the hub cache).
            hub_id = not Path(p).exists() and str(p).count("/") == 1 and not str(p).startswith(".")
            if not hub_id and not (Path(p) / "config.json").is_file():
                raise TraceError(
                    f"{p}: no config.json; expected a Hugging Face model dir for the {part}"
                )
        return PairPaths(
            pair or f"{Path(target).name}+{Path(drafter).name}", Path(target), Path(drafter)
        )
    return _suite_pair(pair or "tiny-cpu", suites)


def _suite_pair(name: str, suites: Path | None) -> PairPaths:
    """The models of pair ``name`` of the suite (pairs.toml), as vLLM would be given them."""
    from avbench.inputs.suite import load_suite

    try:
        found = load_suite(suites).pair(name)
    except AvbenchError as exc:
        raise TraceError(
            f"--pair {name!r}: {exc}; or give --target and --drafter model dirs"
        ) from None
    if found.drafter is None:
        raise TraceError(
            f"--pair {name!r}: its {found.method} drafter is inside the target; the trace needs "
            "a separate drafter model (give --target and --drafter)"
        )
    target, drafter = found.resolve(found.target), found.resolve(found.drafter)
    assert target is not None and drafter is not None
    return PairPaths(name, Path(target), Path(drafter))


def load_model(path: Path, device: str = "cpu", dtype: str = "float32"):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: cannot load a causal LM ({str(exc).splitlines()[0]})") from None
    return model.to(device).eval()  # type: ignore[arg-type]  # transformers types `to` as unbound


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: cannot load a tokenizer ({str(exc).splitlines()[0]})") from None


def encode_prompts(tokenizer, conversations: Sequence[list[dict[str, str]]]) -> list[list[int]]:
    """Chat template when the tokenizer has one (as vLLM's chat endpoint would), else the
    messages' text joined."""
    out = []
    for msgs in conversations:
        if getattr(tokenizer, "chat_template", None):
            rendered = tokenizer.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=False
            )
            out.append(tokenizer(rendered, add_special_tokens=False)["input_ids"])
        else:
            out.append(tokenizer("\n\n".join(m["content"] for m in msgs))["input_ids"])
    return out


@dataclass
class TraceOutput:
    drafts_path: Path
    estimator_path: Path
    rows: int
    acceptance: float
    omega: float
    beta1: float
    seconds: float
    extra: dict = field(default_factory=dict)


def estimator_log_frame(ids: dict[str, str], result) -> pd.DataFrame:
    rows = []
    for r in result.refits:
        for k, b in enumerate(r.beta):
            rows.append(
                {
                    **ids,
                    "round": r.round,
                    "end_step": r.end_step,
                    "position": k + 1,
                    "omega": r.omega,
                    "beta": float(b),
                    "n": int(r.n[k]),
                    "moved": r.moved,
                    "slope_masked": r.slope_masked or None,
                }
            )
    cols = [
        "run_id",
        "pair_id",
        "workload_id",
        "round",
        "end_step",
        "position",
        "omega",
        "beta",
        "n",
        "moved",
        "slope_masked",
    ]
    return pd.DataFrame(rows, columns=cols)


def finish_trace(
    df: pd.DataFrame, out_dir: Path, ids: dict[str, str], k: int
) -> tuple[Path, Path, ReplayResult]:
    """Fill the estimator prediction by replay and write the drafts and the estimator log."""
    from avbench.estimator.drafts import (
        DRAFTS_SUFFIX,
        ESTIMATOR_SUFFIX,
        write_drafts,
        write_estimator_log,
    )
    from avbench.estimator.online import EstimatorConfig, replay

    res = replay(
        df["step"].to_numpy(),
        df["position"].to_numpy().astype(np.int64) - 1,
        df["label"].to_numpy(),
        df["logit_q_max"].to_numpy(),
        EstimatorConfig(num_positions=k),
    )
    df = df.assign(estimator_pred=res.pred)
    stem = f"{ids['pair_id']}__{ids['workload_id']}"
    dp = write_drafts(df, out_dir / f"{stem}{DRAFTS_SUFFIX}")
    ep = write_estimator_log(estimator_log_frame(ids, res), out_dir / f"{stem}{ESTIMATOR_SUFFIX}")
    return dp, ep, res


def run_trace(
    pair: PairPaths,
    workload: str,
    out_dir: Path,
    cfg: TraceConfig,
    run_id: str,
    progress: Callable[[str], None] | None = None,
) -> TraceOutput:
    """Trace one (pair, workload) into ``out_dir`` (drafts, estimator log, manifest)."""
    import torch

    from avbench.estimator.prompts import load_prompts

    torch.manual_seed(cfg.seed)
    t0 = time.monotonic()
    tok = load_tokenizer(pair.target)
    texts = load_prompts(workload, cfg.num_prompts, pair.target)
    target, drafter = (
        load_model(pair.target, cfg.device, cfg.dtype),
        load_model(pair.drafter, cfg.device, cfg.dtype),
    )
    prompts = encode_prompts(tok, texts)
    eos = tok.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    ids = {"run_id": run_id, "pair_id": pair.pair_id, "workload_id": workload}
    df = trace_pair(Models(target, drafter), prompts, cfg, ids, eos_ids, progress)
    dp, ep, res = finish_trace(df, out_dir, ids, cfg.num_draft)
    secs = time.monotonic() - t0
    manifest = {
        **ids,
        "target": str(pair.target),
        "drafter": str(pair.drafter),
        "config": asdict(cfg),
        "rows": len(df),
        "seconds": round(secs, 2),
    }
    (out_dir / f"{pair.pair_id}__{workload}.trace.json").write_text(json.dumps(manifest, indent=2))
    return TraceOutput(
        dp,
        ep,
        len(df),
        float(df["label"].mean()) if len(df) else float("nan"),
        res.omega,
        float(res.beta[0]) if len(res.beta) else float("nan"),
        secs,
    )


def check_pair(
    pair: PairPaths, workload: str, cfg: TraceConfig, trials: int = 20000, alpha: float = 0.01
) -> DistributionTest:
    """Distribution test on a real pair, context = the workload's first prompt (last 64 tokens)."""
    from avbench.estimator.prompts import load_prompts

    tok = load_tokenizer(pair.target)
    context = encode_prompts(tok, load_prompts(workload, 1, pair.target))[0][-64:]
    target, drafter = (
        load_model(pair.target, cfg.device, cfg.dtype),
        load_model(pair.drafter, cfg.device, cfg.dtype),
    )
    return distribution_test(target, drafter, context, cfg, trials, alpha)


def render_distribution_test(res: DistributionTest) -> str:
    def one(name: str, c: ChiSquare) -> str:
        verdict = "consistent with the target" if c.passed else "REJECTED: differs from the target"
        return (
            f"  {name}: chi2 = {c.statistic:.1f}, dof = {c.dof}, p = {c.p_value:.3g} "
            f"(alpha = {c.alpha}) over {c.n} runs -> {verdict}"
        )

    return "\n".join(
        [
            "Emitted tokens vs the target distribution (Pearson chi-square, expected < 5 pooled):",
            one("first token ", res.first),
            one("second token", res.second),
            f"  drafts accepted in the first step: {res.mean_accepted:.3f} on average",
        ]
    )
