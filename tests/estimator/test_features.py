"""vLLM's float32 logit(q_max): our numpy version against vLLM's own feature kernel.

The kernel runs in Triton's interpreter in a subprocess (``TRITON_INTERPRET=1`` must precede
Triton's import, and the CPU build of vLLM hands its modules a Triton placeholder; see
``avbench/testing/vllm_kernels.py``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from avbench.estimator.online import logit_qmax_from_logits
from avbench.testing.vllm_kernels import installed_vllm_dir
from avbench.vllm_feature import vllm_logit_qmax, vllm_logit_qmax_from_f

KERNEL = textwrap.dedent(
    """
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import numpy as np, torch
    from avbench.testing.vllm_kernels import load_estimator_module

    mod = load_estimator_module()
    for path in sys.argv[1:]:
        data = np.load(path)
        z, temp = torch.from_numpy(data["logits"]), torch.from_numpy(data["temperature"])
        rows = z.shape[0]
        est = mod.OnlineAcceptanceEstimator(rows, 1, torch.device("cpu"))
        idx = torch.arange(rows, dtype=torch.int32)
        conf = torch.zeros(rows, 1)
        est.predict(z, idx, torch.tensor(0, dtype=torch.int32), conf, temp)
        np.save(path + ".f.npy", est.features[:, 0].numpy())
    """
)


def logits_with_f(target: np.ndarray, vocab: int, seed: int, spread: float = 1.0) -> np.ndarray:
    """float32 rows whose exact logit(q_max) is about ``target`` (others ~ N(0, spread));
    below about -log(vocab) no row can reach its target (the top token stops being the max)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, spread, size=(len(target), vocab))
    top = rng.integers(0, vocab, size=len(target))
    z[np.arange(len(target)), top] = -np.inf
    others = np.logaddexp.reduce(z, axis=-1)
    z[np.arange(len(target)), top] = target + others
    return z.astype(np.float32)


@pytest.fixture(scope="module")
def kernel_cases(tmp_path_factory):
    pytest.importorskip("triton", reason="triton is not installed: vLLM's kernel cannot run")
    if installed_vllm_dir() is None:
        pytest.skip("vLLM is not installed: no feature kernel to test against")
    root = tmp_path_factory.mktemp("feature")
    target = np.concatenate([np.linspace(-10, 30, 161), [10.5, 12.0, 13.3, 14.1, 15.7, 16.4]])
    cases = {}
    # 64 tokens: one block; 9000: three blocks, padded to four in the kernel's final sum;
    # 32000 nearly flat tokens: eight blocks, and f down to -10.
    for i, (vocab, spread) in enumerate(((64, 1.0), (9000, 1.0), (32000, 0.05))):
        z = logits_with_f(target, vocab, seed=i, spread=spread)
        temp = np.resize(np.array([1.0, 0.7, 0.0, 1.3], dtype=np.float32), len(target))
        path = root / f"case{vocab}.npz"
        np.savez(path, logits=z, temperature=temp)
        cases[vocab] = (path, z, temp)
    res = subprocess.run(
        [sys.executable, "-c", KERNEL, *(str(p) for p, _, _ in cases.values())],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return {
        v: (z, t, np.load(str(p) + ".f.npy"))  # ".npz.f.npy": the kernel's features
        for v, (p, z, t) in cases.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("vocab", [64, 9000, 32000])
def test_matches_vllm_feature_kernel_bit_for_bit(kernel_cases, vocab):
    z, temp, kernel = kernel_cases[vocab]
    ours = vllm_logit_qmax(z, temp)
    assert ours.dtype == np.float32 and ours.shape == kernel.shape
    np.testing.assert_array_equal(ours, kernel)
    # The range covered, and vLLM's own departures from the exact value in it.
    exact = logit_qmax_from_logits(z / np.where(temp > 0, temp, 1.0)[:, None])
    assert exact.max() >= 40 and exact.min() < (-9.5 if vocab == 32000 else 0)
    assert np.all(kernel[exact > 17] == 40.0)
    mid = (exact > 10) & (exact < 15)
    assert 0.01 < np.max(np.abs(kernel[mid] - exact[mid])) < 0.6
    low = exact < 5
    np.testing.assert_allclose(kernel[low], exact[low], atol=2e-4)


def test_accepts_torch_tensors_and_scalar_temperature():
    torch = pytest.importorskip("torch")
    z = logits_with_f(np.array([-3.0, 2.0, 12.0]), 300, seed=4)
    np.testing.assert_array_equal(
        vllm_logit_qmax(torch.from_numpy(z), 0.8), vllm_logit_qmax(z, np.full(3, 0.8))
    )


def test_from_exact_f_follows_the_float32_rounding():
    f = np.linspace(-10, 30, 4001)
    v = vllm_logit_qmax_from_f(f)
    assert np.all(v[f > 16.7] == 40.0)
    np.testing.assert_allclose(v[f < 5], f[f < 5], atol=1e-5)
    mid = (f > 10) & (f < 15)
    assert 0.05 < np.max(np.abs(v[mid] - f[mid])) < 0.4
    # Idempotent on vLLM's values, to one float32 unit.
    np.testing.assert_allclose(vllm_logit_qmax_from_f(v), v, rtol=2.5e-7, atol=0)
    # Against the kernel emulation from logits: the same quantisation up to the vocabulary
    # sum's last bits (a few float32 units of 1 + e^-f: up to 5 seen over 1701 values of f).
    g = f[(f >= 0) & (f < 17)][::10]
    from_logits = vllm_logit_qmax(logits_with_f(g, 2000, seed=5), 1.0)
    total_a = 1 + np.exp(-from_logits.astype(np.float64))
    total_b = 1 + np.exp(-vllm_logit_qmax_from_f(g).astype(np.float64))
    assert np.max(np.abs(total_a - total_b)) <= 8 * np.finfo(np.float32).eps
