"""register(): inert without a capture directory; with one, hooks check before patching and
count their own failures instead of raising them."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from avbench.vllm_plugin.runtime import Health, guarded, when_imported, wrap_method

pytestmark = pytest.mark.slow

# vLLM's classes the plugin may patch, with the methods it may replace.
_TARGETS = {
    "vllm.v1.worker.gpu_model_runner": ("GPUModelRunner", ["execute_model", "sample_tokens", "propose_draft_token_ids"]),
    "vllm.v1.spec_decode.llm_base_proposer": ("SpecDecodeBaseProposer", ["_sample_draft_tokens"]),
    "vllm.v1.worker.gpu.model_runner": ("GPUModelRunner", ["execute_model", "sample_tokens"]),
    "vllm.v1.worker.gpu.spec_decode.speculator": ("DraftModelSpeculator", ["observe_verification"]),
    "vllm.v1.worker.gpu.spec_decode.acceptance_estimator": ("OnlineAcceptanceEstimator", ["step", "predict"]),
}  # fmt: skip

_SCRIPT = textwrap.dedent(
    """
    import importlib, json, sys, threading
    targets = json.loads(sys.argv[1])
    def snapshot():
        out = {}
        for mod, (cls, names) in targets.items():
            c = getattr(importlib.import_module(mod), cls)
            out[mod] = {k: id(v) for k, v in vars(c).items()}
        return out
    before, finders, threads = snapshot(), list(sys.meta_path), threading.active_count()
    from vllm.plugins import load_general_plugins
    load_general_plugins()  # the real entry-point path vLLM takes in every process
    import avbench.vllm_plugin as plugin
    plugin.register()
    print(json.dumps({"same": snapshot() == before, "finders": sys.meta_path == finders,
                      "threads": threading.active_count() - threads,
                      "loaded": "avbench.vllm_plugin" in sys.modules,
                      "installed": sorted(plugin._installed)}))
    """
)


def _run(env: dict) -> dict:
    res = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(_TARGETS)],
        capture_output=True, text=True, timeout=900,
        env={k: v for k, v in os.environ.items() if not k.startswith("AVBENCH_CAPTURE")} | env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_unset_plugin_leaves_vllm_untouched(tmp_path):
    pytest.importorskip("vllm")
    out = _run({"AVBENCH_CAPTURE_DIR": str(tmp_path / "missing")})  # set, but no directory
    assert out == {"same": True, "finders": True, "threads": 0, "loaded": True, "installed": []}
    out = _run({})
    assert out["same"] and out["finders"] and out["installed"] == []


def test_hooks_check_attributes_and_count_exceptions(tmp_path):
    health = Health(tmp_path)

    class Runner:
        def step(self, x):
            return x + 1

    def boom(*a):
        raise RuntimeError("bug in a hook")

    def make(orig):
        def step(self, x):
            guarded(health, "test.step", boom, x)
            return orig(self, x)

        return step

    assert wrap_method(health, Runner, "step", make, "test")
    assert Runner().step(1) == 2 and Runner().step(2) == 3  # serving goes on
    assert health.errors["test.step"] == 2
    assert "RuntimeError: bug in a hook" in health.first_error["test.step"]
    assert not wrap_method(health, Runner, "absent", make, "test")
    assert len(health.inert) == 1 and "Runner.absent not found" in health.inert[0]


def test_hooks_wait_for_the_module_import(tmp_path, monkeypatch):
    (tmp_path / "avbench_fake_runner.py").write_text("class Runner:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("avbench_fake_runner", lambda m: seen.append(m.Runner))
    assert seen == []
    import avbench_fake_runner  # noqa: F401

    assert seen == [sys.modules["avbench_fake_runner"].Runner]
    when_imported("avbench_fake_runner", lambda m: seen.append("again"))  # already imported
    assert seen[-1] == "again"


def test_a_capturing_worker_loads_no_pandas_and_nothing_of_avbench_but_the_protocol():
    """What a vLLM worker with every capture on imports of avbench (import-linter checks the
    code; this checks what a process really loads)."""
    modules = ("drafts", "refits", "runtime", "sink", "steps", "features", "v1", "v2")
    code = (
        "import json, sys\n"
        + "".join(f"import avbench.vllm_plugin.{m}\n" for m in modules)
        + "print(json.dumps([m for m in sys.modules if m.split('.')[0] in ('avbench', 'pandas')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert not any(m.startswith("pandas") for m in loaded)
    others = {m for m in loaded if not m.startswith("avbench.vllm_plugin")}
    assert others == {"avbench", "avbench.capture_protocol", "avbench.vllm_feature"}, others
