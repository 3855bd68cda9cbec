"""`avbench doctor`: is this machine ready for a sweep? One line per check: ok, warn or problem.

A *problem* is something that makes a sweep fail (no vLLM, a GPU build without a GPU or with an
NVIDIA driver too old for its CUDA release, fewer GPUs than the pair's TP x PP x DP, a workload of the sweep that cannot load offline, a
full disk, a server command line this vLLM rejects, captures asked for without the plugin); a
*warn* is reported but does not (AV not supported here: the sweep reports the arm unsupported;
no browser: no static figures). With ``--sanity`` a broken rejection path is a problem too: a
sweep would run, but its acceptance numbers would be the build's bug (avbench/checks/sanity.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from avbench import __version__
from avbench.errors import AvbenchError, ServerError, UnsupportedArm

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "avbench"
PLUGIN_TARGET = "avbench.vllm_plugin:register"
MIN_FREE_GIB = 1.0
LOW_FREE_GIB = 10.0
# The oldest NVIDIA driver branch each CUDA major release runs on (CUDA's minor-version
# compatibility: any 12.x runtime on branch 525 or newer, any 13.x on 580 or newer). vLLM
# 0.33.0, avbench's GPU extra, is a CUDA 13 build.
MIN_DRIVER_BRANCH = {12: 525, 13: 580}
# A target whose weights fit this is served by `doctor --sanity` (the shipped tiny pair, small
# local checkpoints); a bigger one is left to `avbench sanity` on the serving machine.
SANITY_MAX_WEIGHTS_GIB = 2.0
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")

Status = Literal["ok", "warn", "problem"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None

    def line(self) -> str:
        fix = f" | fix: {self.fix}" if self.fix and self.status != "ok" else ""
        return f"{self.status:<7} {self.name}: {self.detail}{fix}"


@dataclass(frozen=True)
class DoctorOptions:
    python: str = sys.executable  # the interpreter that runs vLLM
    suites: Path | None = None
    pair: str | None = None
    sweep: str | None = None
    results: Path = Path("results")
    sanity: bool = False  # serve the pair's target drafting for itself (avbench sanity)
    progress: Callable[[str], None] = print  # the sanity check's lines while its server starts


# Runs in the vLLM interpreter: imports vLLM (the real test of "importable") and lists the
# general plugins that interpreter's package metadata registers.
_ENV_PROBE = r"""
import importlib.metadata as md, importlib.util, json
out = {"import_error": None, "plugins": {}, "plugin_module": False}
try:
    import vllm
except Exception as exc:
    out["import_error"] = f"{type(exc).__name__}: {exc}"
for ep in md.entry_points(group=__GROUP__):
    out["plugins"][ep.name] = ep.value
try:
    out["plugin_module"] = importlib.util.find_spec("avbench.vllm_plugin") is not None
except ModuleNotFoundError:
    pass
print("AVBENCH-DOCTOR " + json.dumps(out))
""".replace("__GROUP__", repr(PLUGIN_GROUP))


def run_doctor(opts: DoctorOptions) -> list[Check]:
    checks = [
        Check("python", "ok", f"Python {sys.version.split()[0]}, avbench {__version__}"),
    ]
    suite, pair, sweep, suite_check = _suite(opts)
    if suite_check:
        checks.append(suite_check)
    install, vllm_checks = _vllm(opts.python)
    checks += vllm_checks
    checks.append(_gpus(install))
    if pair is not None and pair.gpus_per_server > 1:
        checks.append(gpu_count_check(pair, visible_gpus(_nvidia_smi() or [])))
    if install is not None and install.distribution is not None and not install.is_cpu_build:
        drivers = [line.rsplit(",", 1)[-1].strip() for line in _nvidia_smi() or []]
        if drivers:
            checks.append(driver_check(drivers, _torch_cuda(opts.python)))
    if install is not None and install.distribution is not None:
        checks.append(_av(install, pair))
        checks.append(_plugin(opts.python, sweep))
    if suite is not None:
        checks += _workloads(suite, sweep)
    checks.append(_browser())
    checks.append(_disk(opts.results))
    if pair is not None and sweep is not None and install and install.distribution:
        checks += _preflight(suite, pair, sweep, opts.python)
    if pair is not None and install and install.distribution:
        checks.append(_sanity(pair, opts))
    return checks


def _suite(opts: DoctorOptions):
    from avbench.inputs.suite import load_suite

    try:
        suite = load_suite(opts.suites)
        pair = suite.pair(opts.pair) if opts.pair else None
        sweep_name = opts.sweep or (pair.default_sweep if pair else None)
        sweep = suite.sweep(sweep_name) if sweep_name else None
    except AvbenchError as exc:
        return None, None, None, Check("suite", "problem", str(exc), "fix the suite file")
    return suite, pair, sweep, None


def _vllm(python: str):
    from avbench.serving.server import probe_vllm

    try:
        install = probe_vllm(python)
    except ServerError as exc:
        return None, [Check("vllm", "problem", str(exc), "pass --vllm-python PYTHON_WITH_VLLM")]
    if install.distribution is None:
        return install, [
            Check(
                "vllm",
                "problem",
                f"vLLM is not installed for {python}",
                "make setup (CPU build) or pip install 'avbench[vllm]' (GPU build), or pass "
                "--vllm-python; a sweep can still attach to a running server (--endpoint)",
            )
        ]
    build = "CPU build" if install.is_cpu_build else "GPU build"
    return install, [
        Check("vllm", "ok", f"{install.distribution} {install.version} ({build}) at {python}")
    ]


def _nvidia_smi() -> list[str] | None:
    """GPU lines from nvidia-smi, or None when it is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run(
            [exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    return [line.strip() for line in res.stdout.splitlines() if line.strip()]


def _gpus(install) -> Check:
    gpus = _nvidia_smi()
    gpu_build = (
        install is not None and install.distribution is not None and not install.is_cpu_build
    )
    if not gpus:
        why = (
            "nvidia-smi not found"
            if shutil.which("nvidia-smi") is None
            else "nvidia-smi lists none"
        )
        if gpu_build:
            return Check(
                "gpus",
                "problem",
                f"no GPU ({why}) but vLLM is the GPU build",
                "run on a GPU machine, or install the CPU build (make setup)",
            )
        return Check("gpus", "ok", f"no GPU ({why}); CPU-only machine")
    detail = f"{len(gpus)} GPU(s): " + "; ".join(gpus)
    if install is not None and install.is_cpu_build:
        return Check(
            "gpus",
            "warn",
            detail + " but vLLM is the CPU build",
            "pip install 'avbench[vllm]' to use them",
        )
    return Check("gpus", "ok", detail)


def visible_gpus(gpus: list[str], env: dict[str, str] | None = None) -> int:
    """How many of nvidia-smi's GPUs a server started from here sees (CUDA_VISIBLE_DEVICES)."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return len(gpus)
    return min(len(gpus), len([d for d in visible.split(",") if d.strip()]))


def gpu_count_check(pair, gpus: int) -> Check:
    """A server of ``pair`` takes TP x PP x DP GPUs: with fewer, vLLM fails at start."""
    need = pair.gpus_per_server
    shape = f"TP {pair.tensor_parallel} x PP {pair.pipeline_parallel} x DP {pair.data_parallel}"
    if gpus < need:
        return Check(
            "gpu count",
            "problem",
            f"pair {pair.name} needs {need} GPUs per server ({shape}); this machine has "
            f"{gpus} visible",
            f"run on a machine with {need} GPUs, or lower the pair's tensor_parallel, "
            "pipeline_parallel or data_parallel in pairs.toml",
        )
    return Check("gpu count", "ok", f"pair {pair.name}: {need} GPUs per server ({shape}) of {gpus}")


# Runs in the vLLM interpreter: the CUDA version its torch was built for, read from
# torch/version.py without importing torch.
_TORCH_CUDA_PROBE = r"""
import importlib.util, os, re
spec = importlib.util.find_spec("torch")
where = list(spec.submodule_search_locations or []) if spec else []
path = os.path.join(where[0], "version.py") if where else ""
text = open(path).read() if os.path.exists(path) else ""
m = re.search(r"^cuda\b[^=]*=\s*'([0-9.]+)'", text, re.M)
print(m.group(1) if m else "")
"""


def _torch_cuda(python: str) -> str | None:
    try:
        res = subprocess.run(
            [python, "-c", _TORCH_CUDA_PROBE], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() or None


def driver_check(drivers: list[str], cuda: str | None) -> Check:
    """Is every GPU's NVIDIA driver new enough for the CUDA release vLLM's torch is built for?"""
    if cuda is None:
        return Check(
            "nvidia driver",
            "warn",
            f"driver {', '.join(sorted(set(drivers)))}; the vLLM interpreter's torch is not a "
            "CUDA build, so vLLM cannot use these GPUs",
            "install the GPU build (pip install 'avbench[vllm]')",
        )
    major = int(cuda.split(".")[0])
    need = MIN_DRIVER_BRANCH.get(major, max(MIN_DRIVER_BRANCH.values()))
    old = [d for d in drivers if int(d.split(".")[0]) < need]
    if old:
        return Check(
            "nvidia driver",
            "problem",
            f"driver {', '.join(sorted(set(old)))} is older than CUDA {cuda} (vLLM's torch) "
            f"needs: branch {need} or newer",
            f"update the NVIDIA driver to {need} or newer",
        )
    return Check(
        "nvidia driver",
        "ok",
        f"driver {', '.join(sorted(set(drivers)))} runs CUDA {cuda} (needs {need} or newer)",
    )


def _av(install, pair) -> Check:
    from avbench.inputs.suite import Pair
    from avbench.plan.cells import Arm
    from avbench.serving.server import check_arm_supported

    # Without a pair, ask about a plain draft-model pair: the answer depends on vLLM alone.
    pair = pair or Pair(name="any", target="any", method="draft_model", max_k=1)
    try:
        check_arm_supported(pair, Arm("av", pair.max_k), install)
    except UnsupportedArm as exc:
        return Check(
            "adaptive verification",
            "warn",
            f"not supported here: {exc}",
            "AV arms are reported unsupported; run on a GPU with vLLM >= 0.33.0",
        )
    return Check("adaptive verification", "ok", f"supported by vLLM {install.version}")


def _plugin(python: str, sweep) -> Check:
    capture = list(getattr(sweep, "capture", None) or [])
    needed = f" (sweep {sweep.name} captures {', '.join(capture)})" if capture else ""
    miss: Status = "problem" if capture else "warn"
    fix = (
        "pip install -e . (or pip install avbench) into the vLLM interpreter: the entry point "
        "ships in avbench's package metadata"
    )
    try:
        res = subprocess.run(
            [python, "-c", _ENV_PROBE],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env=os.environ | {"HF_HUB_OFFLINE": "1"},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Check("vllm plugin", miss, f"cannot ask {python}: {exc}{needed}", fix)
    line = next(
        (x for x in reversed(res.stdout.splitlines()) if x.startswith("AVBENCH-DOCTOR ")), None
    )
    if line is None:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return Check("vllm plugin", miss, f"{python} could not be asked: {tail}{needed}", fix)
    info = json.loads(line.split(" ", 1)[1])
    if info["import_error"]:
        return Check(
            "vllm plugin",
            "problem",
            f"`import vllm` fails in {python}: {info['import_error']}",
            "reinstall vLLM (make setup, or pip install 'avbench[vllm]')",
        )
    target = info["plugins"].get(PLUGIN_NAME)
    if target is None:
        return Check(
            "vllm plugin",
            miss,
            f"entry point {PLUGIN_NAME!r} is not registered in group {PLUGIN_GROUP} for "
            f"{python}: captures (refits, drafts) will be empty{needed}",
            fix,
        )
    if target != PLUGIN_TARGET or not info["plugin_module"]:
        return Check(
            "vllm plugin",
            miss,
            f"entry point {PLUGIN_NAME!r} points at {target!r}, which {python} cannot import "
            f"(expected {PLUGIN_TARGET}){needed}",
            fix,
        )
    return Check("vllm plugin", "ok", f"{PLUGIN_GROUP}: {PLUGIN_NAME} = {target}")


def _workloads(suite, sweep) -> list[Check]:
    from avbench.workloads.registry import LOADERS

    names = list(sweep.workloads) if sweep else sorted(suite.workloads)
    missing: list[str] = []
    previous = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # the question is what loads without the hub
    try:
        for name in names:
            spec = suite.workloads[name]
            try:
                LOADERS[spec.dataset].load(spec)
            except Exception as exc:  # any loader failure means "not available offline"
                missing.append(f"{name} ({str(exc).splitlines()[0][:160]})")
    finally:
        if previous is None:
            del os.environ["HF_HUB_OFFLINE"]
        else:
            os.environ["HF_HUB_OFFLINE"] = previous
    scope = f"sweep {sweep.name}" if sweep else "suite"
    if not missing:
        return [Check("workloads", "ok", f"{len(names)} of the {scope} load offline")]
    status: Status = "problem" if sweep else "warn"
    return [
        Check(
            "workloads",
            status,
            f"not available offline: {m}",
            "prepare it (`avbench workloads show NAME`) or set its data_dir",
        )
        for m in missing
    ]


def _browser() -> Check:
    from avbench.report.page import find_browser

    path = find_browser()
    if path is None:
        return Check(
            "browser",
            "warn",
            "no Chromium for static figures (HTML reports still work)",
            "apt-get install chromium, or set BROWSER_PATH",
        )
    return Check("browser", "ok", f"static figures via {path}")


def _disk(results: Path) -> Check:
    probe = Path(results).resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_gib = shutil.disk_usage(probe).free / 2**30
    detail = f"{free_gib:.1f} GiB free for {results}"
    if free_gib < MIN_FREE_GIB:
        return Check("disk", "problem", detail, "free space or pass --results elsewhere")
    if free_gib < LOW_FREE_GIB:
        return Check("disk", "warn", detail, "a long sweep with captures may need more")
    return Check("disk", "ok", detail)


def _preflight(suite, pair, sweep, python: str) -> list[Check]:
    from avbench.checks.preflight import Target, preflight
    from avbench.plan.cells import arms_for

    targets = [Target(pair, a, suite.root / "pairs.toml", sweep) for a in arms_for(pair, sweep)]
    try:
        report = preflight(targets, python)
    except AvbenchError as exc:
        return [Check("pre-flight", "problem", str(exc).splitlines()[0])]
    if report.problems:
        return [
            Check("pre-flight", "problem", p.line(), "edit the pair (or sweep) in the suite files")
            for p in report.problems
        ]
    skipped = f"; {len(report.unsupported)} unsupported here" if report.unsupported else ""
    vllm = f"{report.install.distribution} {report.install.version}"
    refused = [
        Check(
            "adaptive verification",
            "warn",
            f"pair {pair.name}: {reason}",
            "the sweep reports the arm unsupported and starts no server for it",
        )
        for reason in (r.reason(vllm) for r in report.av_start)
        if reason is not None
    ]
    return [
        Check(
            "pre-flight",
            "ok",
            f"pair {pair.name}, sweep {sweep.name}: {len(report.checked)} arm command lines "
            f"parse with {vllm}{skipped}",
        ),
        *refused,
    ]


def weights_gib(target: str | None) -> float | None:
    """GiB of weight files in a local checkpoint directory; None when it is not one."""
    path = Path(target) if target else None
    if path is None or not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.rglob("*") if f.suffix in _WEIGHT_SUFFIXES) / 2**30


def _sanity(pair, opts: DoctorOptions) -> Check:
    """The acceptance sanity check, opt-in: it starts a vLLM server (about a minute here)."""
    name = "acceptance sanity"
    run_it = f"avbench sanity --pair {pair.name}"
    if not opts.sanity:
        return Check(name, "ok", f"not run (`{run_it}`, or doctor --sanity: the target drafting "
                                 "for itself must accept every draft)")  # fmt: skip
    size = weights_gib(pair.resolve(pair.target))
    if size is None or size > SANITY_MAX_WEIGHTS_GIB:
        what = "not a local checkpoint" if size is None else f"{size:.1f} GiB of weights"
        return Check(name, "warn", f"pair {pair.name}'s target is {what}: not served here",
                     f"run `{run_it}` on the serving machine")  # fmt: skip
    from avbench.checks.sanity import SanityOptions, run_sanity

    try:
        result = run_sanity(
            SanityOptions(pair.name, suites=opts.suites, python=opts.python), opts.progress
        )
    except AvbenchError as exc:
        return Check(name, "problem", str(exc).splitlines()[0], f"run `{run_it}`")
    if result.verdict.ok:
        return Check(name, "ok", result.verdict.line)
    return Check(name, "problem", result.verdict.line, "see docs/cpu-sampler.md")


def exit_code(checks: list[Check]) -> int:
    """1 when a sweep would fail (any problem), else 0."""
    return 1 if any(c.status == "problem" for c in checks) else 0
