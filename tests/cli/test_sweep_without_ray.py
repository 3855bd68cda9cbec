"""Ray is the optional extra behind `avbench sweep --ray`: a sweep without the flag imports
nothing of it, and with the flag but without Ray installed it says so in one line."""

import json
import subprocess
import sys

import pytest

from avbench.testing.cli import run_cli
from avbench.testing.fake_server import ServerConfig, serve_in_thread

# A whole sweep (attached to the fake server: plan, runner, load driver, store, report) in a
# fresh interpreter, then the Ray modules it imported.
_SWEEP_THEN_MODULES = """
import json, sys
from avbench.cli import main
sys.argv = ["avbench", "sweep", "--pair", "tiny-cpu", "--endpoint", sys.argv[1], "--workloads", "gsm8k-tiny",
            "--concurrencies", "1", "--requests", "2", "--warmup", "0", "--results", sys.argv[2],
            "--no-report"]
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"exit": code, "ray": sorted(m for m in sys.modules if m.split(".")[0] == "ray")}))
"""


@pytest.mark.slow
def test_a_sweep_without_ray_imports_no_ray_module(tmp_path):
    with serve_in_thread(ServerConfig(model="tiny-target", output_tokens=6)) as srv:
        got = subprocess.run(
            [sys.executable, "-c", _SWEEP_THEN_MODULES, f"http://127.0.0.1:{srv.port}",
             str(tmp_path)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    said = json.loads(got.stdout.strip().splitlines()[-1])
    assert said["exit"] == 0, got.stderr
    assert list(tmp_path.glob("*/cells.jsonl")), "the sweep measured nothing"
    assert said["ray"] == []


def test_ray_flag_without_ray_installed_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "avbench.run.ray_backend", raising=False)
    got = run_cli("sweep", "--pair", "tiny-cpu", "--ray", "local")
    assert got.returncode == 2
    assert got.stderr.strip() == "error: --ray: Ray is not installed (pip install 'avbench[ray]')"
