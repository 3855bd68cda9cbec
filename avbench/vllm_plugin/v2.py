"""Drafts capture on Model Runner V2 (GPU, vLLM >= 0.33: ``vllm/v1/worker/gpu/``).

Written from the vLLM 0.33.0 source and guarded by attribute and signature checks; NOT run
here (the CPU build cannot start Model Runner V2). The draft loop runs inside a captured CUDA
graph, so nothing is hooked inside it: everything is read after ``sample_tokens`` returns, from
the persistent buffers the graph writes:

- ``req_states.draft_tokens[idx_mapping]``: the drafts proposed this step;
- ``speculator.draft_logits[idx_mapping]``: their pre-temperature logits (present with
  ``draft_sample_method = "probabilistic"``, which AV requires): q_max, entropy, q_sampled, and
  logit(q_max) computed like the kernel;
- ``acceptance_estimator.features`` / ``.predictions`` (AV arms): the kernel's own logit(q_max)
  and the prediction made at draft time, which replace ours;
- ``speculator.draft_token_confidence_probs`` when a DSpark confidence head is in use.

The verdict on the previous drafts comes from ``observe_verification(idx_mapping, num_sampled,
num_rejected)``: accepted = num_sampled - 1, verified (admitted by AV) = accepted + num_rejected;
scheduled drafts past that were trimmed by AV.

Host cost on the engine thread, per step with a sampled request: about 30 tensor operations
whatever K is (features of all positions at once; on AV arms the estimator's own feature is
read instead of computed, and the feature kernels are compiled on the first step, not on the
first captured one), counted by ``bench/plugin_capture.py``. Device cost: a few gathers and one
non-blocking copy into pinned memory, with an event; the host reads it on the capture thread
after the event. No device sync is added to the engine's thread. Memory beside vLLM's profile:
the gathered ``draft_logits`` (sampled requests x K x vocabulary) and a few float32
temporaries of its size, in chunks of at most ``MAX_CHUNK_ELEMENTS`` logits;
``draft_fraction`` bounds how many requests there are.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from avbench.vllm_plugin.drafts import DraftCapture
from avbench.vllm_plugin.runtime import guarded, upload_index, wrap_method

_RUNNER = "vllm.v1.worker.gpu.model_runner"
_SAMPLING_EPS = 1e-5
# Draft logits (requests x K x vocabulary) whose features are computed at once: 8 Mi elements,
# 32 MiB per float32 temporary (a step of 6 requests x K 8 x 152k vocabulary is one chunk).
MAX_CHUNK_ELEMENTS = 1 << 23


def patch(cap: DraftCapture, module_name: str, module) -> None:
    if module_name == _RUNNER:
        cls = getattr(module, "GPUModelRunner", None)
        want = {
            "execute_model": ["self", "scheduler_output"],
            "sample_tokens": ["self", "grammar_output"],
        }
        wrappers = {"execute_model": _execute_model, "sample_tokens": _sample_tokens}
    else:
        cls = getattr(module, "DraftModelSpeculator", None)
        want = {"observe_verification": ["self", "idx_mapping", "num_sampled", "num_rejected"]}
        wrappers = {"observe_verification": _observe}
    if cls is None:
        cap.disable(f"{module_name}: expected class not found")
        return
    for name, params in want.items():
        fn = cls.__dict__.get(name)
        if fn is None or list(inspect.signature(fn).parameters)[: len(params)] != params:
            cap.disable(f"{module_name}.{cls.__qualname__}.{name}: expected parameters {params}")
            return
    for name, make in wrappers.items():
        wrap_method(cap.health, cls, name, functools.partial(make, cap), "drafts-v2")


def _active(cap: DraftCapture) -> bool:
    return cap.enabled and cap.captures_here()


def _execute_model(cap: DraftCapture, orig):
    def execute_model(self, scheduler_output, *args, **kwargs):
        if _active(cap) and not kwargs.get("dummy_run", False):
            guarded(cap.health, "v2.execute_model", _before_step, cap, scheduler_output)
        return orig(self, scheduler_output, *args, **kwargs)

    return execute_model


def _before_step(cap: DraftCapture, so) -> None:
    if so.finished_req_ids:
        cap.finished(so.finished_req_ids)
    cap.v2_verdict = None
    if so.total_num_scheduled_tokens <= 0:
        cap.step_spec = {}
        return
    cap.step += 1
    cap.step_spec = {k: len(v) for k, v in (so.scheduled_spec_decode_tokens or {}).items()}


def _observe(cap: DraftCapture, orig):
    def observe_verification(self, idx_mapping, num_sampled, num_rejected, *args, **kwargs):
        if _active(cap):
            cap.v2_verdict = (num_sampled, num_rejected)
        return orig(self, idx_mapping, num_sampled, num_rejected, *args, **kwargs)

    return observe_verification


def _sample_tokens(cap: DraftCapture, orig):
    def sample_tokens(self, grammar_output, *args, **kwargs):
        state = getattr(self, "execute_model_state", None)
        batch = getattr(state, "input_batch", None)
        out = orig(self, grammar_output, *args, **kwargs)
        if batch is not None and _active(cap):
            guarded(cap.health, "v2.sample_tokens", _after_sample, cap, self, batch)
        return out

    return sample_tokens


def _after_sample(cap: DraftCapture, runner, batch) -> None:
    import torch

    from avbench.vllm_plugin.sink import HostCopy, Proposal, Verdict

    if getattr(runner, "pcp_manager", None) is not None:
        # Under prefill context parallelism sample_tokens re-gathers the batch after this hook
        # read it, so its rows would not line up with num_sampled.
        cap.disable("drafts capture on Model Runner V2 with prefill context parallelism")
        return
    spec = runner.speculator
    if not cap.primed:
        _prime(cap, runner)
    req_ids = list(batch.req_ids)
    sel = [i for i, e in enumerate(req_ids) if cap.client_id(e) is not None]
    verdict, cap.v2_verdict = cap.v2_verdict, None
    if not sel:
        return
    with torch.inference_mode():
        rows = upload_index(sel, batch.idx_mapping.device)
        idx = batch.idx_mapping.index_select(0, rows)
        eids = [req_ids[i] for i in sel]
        if verdict is not None:
            num_sampled, num_rejected = verdict
            ns = num_sampled.index_select(0, rows).long()
            acc = (ns - 1).clamp_min(0)
            adm = acc + num_rejected.index_select(0, rows).long()
            sched = [cap.step_spec.get(e, 0) for e in eids]
            copy = HostCopy({"accepted": acc, "admitted": adm})
            cap.submit(Verdict(cap.step, cap.now(), eids, sched, copy, copy))
        logits = getattr(spec, "draft_logits", None)
        if logits is None:
            cap.disable("drafts capture on Model Runner V2 needs draft_sample_method=probabilistic")
            return
        tokens = runner.req_states.draft_tokens.index_select(0, idx)  # (n, K)
        temp = runner.sampler.sampling_states.temperature.gpu.index_select(0, idx).float()
        est = getattr(spec, "acceptance_estimator", None)
        # AV: the kernel's own feature and the prediction it made replace our feature.
        data = step_features(logits, idx, tokens, temp, est is None, cap.kernels)
        if est is not None:
            data["f"] = est.features.index_select(0, idx)[:, : tokens.shape[1]]
            data["pred"] = est.predictions.index_select(0, idx)[:, : tokens.shape[1]]
        if getattr(spec, "use_confidence_head", False):
            data["head"] = spec.draft_token_confidence_probs.index_select(0, rows)
        data["tokens"], data["temperature"] = tokens, temp
        cap.submit(Proposal(cap.step, eids, cap.sampled_ids(eids), HostCopy(data)))


def _prime(cap: DraftCapture, runner) -> None:
    """Compile our feature kernels on the first step (vLLM's warmup, or a cell's warmup
    requests) rather than on the first captured step, which may fall inside a measured window.
    AV arms never run them (the estimator's own feature is used)."""
    cap.primed = True
    spec = runner.speculator
    logits = getattr(spec, "draft_logits", None)
    if logits is None or getattr(spec, "acceptance_estimator", None) is not None:
        return
    from avbench.vllm_plugin.features import logit_qmax

    temp = runner.sampler.sampling_states.temperature.gpu[:1].float()
    logit_qmax(logits[:1], temp, cap.kernels)


def step_features(logits, idx, tokens, temp, with_f: bool, kernels=None) -> dict:
    """Features of every (request, position) of one step from the drafter's per-slot logits
    buffer ``logits`` (slots, K, V) at slots ``idx``, a whole step at a time; requests go in
    chunks of at most ``MAX_CHUNK_ELEMENTS`` logits, which bounds the memory this takes beside
    what vLLM profiled (its copy of the logits and a few float32 temporaries of that size)."""
    import torch

    per = max(1, MAX_CHUNK_ELEMENTS // max(1, logits.shape[1] * logits.shape[2]))
    parts = [
        _chunk_features(
            logits, idx[s : s + per], tokens[s : s + per], temp[s : s + per], with_f, kernels
        )
        for s in range(0, idx.shape[0], per)
    ]
    if len(parts) == 1:
        return parts[0]
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


def _chunk_features(logits, idx, tokens, temp, with_f: bool, kernels) -> dict:
    from avbench.vllm_plugin.features import draft_features, sampled_prob

    ft = draft_features(logits.index_select(0, idx), temp, with_f, kernels)
    tok = tokens.clamp_min(0)  # -1 marks positions not drafted this step
    out: dict[str, Any] = {key: ft[key] for key in ("f", "q_max", "entropy") if key in ft}
    out["q_sampled"] = sampled_prob(ft["logq"], tok, temp < _SAMPLING_EPS)
    return out
