"""The CPU seeded-prefill fix on a stand-in model runner: the stand-in does what vLLM 0.32's
runner does with a seeded request whose sample is discarded (draw in ``_sample``, then rewind
its generator by offset in ``_bookkeeping_sync``), so the stock rewind raises as it does in the
engine; patched, the rewind restores the generator exactly. The real runner is served patched
in tests/integration/test_engine_death_vllm.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from avbench.vllm_plugin import cpu_seed  # noqa: E402


def _runner_module():
    class GPUModelRunner:
        def __init__(self, seeds: dict[int, int], discard: list[bool]):
            gens = {i: torch.Generator().manual_seed(s) for i, s in seeds.items()}
            self.input_batch = SimpleNamespace(generators=gens, num_reqs=len(discard))
            self.discard_request_mask = SimpleNamespace(np=np.array(discard))

        def _sample(self):
            return {i: torch.rand(4, generator=g) for i, g in self.input_batch.generators.items()}

        def _bookkeeping_sync(self):
            for i in np.nonzero(self.discard_request_mask.np[: self.input_batch.num_reqs])[0]:
                gen = self.input_batch.generators.get(int(i))
                if gen is not None:
                    gen.set_offset(gen.get_offset() - 4)

    return SimpleNamespace(GPUModelRunner=GPUModelRunner)


def _step(runner):
    drawn = runner._sample()
    runner._bookkeeping_sync()
    return drawn


def test_the_stock_rewind_raises_on_a_cpu_generator():
    assert cpu_seed.cpu_generators_refuse_offsets()
    runner = _runner_module().GPUModelRunner({0: 7}, [True])
    with pytest.raises(RuntimeError, match="CPU Generator does not use offset"):
        _step(runner)


def test_patched_a_discarded_draw_is_undone_and_the_others_are_kept():
    module = _runner_module()
    assert cpu_seed.patch(module) and cpu_seed.patch(module)  # twice: wrapped once
    runner = module.GPUModelRunner({0: 7, 1: 9, 2: 11}, [True, False, True])
    _step(runner)  # requests 0 and 2 are mid-prefill: their samples are discarded
    runner.discard_request_mask.np[:] = False
    second = _step(runner)
    fresh = {s: torch.rand(4, generator=torch.Generator().manual_seed(s)) for s in (7, 11)}
    assert torch.equal(second[0], fresh[7]) and torch.equal(second[2], fresh[11])
    # Request 1 sampled at both steps: its second draw follows its first.
    g = torch.Generator().manual_seed(9)
    torch.rand(4, generator=g)
    assert torch.equal(second[1], torch.rand(4, generator=g))
    assert sorted(runner.input_batch.generators) == [0, 1, 2]


def test_a_runner_without_the_two_steps_is_left_alone():
    assert not cpu_seed.patch(SimpleNamespace())
    assert not cpu_seed.patch(SimpleNamespace(GPUModelRunner=type("GPUModelRunner", (), {})))


def test_the_installed_vllm_runner_has_what_the_fix_wraps():
    runner = pytest.importorskip(cpu_seed.RUNNER_MODULE).GPUModelRunner
    assert callable(runner.__dict__.get("_sample"))
    assert callable(runner.__dict__.get("_bookkeeping_sync"))
