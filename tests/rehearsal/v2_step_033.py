"""Run by test_v2_capture_033.py in a process of its own, with vLLM 0.33.0's source first on
the path and ``AVBENCH_CAPTURE_DIR`` set: scripted engine steps through the plugin's V2 hooks
on vLLM 0.33's own classes, on CPU. Prints one JSON line of what it saw.

Real 0.33 code: the plugin's post-import hooks on ``GPUModelRunner`` and
``DraftModelSpeculator`` (signature checks included), ``SchedulerOutput``, ``RequestState`` and
``SamplingStates`` with their buffers, ``get_num_sampled_and_rejected`` (num_rejected from the
logits AV admitted), ``DraftModelSpeculator.observe_verification`` and
``OnlineAcceptanceEstimator`` (``step``/``predict``, kernels in Triton's interpreter).
Not buildable on CPU, so stood in for: ``GPUModelRunner`` itself (it needs a GPU and a model;
the test calls the plugin's hook bodies with an object holding the real buffers), the
speculator's ``__init__``/``propose`` (its buffers are made as ``__init__`` makes them and
written as ``propose`` writes them), and pinned memory (vLLM's own non-pinned fallback).
"""

import json
import sys
import time
from types import SimpleNamespace

import torch
import triton
import triton.language as tl
import triton.language.extra.libdevice as tldevice
import vllm.triton_utils as tu

# 0.33's Triton gate finds no GPU driver here and hands its modules a placeholder; give them
# the real Triton instead, which runs their kernels in its interpreter (TRITON_INTERPRET=1).
tu.HAS_TRITON, tu.triton, tu.tl, tu.tldevice = True, triton, tl, tldevice

import avbench.vllm_plugin as plugin  # noqa: E402

plugin.register()  # what vLLM does with the entry point in each process it starts

from vllm.v1.worker.gpu import buffer_utils  # noqa: E402

buffer_utils.is_uva_available = lambda: False  # no pinned memory: vLLM's NonUvaBuffer fallback

from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.worker.gpu import model_runner  # noqa: E402, F401  (the plugin patches it on import)
from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected  # noqa: E402
from vllm.v1.worker.gpu.sample.states import SamplingStates  # noqa: E402
from vllm.v1.worker.gpu.spec_decode import acceptance_estimator as ae  # noqa: E402
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator  # noqa: E402
from vllm.v1.worker.gpu.states import RequestState  # noqa: E402

from avbench.serving.capture import read_captured, wait_flushed  # noqa: E402
from avbench.vllm_feature import vllm_logit_qmax  # noqa: E402
from avbench.vllm_plugin import v2  # noqa: E402

SLOTS, K, VOCAB = 8, 4, 5000  # two vocabulary blocks of the feature kernel
cap = plugin._installed["drafts"]
gen = torch.Generator().manual_seed(0)


def _not_rehearsed(*args, **kwargs):
    raise NotImplementedError


Speculator = type(
    "Speculator",
    (DraftModelSpeculator,),
    dict.fromkeys(DraftModelSpeculator.__abstractmethods__, _not_rehearsed),
)


class Server:
    """One arm's worker: request states, sampling states and the speculator's buffers."""

    def __init__(self, ids: list[str], av: bool):
        dev = torch.device("cpu")
        self.ids = ids
        self.rs = RequestState(SLOTS, 64, 64, K, VOCAB, dev)
        self.ss = SamplingStates(SLOTS, VOCAB)
        for e in ids:
            self.rs.add_request(e, 5, [1, 2, 3, 4, 5], 0, 32)
        self.rs.apply_staged_writes()
        slots = [self.rs.req_id_to_index[e] for e in ids]
        self.ss.temperature.np[slots] = [1.0, 0.7, 0.0][: len(ids)]
        self.ss.temperature.copy_to_uva()
        spec = object.__new__(Speculator)  # its __init__ needs a VllmConfig; these are its buffers
        spec.acceptance_estimator = ae.OnlineAcceptanceEstimator(SLOTS, K, dev) if av else None
        spec.draft_logits = torch.full((SLOTS, K, VOCAB), float("-inf"))
        spec.draft_token_confidence_probs = torch.empty(SLOTS, K)
        self.spec = spec
        self.runner = SimpleNamespace(
            speculator=spec,
            req_states=self.rs,
            sampler=SimpleNamespace(sampling_states=self.ss),
            pcp_manager=None,
        )
        self.idx = torch.tensor(slots, dtype=torch.int64)  # input_batch.idx_mapping
        self.batch = SimpleNamespace(req_ids=ids, idx_mapping=self.idx)

    def step(self, accepted: list[int], admitted: list[int], drafts: int) -> list[int]:
        """One engine step: schedule ``drafts`` per request, verify (``admitted`` of them, the
        first ``accepted`` accepted), propose the next drafts. Returns num_rejected."""
        so = SchedulerOutput.make_empty()
        so.total_num_scheduled_tokens = len(self.ids) * (1 + drafts)
        so.scheduled_spec_decode_tokens = {e: [7] * drafts for e in self.ids} if drafts else {}
        v2._before_step(cap, so)  # the patched execute_model, before vLLM's
        num_sampled = torch.tensor([a + 1 for a in accepted], dtype=torch.int32)
        # AV: cu_num_logits = cumsum(admitted + 1) (adaptive_verification.py)
        cu = torch.cumsum(torch.tensor([0, *[a + 1 for a in admitted]]), 0).to(torch.int32)
        seq_lens = torch.full((len(self.ids),), 64, dtype=torch.int32)
        ns, nr = get_num_sampled_and_rejected(
            num_sampled, seq_lens, cu, self.idx, self.rs.prefill_len.gpu
        )
        self.spec.observe_verification(self.idx, ns, nr)  # patched; vLLM's own inside
        logits = torch.randn(len(self.ids), K, VOCAB, generator=gen) * 3
        self.spec.draft_logits[self.idx] = logits  # what propose() leaves behind
        self.rs.draft_tokens[self.idx] = torch.randint(0, VOCAB, (len(self.ids), K), generator=gen)
        est = self.spec.acceptance_estimator
        if est is not None:  # a block drafter's predict: one row per (request, position)
            est.predict(
                logits.reshape(-1, VOCAB),
                self.idx.repeat_interleave(K),
                torch.arange(K).repeat(len(self.ids)),
                self.spec.draft_token_confidence_probs,
                self.ss.temperature.gpu,
            )
        v2._after_sample(cap, self.runner, self.batch)  # the patched sample_tokens, after vLLM's
        return nr.tolist()


predicts = []
_predict = ae.OnlineAcceptanceEstimator.predict


def _counted(self, *args, **kwargs):
    predicts.append(self.features.shape)
    return _predict(self, *args, **kwargs)


ae.OnlineAcceptanceEstimator.predict = _counted
out: dict = {"installed": cap.health.installed}

# AV arm: the estimator's own feature; a: 4 admitted, 1 accepted; b: 2 admitted, both
# accepted, 2 trimmed; c: a zero budget (the plain sampler: 1 sampled, 0 rejected), 4 trimmed.
av = Server(["cmpl-a-0-1a2b3c4d", "cmpl-b-0-00ff00ff", "cmpl-c-0-deadbeef"], av=True)
av.step([0, 0, 0], [0, 0, 0], drafts=0)
est = av.spec.acceptance_estimator
out["av_f"] = est.features[av.idx].flatten().tolist()
out["av_pred"] = est.predictions[av.idx].flatten().tolist()
out["av_num_rejected"] = av.step([1, 2, 0], [4, 2, 0], drafts=K)
out["av_counts"] = est.counts.tolist()
out["av_own_predicts"] = len(predicts) - 2  # the estimator's own calls above

# Static arm (no estimator): our feature from vLLM's kernels (the GPU path), compiled on the
# first step; a: 2 accepted; b: none; c: all 4.
cap.kernels, cap.primed, n0 = ae, False, len(predicts)
static = Server(["cmpl-d-0-0000aaaa", "cmpl-e-0-0000bbbb", "cmpl-f-0-0000cccc"], av=False)
static.step([0, 0, 0], [0, 0, 0], drafts=0)
out["static_predicts_first_step"] = predicts[n0:]
static_logits = static.spec.draft_logits[static.idx].clone()
static_temp = static.ss.temperature.gpu[static.idx].clone()
static.step([2, 0, 4], [4, 4, 4], drafts=K)
out["static_predicts"] = len(predicts) - n0
f_numpy = vllm_logit_qmax(static_logits.numpy(), static_temp[:, None].numpy())
out["static_f_numpy"] = f_numpy.flatten().tolist()  # the transcription, bit-exact to the kernels

assert wait_flushed(cap.dir, time.time(), 0.0, timeout_s=30)
df = read_captured(cap.dir).sort_values(["request_id", "position"], kind="stable")
out["labels"] = {r: g["label"].tolist() for r, g in df.groupby("request_id")}
out["f"] = {r: g["logit_q_max"].tolist() for r, g in df.groupby("request_id")}
out["pred"] = {r: g["estimator_pred"].tolist() for r, g in df.groupby("request_id")}
out["inert"], out["errors"] = cap.health.inert, dict(cap.health.errors)
print(json.dumps(out))
sys.stdout.flush()
