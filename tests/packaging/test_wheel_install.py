"""The built wheel, installed into a fresh venv outside the repository, lists the shipped pairs
and plans a sweep: suites and assets travel inside the package."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from avbench.inputs.suite import load_suite

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{cmd}: {res.stderr[-2000:]}"
    return res.stdout


def _build_wheel(tmp: Path, env: dict[str, str]) -> Path:
    # Built from a copy, so no build/ or egg-info lands in the checkout and no stale build
    # output of an earlier layout can reach the wheel.
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "avbench", src / "avbench", ignore=shutil.ignore_patterns("__pycache__"))
    _run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
         "-q", "-w", str(tmp / "dist")],
        src, env,
    )  # fmt: skip
    (wheel,) = (tmp / "dist").glob("avbench-*.whl")
    return wheel


def _fresh_venv(tmp: Path, wheel: Path, env: dict[str, str]) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp, env).strip())  # fmt: skip
    # The dependencies come from this interpreter's site-packages, added as plain paths: the
    # .pth files there (the editable install of the repository among them) are not processed.
    ours = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (site / "dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        tmp, env,
    )  # fmt: skip
    return venv


def _ray_only_as_an_extra(wheel: Path) -> None:
    """Ray is the `ray` extra's (sweep --ray), never a base dependency of the wheel."""
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        meta = z.read(name).decode().splitlines()
    requires = [line.split(":", 1)[1].strip() for line in meta if line.startswith("Requires-Dist:")]
    ray = [r for r in requires if re.match(r"ray\b", r)]
    assert "Provides-Extra: ray" in meta
    assert ray and all('extra == "ray"' in r for r in ray), requires


def test_the_wheel_installed_outside_the_repo_lists_pairs_and_plans(tmp_path: Path):
    tmp = tmp_path.resolve()
    assert not tmp.is_relative_to(REPO)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "AVBENCH_SUITES", "VIRTUAL_ENV", "PYTHONHOME")
    }
    wheel = _build_wheel(tmp, env)
    _ray_only_as_an_extra(wheel)
    venv = _fresh_venv(tmp, wheel, env)
    work = tmp / "work"  # no ./suites here: the package's own are read
    work.mkdir()

    where = _run([str(venv / "bin" / "python"), "-c", "import avbench; print(avbench.__file__)"], work, env)  # fmt: skip
    assert Path(where.strip()).is_relative_to(venv), where

    avbench = str(venv / "bin" / "avbench")
    pairs = _run([avbench, "pairs"], work, env).splitlines()
    header = pairs[0]
    assert header.startswith("# pairs (") and Path(header[9:-1]).is_relative_to(venv), header
    shipped = load_suite(REPO / "avbench" / "suites")
    listed = [line.split("\t")[0] for line in pairs[2:]]
    assert listed == list(shipped.pairs), listed
    tiny = next(line.split("\t") for line in pairs[2:] if line.startswith("tiny-cpu\t"))
    assert tiny[1:3] == ["@assets/tiny/target", "@assets/tiny/drafter"]
    assert (Path(header[9:-1]).parent.parent / "assets/tiny/target/model.safetensors").is_file()

    plan = _run([avbench, "plan", "--pair", "mimo-dflash"], work, env).splitlines()
    assert plan[0].startswith("# plan: pair mimo-dflash, sweep default: "), plan[0]
    cells = int(plan[0].split(": ")[2].split(" cells")[0])
    rows = [line.split("\t") for line in plan[2:] if line.split("\t")[0].isdigit()]
    assert len(rows) == cells > 0
    mimo, default = shipped.pair("mimo-dflash"), shipped.sweep("default")
    arms = [f"static-k{k}" for k in default.k_values if k <= mimo.max_k]
    assert [a for a in dict.fromkeys(r[1] for r in rows)] == [
        "baseline",
        *arms,
        f"av-k{mimo.max_k}",
    ]
    assert {r[2] for r in rows} == set(default.workloads)
    assert {r[3] for r in rows} == {f"c={c}" for c in default.concurrencies}
    assert [r[0] for r in rows] == [str(i) for i in range(cells)]
    # The same cells as the source tree plans (the server commands name each interpreter).
    source = _run([sys.executable, "-m", "avbench.cli", "plan", "--pair", "mimo-dflash"], work, env)
    assert plan[: cells + 2] == source.splitlines()[: cells + 2]
