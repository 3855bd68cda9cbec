"""The log lines avbench reads for each arm's attention backend and CUDA graphs, as vLLM
0.33.0's own code writes them (its format strings, enums and config repr), so the parser
cannot drift from the GPU build unseen."""

import json
import subprocess
import sys

import pytest

from avbench.serving.server_log import engine_choices
from avbench.testing.vllm_source import rehearsal_env

# (file under vllm/, text it must hold): the messages avbench/serving/server_log.py matches.
MESSAGES = (
    ("platforms/cuda.py", 'logger.info("Using %s backend.", selected_backend)'),
    ("platforms/cuda.py", '"Using %s attention backend out of potential backends: %s."'),
    (
        "platforms/cpu.py",
        'logger.info_once("Using %s backend.", AttentionBackendEnum.CPU_MLA.name)',
    ),
    ("model_executor/models/mimo_v2.py", 'logger.info_once("Using %s for attention."'),
    ("v1/engine/core.py", '"Initializing a V1 LLM engine (v%s) with config: %s"'),
    ("config/vllm.py", 'f"compilation_config={self.compilation_config!r}, "'),
    ("config/compilation.py", 'msg += "; setting cudagraph_mode=PIECEWISE"'),
    ("config/compilation.py", '"graphs. Overriding to %s.",'),
    ("v1/worker/gpu/cudagraph_utils.py", 'progress_bar_desc: str = "Capturing CUDA graphs",'),
    ("v1/worker/gpu/cudagraph_utils.py", 'desc=f"{progress_bar_desc} ({mode.name})"'),
)

_FORMAT = r"""
import json
from vllm.config.compilation import CompilationConfig, CUDAGraphMode as M
from vllm.v1.attention.backends.registry import AttentionBackendEnum as E

print(json.dumps({
    "pinned": "Using %s backend." % E.FLASH_ATTN,
    "picked": "Using %s attention backend out of potential backends: %s."
    % (E.FLASHINFER.name, "['FLASHINFER', 'FLASH_ATTN']"),
    "config": "Initializing a V1 LLM engine (v%s) with config: %s"
    % ("0.33.0", "model='m', compilation_config=%r, x=1"
       % CompilationConfig(cudagraph_mode=M.FULL_AND_PIECEWISE)),
    "override": "Cudagraph mode %s requires piecewise capture, but the loaded model provides "
    "neither a compiled submodule nor breakable CUDA graphs. Overriding to %s."
    % (M.FULL_AND_PIECEWISE, M.FULL_AND_PIECEWISE.without_piecewise()),
    "bars": "%s (%s): 100%%\n%s (%s): 100%%" % ("Capturing CUDA graphs", M.PIECEWISE.name,
                                             "Capturing CUDA graphs", M.FULL.name),
}))
"""


@pytest.mark.parametrize(("path", "text"), MESSAGES)
def test_the_messages_are_in_033s_source(vllm_src, path, text):
    assert text in (vllm_src / "vllm" / path).read_text(encoding="utf-8")


@pytest.mark.slow
def test_033s_own_lines_parse(vllm_src):
    res = subprocess.run(
        [sys.executable, "-c", _FORMAT],
        env=rehearsal_env(vllm_src),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = json.loads(res.stdout.strip().splitlines()[-1])
    assert engine_choices(lines["pinned"])["attention_backend_chosen"] == "FLASH_ATTN"
    assert engine_choices(lines["picked"])["attention_backend_chosen"] == "FLASHINFER"
    assert engine_choices(lines["config"])["cudagraph_mode_chosen"] == "FULL_AND_PIECEWISE"
    both = lines["config"] + "\n" + lines["override"]
    assert engine_choices(both)["cudagraph_mode_chosen"] == "FULL_DECODE_ONLY"
    assert engine_choices(lines["bars"])["cudagraphs_captured"] == "FULL+PIECEWISE"
