"""The CPU sampler fix: the replacement expand matches the Triton kernel's semantics, the
installed vllm-cpu's own override is detected as broken (or, once fixed upstream, as fine),
and installing the fix routes vLLM's real ``expand_batch_to_tokens`` through it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
vllm_cpu = pytest.importorskip("vllm.utils.cpu_triton_utils")

from avbench.vllm_plugin.cpu_expand import build_is_broken, exact_expand, install  # noqa: E402


def _reference(output, values, cu, replace_from, replace_to):
    """The Triton kernel, one program per request, as plain Python."""
    out = output.clone()
    start = 0
    for i, end in enumerate(cu.tolist()):
        v = values[i].item()
        out[start:end] = replace_to if v == replace_from else v
        start = end
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_exact_expand_matches_the_kernel_and_leaves_the_tail(dtype):
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        b = int(torch.randint(1, 6, (1,), generator=gen))
        counts = torch.randint(0, 4, (b,), generator=gen)
        cu = torch.cumsum(counts, 0).to(torch.int32)
        values = (torch.rand(b, generator=gen) * 4).round().to(dtype)
        out = torch.full((int(cu[-1]) + 3,), -7, dtype=dtype)
        want = _reference(out, values, cu, 1, 9)
        exact_expand(out, values, cu, 1, 9)
        assert torch.equal(out, want)
        assert torch.equal(out[int(cu[-1]) :], torch.full((3,), -7, dtype=dtype))


def test_fractional_temperatures_survive():
    out = torch.empty(5, dtype=torch.float32)
    exact_expand(out, torch.tensor([0.7, 1.3]), torch.tensor([2, 5], dtype=torch.int32), -1, 1)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.3, 1.3, 1.3])


def test_the_installed_build_is_judged_by_what_its_override_writes():
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # the build's override calls torch.ops._C
    stock = vllm_cpu._expand_kernel_impl
    if stock is exact_expand:
        pytest.skip("the fix is already installed in this process")
    broken = build_is_broken(stock)
    out = torch.full((3,), -5.0)
    stock(out, torch.tensor([0.5]), torch.tensor([3], dtype=torch.int32), 0, 0)
    assert broken == (out.tolist() != [0.5, 0.5, 0.5])
    assert not build_is_broken(exact_expand)


def _fresh(code: str) -> str:
    """The last line ``code`` prints in a fresh interpreter, as in a server process."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_install_routes_the_rejection_sampler_through_the_fix():
    """In a fresh interpreter, as in a server process: the platform registers its overrides
    after the plugin (the worker's order) and vLLM's expansion then writes temperatures."""
    code = (
        "import torch\n"
        "from avbench.vllm_plugin.cpu_expand import install, build_is_broken\n"
        "from vllm.utils import cpu_triton_utils as c\n"
        "from vllm.platforms import current_platform\n"
        "current_platform.import_kernels()\n"
        "broken = build_is_broken(c._expand_kernel_impl)\n"
        "why = install()\n"
        "current_platform.register_triton_kernel_overrides()\n"
        "from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens\n"
        "t = expand_batch_to_tokens(torch.tensor([0.7, 1.0]), torch.tensor([3, 5], dtype=torch.int32), 5)\n"
        "print(broken, why, [round(x, 3) for x in t.tolist()])\n"
    )
    broken, rest = _fresh(code).split(" ", 1)
    assert rest.endswith("[0.7, 0.7, 0.7, 1.0, 1.0]"), rest
    if broken == "True":
        assert rest.startswith("None "), "the build is broken and the fix was not installed"
    else:
        assert "writes float outputs" in rest


@pytest.mark.slow
def test_the_probe_loads_the_kernels_this_cpu_runs():
    """vllm._C is the build's AVX-512 BF16 library: on an AVX2-only CPU importing it is an
    illegal instruction (every speculative arm's server died, -4, before it was ready). In a
    fresh interpreter told it has no AVX-512, the probe must load the library the platform picks
    for such a CPU, never vllm._C."""
    code = (
        "import sys, torch\n"
        "torch.cpu._is_avx512_supported = lambda: False\n"
        "from avbench.vllm_plugin.cpu_expand import install\n"
        "why = install()\n"
        "print(why, 'vllm._C' in sys.modules)\n"
    )
    why, loaded = _fresh(code).rsplit(" ", 1)
    assert loaded == "False", why
    assert why in ("None", "this build's expand override writes float outputs"), why


def test_install_is_inert_off_the_cpu_build_and_the_log_says_so(monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    before = vllm_cpu._expand_kernel_impl
    assert install() == "not the CPU platform"
    assert vllm_cpu._expand_kernel_impl is before


@pytest.mark.slow
def test_a_probe_that_kills_the_process_has_said_so_in_the_log_first():
    """Native code avbench runs inside a server at start-up (this fix's probe: the build's
    kernels and its expand override) logs what it is about to do first, so a process it crashes
    is never silent. The crash is stood in for: the probe raises SIGILL, as an instruction the
    CPU lacks would (the probe once imported vllm._C, the AVX-512 library, directly: -4 on
    every speculative T = 1 arm of an AVX2-only machine)."""
    import signal
    import subprocess
    import sys

    code = (
        "import os, signal\n"
        "from avbench.vllm_plugin import _fix_cpu_expand, cpu_expand\n"
        "cpu_expand.build_is_broken = lambda impl: os.kill(os.getpid(), signal.SIGILL)\n"
        "_fix_cpu_expand()\n"
        "print('survived')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == -signal.SIGILL, res.stdout + res.stderr
    said = res.stdout + res.stderr
    assert "survived" not in said
    assert "avbench: probing whether the vllm-cpu expand kernel fix is needed" in said, said
    assert "should this process die now, the probe is the cause" in said
