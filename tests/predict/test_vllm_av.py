"""avbench's transcriptions of vLLM's AV decision code against the real code.

The real functions come from the installed vLLM (the CPU build 0.32.0 ships the same
``adaptive_verification.py`` functions as 0.33.0) and, in a subprocess, from the 0.33.0 source
itself; the budget rule is a method of a stateful manager, called here on a stand-in ``self``
holding exactly the attributes it reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from avbench.predict.vllm_av import (
    AV_MODULE,
    BudgetInputs,
    assign_budget,
    budget_rule,
    build_cost_tables,
    decision_code,
)

av = pytest.importorskip(AV_MODULE, reason="vLLM is not installed (run make setup)")


def _batch(rng, n=5, k=4):
    conf = rng.uniform(0.05, 0.99, (n, k)).astype(np.float32)
    cap = rng.integers(0, k + 1, n).astype(np.int32)
    return conf, cap


def test_assign_budget_equals_vllms_kernel():
    import torch

    rng = np.random.default_rng(1)
    for _ in range(200):
        conf, cap = _batch(rng)
        if cap.sum() < 2:
            continue
        budget = int(rng.integers(1, cap.sum()))  # vLLM calls it only when the budget binds
        real = torch.as_tensor(cap).clone()
        av._assign_draft_token_budget(torch.as_tensor(conf), torch.arange(5), real, budget, 4)
        assert assign_budget(conf, cap, budget).tolist() == real.tolist()
        assert decision_code().assign(conf, cap, budget).tolist() == real.tolist()


def test_cost_tables_equal_vllms_builder():
    rng = np.random.default_rng(2)
    for limit in (0, 8, 24):
        draft = sorted({int(x) for x in rng.integers(1, 40, 6)})
        verify = sorted({int(x) for x in rng.integers(1, 300, 9)})
        dc = [(x, float(v)) for x, v in zip(draft, rng.uniform(1, 5, len(draft)), strict=True)]
        vc = [(x, float(v)) for x, v in zip(verify, rng.uniform(2, 9, len(verify)), strict=True)]
        ours = build_cost_tables(dc, vc, 64, 512, limit)
        real = av.build_cost_tables_from_curves(dc, vc, 64, 512, limit)
        for a, b in zip(ours, real, strict=True):
            np.testing.assert_array_equal(a, b)


def _manager(inputs: BudgetInputs, tables, max_total_logits: int, bonus: int = 1):
    """A stand-in ``self`` for AdaptiveVerificationManager.get_num_tokens."""
    n, k = inputs.stale_confidences.shape
    ids = [f"r{i}" for i in range(n)]
    # Decode requests: computed tokens already past the prompt, so every one samples.
    req_states = SimpleNamespace(
        req_id_to_index={r: i for i, r in enumerate(ids)},
        num_computed_tokens_np=np.full(n, 100),
        prefill_len=SimpleNamespace(np=np.full(n, 10)),
    )
    return SimpleNamespace(
        cost_tables=tables,
        req_states=req_states,
        _stale_confidences=[SimpleNamespace(np=inputs.stale_confidences)],
        _stale_idx=0,
        num_speculative_steps=k,
        _max_total_logits=max_total_logits,
        num_bonus_tokens=bonus,
        _batch_budget=None,
    ), ids


def test_budget_rule_equals_get_num_tokens():
    rng = np.random.default_rng(3)
    manager_cls = av.AdaptiveVerificationManager
    for trial in range(100):
        n, k = int(rng.integers(1, 7)), 4
        conf = rng.uniform(0.05, 0.99, (n, k)).astype(np.float32)
        cap = rng.integers(0, k + 1, n).astype(np.int32)
        tables = build_cost_tables(
            [(1, 1.0), (8, float(rng.uniform(1, 4)))],
            [(1, 2.0), (16, float(rng.uniform(2, 6))), (64, float(rng.uniform(6, 30)))],
            16,
            256,
        )
        cap_logits = 10_000 if trial % 2 else int(rng.integers(n, n + 8))
        inputs = BudgetInputs(conf, cap, n, n, float(tables[0][n]), tables[1], cap_logits - n)
        fake, ids = _manager(inputs, tables, cap_logits)
        tokens = manager_cls.get_num_tokens(
            fake, {r: 1 + int(c) for r, c in zip(ids, cap, strict=True)},
            {r: [0] * int(c) for r, c in zip(ids, cap, strict=True)},
        )  # fmt: skip
        assert tokens - n == fake._batch_budget[2] == budget_rule(inputs)


_REAL = r"""
import json, sys
import numpy as np, torch
from vllm.v1.worker.gpu.spec_decode import adaptive_verification as av
from importlib.metadata import version
cases = json.loads(sys.stdin.read())
out = []
for c in cases:
    conf = torch.tensor(c["conf"], dtype=torch.float32)
    cap = torch.tensor(c["cap"], dtype=torch.int32)
    av._assign_draft_token_budget(conf, torch.arange(conf.shape[0]), cap, c["budget"], conf.shape[1])
    d, v = av.build_cost_tables_from_curves(c["dc"], c["vc"], 32, 128, c["limit"])
    out.append({"admitted": cap.tolist(), "draft": d.tolist(), "verify": v.tolist()})
print(json.dumps({"version": version("vllm"), "out": out}))
"""


@pytest.mark.slow
def test_transcriptions_equal_the_gpu_builds_source(vllm_src):
    """The same checks against vLLM 0.33.0's own source, imported on CPU."""
    from avbench.testing.vllm_source import rehearsal_env

    rng = np.random.default_rng(4)
    cases = []
    for i in range(20):
        conf, cap = _batch(rng, n=6, k=5)
        cap[0] = 5
        dc = [(1, 1.0), (4, 2.0), (16, float(rng.uniform(2, 6)))]
        vc = [(1, 3.0), (8, 4.0), (40, float(rng.uniform(4, 12))), (100, 20.0)]
        cases.append({"conf": conf.tolist(), "cap": cap.tolist(),
                      "budget": int(rng.integers(1, cap.sum())), "dc": dc, "vc": vc,
                      "limit": (0, 8, 30)[i % 3]})  # fmt: skip
    res = subprocess.run(
        [sys.executable, "-c", _REAL], input=json.dumps(cases), capture_output=True, text=True,
        env=rehearsal_env(vllm_src), timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    real = json.loads(res.stdout.strip().splitlines()[-1])
    assert real["version"] == "0.33.0"
    for c, r in zip(cases, real["out"], strict=True):
        conf, cap = np.array(c["conf"], np.float32), np.array(c["cap"], np.int32)
        assert assign_budget(conf, cap, c["budget"]).tolist() == r["admitted"]
        d, v = build_cost_tables(c["dc"], c["vc"], 32, 128, c["limit"])
        assert d.tolist() == r["draft"] and v.tolist() == r["verify"]
