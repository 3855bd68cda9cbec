"""The plugin's logit(q_max) against vLLM's real feature kernel (Triton interpreter, CPU)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from avbench.estimator.online import logit_qmax_from_logits
from avbench.vllm_plugin.features import draft_features, sampled_prob

pytest.importorskip("triton")

_SCRIPT = r"""
import json, torch
from avbench.testing.vllm_kernels import load_estimator_module
from avbench.vllm_plugin.features import logit_qmax

mod = load_estimator_module()
g = torch.Generator().manual_seed(0)
rows, vocab, k = 12, 5000, 2  # two vocabulary blocks of 4096
logits = torch.randn(rows, vocab, generator=g) * 3
peak = torch.tensor([0, 4, 8, 10, 12, 14, 15, 16, 18, 25, 2, 6], dtype=torch.float32)
logits[torch.arange(rows), torch.arange(rows) * 7] += peak * 3
temperature = torch.tensor([0.0, 1.0, 0.7, 1.3] * 3)
est = mod.OnlineAcceptanceEstimator(rows, k, torch.device("cpu"))
idx = torch.arange(rows)
est.predict(logits, idx, torch.tensor(1), torch.zeros(rows, k), temperature)
# A whole step: 6 requests x 2 positions, one temperature per request.
step = logits.view(6, 2, vocab)
step_t = temperature.view(6, 2)[:, 0]
est2 = mod.OnlineAcceptanceEstimator(rows, k, torch.device("cpu"))
est2.predict(logits, idx, torch.tensor(0), torch.zeros(rows, k), step_t.repeat_interleave(2))
print(json.dumps({
    "kernel": est.features[:, 1].tolist(),
    "cpu": logit_qmax(logits, temperature).tolist(),  # the numpy transcription
    "device": logit_qmax(logits, temperature, kernels=mod).tolist(),  # the GPU path's call
    "step_kernel": est2.features[:, 0].view(6, 2).tolist(),
    "step_cpu": logit_qmax(step, step_t).tolist(),
    "step_device": logit_qmax(step, step_t, kernels=mod).tolist(),  # one per-row-step predict
}))
"""


@pytest.mark.slow
def test_logit_qmax_is_vllms_kernel_bit_for_bit():
    """Both of the plugin's paths give the real kernel's float32 feature exactly, saturated
    rows (f = 40) and the rows between f = 10 and 16 where float32 rounding shows included,
    for one position per request and for a whole step (n, K, V) at once."""
    env = os.environ | {"TRITON_INTERPRET": "1"}
    res = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=600
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    kernel = torch.tensor(out["kernel"])
    assert (kernel == 40.0).any() and ((kernel > 10) & (kernel < 16)).any()
    assert torch.equal(torch.tensor(out["cpu"]), kernel)
    assert torch.equal(torch.tensor(out["device"]), kernel)
    step = torch.tensor(out["step_kernel"])
    assert torch.equal(torch.tensor(out["step_cpu"]), step)
    assert torch.equal(torch.tensor(out["step_device"]), step)


def test_features_close_to_exact_where_float32_allows():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 3000, generator=g) * 2
    feats = draft_features(logits, torch.ones(64))
    exact = torch.from_numpy(logit_qmax_from_logits(logits.double().numpy()))
    assert torch.allclose(feats["f"].double(), exact, atol=1e-4)
    q = torch.softmax(logits.double(), -1)
    assert torch.allclose(feats["q_max"].double(), q.max(-1).values, atol=1e-6)
    ent = -(q * q.log()).sum(-1)
    assert torch.allclose(feats["entropy"].double(), ent, atol=1e-4)


def test_temperature_zero_leaves_logits_unscaled_and_greedy_rows_get_one():
    logits = torch.tensor([[2.0, 1.0, 0.0], [2.0, 1.0, 0.0]])
    feats = draft_features(logits, torch.tensor([0.0, 2.0]))
    exact = logit_qmax_from_logits(torch.tensor([[2.0, 1.0, 0.0], [1.0, 0.5, 0.0]]).numpy())
    assert torch.allclose(feats["f"].double(), torch.from_numpy(exact), atol=1e-6)
    tok = torch.tensor([1, 1])
    p = sampled_prob(feats["logq"], tok, torch.tensor([True, False]))
    assert p[0] == 1.0 and abs(float(p[1]) - float(torch.softmax(logits[1] / 2, -1)[1])) < 1e-6
