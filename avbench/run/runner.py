"""The sweep: for each arm, start its server, run its cells, store every number, stop it.

Data flow: suite → plan (cells) → server arm → load driver → records → metrics → store.
A failed arm or cell is recorded with its reason and the sweep goes on; Ctrl-C stops the
server group before the exception leaves; --resume reruns only what did not finish.

A cell is stored as measured only when it was: if its server died during it (or stopped
answering), or more than the sweep's ``max_failed_share`` of its requests failed, it is a failed
cell (failures.jsonl, records kept aside under requests/failed/), rerun by --resume. A server
that stalls (no progress on any in-flight request for the sweep's ``timeouts.stall_s``) fails
its cell as "server stalled" and the arm's remaining cells at once; a cell past
``timeouts.cell_s`` fails as "cell deadline" and the arm goes on.

Everything that can be checked without a server is checked before the first one starts: the
options, the plan, every row of each workload's data, and, attached, the server's /tokenize
when a synthetic workload needs it.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import queue
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
from pydantic import SecretStr, ValidationError

from avbench.errors import AvbenchError, ServerError, StoreError, UnsupportedArm, save_traceback
from avbench.inputs.checks import check_api_key, check_endpoint, check_port, check_positive
from avbench.inputs.suite import MAX_PARALLEL, Pair, Sweep
from avbench.inputs.workload import WorkloadSpec
from avbench.plan.cells import Arm, Cell, build_plan
from avbench.plan.gpus import GpuSet, Session, check_inventory, plan_waves, visible_gpus
from avbench.run.arm_session import ArmSession, Failed, SweepOutcome, SweepRun
from avbench.run.cell_run import CellSettings, Target
from avbench.run.progress import Event, ForwardingReporter, SweepReporter, replay
from avbench.serving.capture import arm_capture, settings_for
from avbench.serving.cpu_layout import apply, layout_for, release
from avbench.serving.server import (
    Launch,
    ServerProcess,
    VllmInstall,
    arm_server,
    build_command,
    build_env,
    check_arm_supported,
    missing_checkpoints,
    probe_vllm,
    redact,
    require_free_port,
    require_vllm,
    wave_ports,
)
from avbench.store.artefacts import (
    SCHEMA_VERSION,
    ArmEntry,
    CpuLayoutEntry,
    PlacementEntry,
    Provenance,
    SweepInputs,
    SweepManifest,
    dump_manifest,
    manifest_problem,
)
from avbench.store.cellrow import ProvenancePart
from avbench.store.failures import FailureKind
from avbench.store.run_store import (
    RunStore,
    check_results_dir,
    check_run_id,
    git_commit,
    host_info,
    new_run_id,
    utcnow,
    versions,
)

if TYPE_CHECKING:
    from avbench.serving.capture import ArmCapture
    from avbench.workloads.registry import LoadedWorkload


@dataclass
class SweepOptions:
    pair: Pair
    sweep: Sweep
    workloads: dict[str, WorkloadSpec]
    results_dir: Path = Path("results")
    run_id: str | None = None
    port: int = 8000
    host: str = "127.0.0.1"
    endpoint: str | None = None  # attach to a running server instead of launching
    attach_arm: Arm | None = None
    attach_gpus: int | None = None
    api_key: SecretStr | None = None
    vllm_python: str = sys.executable
    ready_timeout_s: float | None = None
    cpu_seed_fix: bool = True  # off: the stock CPU build's seeded prefill rewind (build_env)
    served_model: str | None = None  # attach: what the endpoint serves (found by the probe)
    capture_dir: Path | None = None  # attach: where that server's avbench plugin writes
    # Arm -> reason, for arms the pre-flight found this vLLM would refuse at start (its AV
    # start-up checks: avbench.checks.av_start); never started, reported unsupported.
    refused_arms: dict[str, str] = field(default_factory=dict)
    gpus: GpuSet | None = None  # launched: the host's GPUs the arms share (None: all visible)
    isolate: list[str] = field(default_factory=list)  # arms measured with no other beside them


# ----------------------------------------------------------------------------- entry points
def start_sweep(
    opts: SweepOptions,
    reporter: SweepReporter | None = None,
    backend: SessionBackend | None = None,
) -> SweepOutcome:
    """Create a new run directory and run every cell of the plan (``backend``: where the arm
    sessions run; default this host, side by side on its GPUs)."""
    reporter = reporter or SweepReporter()
    install = check_new_run(opts, _servers_here(backend))
    if opts.endpoint is not None:
        opts.served_model = probe_endpoint(opts)
        probe_tokenizer(opts)
    plan = build_plan(opts.pair, opts.sweep, _attached_arms(opts))
    run_id = opts.run_id or new_run_id(opts.pair.name)
    secrets = _secrets(opts)
    manifest = SweepManifest(
        schema_version=SCHEMA_VERSION,
        run_id=run_id,
        status="running",
        mode="attach" if opts.endpoint else "managed",
        endpoint=opts.endpoint,
        served_model=opts.served_model,
        pair=opts.pair.model_dump(mode="json"),
        sweep=opts.sweep.model_dump(mode="json"),
        workloads={w: opts.workloads[w].model_dump(mode="json") for w in opts.sweep.workloads},
        arms=_describe_arms(opts, plan, install, secrets),
        plan=plan,
        gpus_per_server=_gpus(opts),
        versions=versions(
            install.distribution if install else None, install.version if install else None
        ),
        host=host_info(),
        git_commit=git_commit(),
        provenance=Provenance.model_validate(
            measurement_provenance(opts.endpoint or f"http://{opts.host}:{opts.port}")
        ),
        command=redact(" ".join(sys.argv), secrets),
        started_at=utcnow(),
        ended_at=None,
        workload_sources={},
    )
    store = RunStore.create(opts.results_dir, run_id, manifest)
    return _execute(store, opts, plan, install, reporter, backend)


def resume_sweep(
    run_dir: Path,
    opts_override: dict[str, Any],
    reporter: SweepReporter | None = None,
    backend: SessionBackend | None = None,
) -> SweepOutcome:
    """Rerun every cell of a stored plan that has no finished row (failed ones included)."""
    reporter = reporter or SweepReporter()
    store = RunStore.open(run_dir)
    try:
        m = SweepInputs.model_validate(dump_manifest(store.read_manifest()))
    except ValidationError as exc:
        raise StoreError(f"{store.manifest_path}: {manifest_problem(exc)}") from None
    opts = SweepOptions(
        pair=m.pair,
        sweep=m.sweep,
        workloads=m.workloads,
        results_dir=store.root.parent,
        run_id=m.run_id,
        endpoint=m.endpoint,
        **opts_override,
    )
    if opts.endpoint and m.attach_arm is not None:
        opts.attach_arm = m.attach_arm
        opts.attach_gpus = m.gpus_per_server
    plan = m.plan
    _check_options(opts)
    store.require_writable()
    install = None
    if opts.endpoint is None:
        install = probe_vllm(opts.vllm_python)
        require_vllm(install)
        if _servers_here(backend):
            require_free_port(opts.port, opts.host)
    else:
        opts.served_model = probe_endpoint(opts)
        probe_tokenizer(opts)
    store.update_manifest(status="running", resumed_at=utcnow())
    if opts.endpoint is None:
        store.end_placements()  # the sessions of the run's last invocation are over
    return _execute(store, opts, plan, install, reporter, backend)


# ----------------------------------------------------------------------------- internals
def _servers_here(backend: SessionBackend | None) -> bool:
    """Whether the servers listen on this host's ``--port`` (a Ray task takes a free port of
    its node)."""
    return backend is None or backend.name == "local"


def check_new_run(opts: SweepOptions, servers_here: bool = True) -> VllmInstall | None:
    """Everything about a new run that can be checked without a server: options, results
    directory, run id, and (launching) the vLLM install and, ``servers_here``, the port.
    Returns the install."""
    _check_options(opts)
    build_plan(opts.pair, opts.sweep, _attached_arms(opts))  # duplicate cells, no arms, ...
    check_results_dir(opts.results_dir)
    if opts.run_id is not None:
        check_run_id(opts.run_id)
    if opts.endpoint is not None:
        return None
    install = probe_vllm(opts.vllm_python)
    require_vllm(install)
    if servers_here:
        require_free_port(opts.port, opts.host)
    return install


def _attached_arms(opts: SweepOptions) -> list[Arm] | None:
    """Attached: the one arm the server runs; launched: None (the plan's arms)."""
    return [opts.attach_arm or Arm("static", opts.pair.max_k)] if opts.endpoint else None


def _check_options(opts: SweepOptions) -> None:
    """The options a library caller or the CLI passed: one line naming the bad one."""
    check_port(opts.port)
    check_positive(opts.ready_timeout_s, "--ready-timeout")
    if opts.api_key is not None:
        check_api_key(opts.api_key.get_secret_value())
    if opts.attach_gpus is not None and not 1 <= opts.attach_gpus <= MAX_PARALLEL:
        raise AvbenchError(f"--gpus: expected 1-{MAX_PARALLEL}, got {opts.attach_gpus}")
    if opts.gpus is not None:
        pair = opts.pair
        shape = f"pair {pair.name} (TP {pair.tensor_parallel} x PP {pair.pipeline_parallel} x DP {pair.data_parallel})"
        check_inventory(opts.gpus, pair.gpus_per_server, shape)
    if opts.endpoint is not None:
        opts.endpoint = check_endpoint(opts.endpoint)
    if opts.attach_arm is not None and opts.attach_arm.k > opts.pair.max_k:
        raise AvbenchError(
            f"--arm {opts.attach_arm.name}: K={opts.attach_arm.k} is above max_k "
            f"{opts.pair.max_k} of pair {opts.pair.name}"
        )
    from avbench.workloads.registry import check_workload

    for name in opts.sweep.workloads:  # a missing data_dir, SPEED-Bench offline, bad rows
        check_workload(opts.workloads[name])


def probe_endpoint(opts: SweepOptions) -> str:
    """Before anything is measured or stored: the endpoint answers /v1/models, accepts the key,
    and serves the pair's model. Returns the served model name."""
    url = f"{opts.endpoint}/v1/models"
    try:
        r = httpx.get(url, headers=_auth_headers(opts), timeout=10)
    except httpx.ConnectError as exc:
        raise ServerError(
            f"--endpoint {opts.endpoint}: cannot connect ({exc}); is the server running?"
        ) from None
    except httpx.TimeoutException:
        raise ServerError(
            f"--endpoint {opts.endpoint}: no answer to GET {url} within 10 s"
        ) from None
    except httpx.HTTPError as exc:
        raise ServerError(
            f"--endpoint {opts.endpoint}: does not speak HTTP like an OpenAI-compatible server "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if r.status_code in (401, 403):
        which = "the API key was refused" if opts.api_key else "it wants an API key"
        raise ServerError(
            f"--endpoint {opts.endpoint}: HTTP {r.status_code} from /v1/models: {which} "
            "(--api-key or OPENAI_API_KEY)"
        )
    try:
        r.raise_for_status()
        models = [m["id"] for m in r.json()["data"]]
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
        raise ServerError(
            f"--endpoint {opts.endpoint}: GET /v1/models did not list models (HTTP "
            f"{r.status_code}: {str(exc)[:120]}); is it an OpenAI-compatible server?"
        ) from None
    want = opts.pair.served_model_name
    served = ", ".join(models) or "none"
    if want is not None and want not in models:
        raise ServerError(
            f"--endpoint {opts.endpoint}: model {want!r} (--model, or pair {opts.pair.name}'s "
            f"served_model_name) is not served; it serves: {served}"
        )
    if not models:
        raise ServerError(f"--endpoint {opts.endpoint}: /v1/models lists no model")
    if want is None and len(models) > 1:
        raise ServerError(
            f"--endpoint {opts.endpoint}: serves several models ({served}); choose one with --model"
        )
    return want or models[0]


def _local_tokenizer(opts: SweepOptions) -> str | None:
    """The target's directory when it is local: its tokenizer counts and makes prompts."""
    target = opts.pair.resolve(opts.pair.target)
    return target if target and Path(target).is_dir() else None


def _served_tokenizer(opts: SweepOptions, name: str) -> bool:
    """Whether workload ``name`` makes its prompts with the server's /tokenize."""
    return opts.workloads[name].dataset == "synthetic" and _local_tokenizer(opts) is None


def probe_tokenizer(opts: SweepOptions) -> None:
    """Attached with a synthetic workload and no local tokenizer: the endpoint must answer
    vLLM's POST /tokenize, or every cell would fail making its prompts."""
    if not any(_served_tokenizer(opts, w) for w in opts.sweep.workloads):
        return
    url = f"{opts.endpoint}/tokenize"
    body = {"model": opts.served_model, "prompt": "avbench"}
    try:
        r = httpx.post(url, json=body, headers=_auth_headers(opts), timeout=10)
        ok = r.status_code == 200 and isinstance(r.json().get("tokens"), list)
        why = f"HTTP {r.status_code}"
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        ok, why = False, type(exc).__name__
    if not ok:
        raise ServerError(
            f"--endpoint {opts.endpoint}: POST /tokenize did not tokenize ({why}); a synthetic "
            "workload needs vLLM's /tokenize, or a local tokenizer directory (--tokenizer DIR)"
        )


def measurement_provenance(base_url: str) -> dict[str, str | None]:
    """How this run's numbers are measured (manifest and every cell): docs/measurement.md."""
    from avbench import __version__
    from avbench.loadgen.provenance import client_provenance

    return client_provenance(base_url) | {
        "avbench_version": __version__,
        "avbench_commit": git_commit(),
    }


def _secrets(opts: SweepOptions) -> list[str]:
    return [opts.api_key.get_secret_value()] if opts.api_key else []


def _gpus(opts: SweepOptions) -> int:
    return opts.attach_gpus or opts.pair.gpus_per_server


def _describe_arms(
    opts: SweepOptions, plan: list[Cell], install: VllmInstall | None, secrets: list[str]
) -> list[ArmEntry]:
    out = []
    for name in dict.fromkeys(c.arm for c in plan):
        arm = Arm.parse(name)
        d: dict[str, Any] = {"name": name, "kind": arm.kind, "k": arm.k}
        if opts.endpoint:
            d["endpoint"] = opts.endpoint
        else:
            cmd = build_command(
                opts.pair,
                arm,
                port=opts.port,
                host=opts.host,
                python=opts.vllm_python,
                sweep=opts.sweep,
            )
            env = build_env(opts.pair, arm, None, opts.sweep, cpu_seed_fix=opts.cpu_seed_fix)
            d["command"] = [redact(x, secrets) for x in cmd]
            d["env"] = env | ({"VLLM_API_KEY": "***"} if secrets else {})
            capture = settings_for(opts.pair, opts.sweep)
            if capture is not None and arm.kind != "baseline":
                d["capture"] = {
                    "kinds": list(capture.kinds),
                    "draft_fraction": capture.draft_fraction,
                }
            assert install is not None  # launched: check_new_run probed it
            reason = unsupported_reason(opts, arm, install)
            d["supported"], d["unsupported_reason"] = reason is None, reason
        out.append(ArmEntry.model_validate(d))
    return out


def _install_sigterm():
    """SIGTERM (e.g. from CI or `kill`) takes the same clean path as Ctrl-C.

    Returns the previous handler so the caller can put it back."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not in the main thread
        return None


def _execute(
    store: RunStore,
    opts: SweepOptions,
    plan: list[Cell],
    install,
    reporter: SweepReporter,
    backend: SessionBackend | None,
) -> SweepOutcome:
    previous_sigterm = _install_sigterm()
    outcome = SweepOutcome(store=store)
    reporter.run_started(store.root)
    for text in capture_warnings(opts, install):
        reporter.warning(text)
    secrets = _secrets(opts)
    backend = backend or HostBackend(opts)
    try:
        run = _sweep_run(store, opts, plan, reporter, outcome)
        todo: list[tuple[Session, list[Cell]]] = []
        for (repeat, arm_name), group in itertools.groupby(plan, key=lambda c: (c.repeat, c.arm)):
            cells = list(group)
            left = [c for c in cells if c.id not in run.finished]
            outcome.skipped += len(cells) - len(left)
            if left:
                session = Session(arm_name, repeat, _gpus(opts), arm_name in opts.isolate)
                todo.append((session, left))
        cells_of = {(s.arm, s.repeat): cells for s, cells in todo}
        for wave in plan_waves([s for s, _ in todo], backend.inventory()):
            ports = wave_ports(opts.port, len(wave.placements), opts.host)
            jobs = [
                SessionJob(
                    opts=replace(opts, port=ports[slot]),
                    root=store.root,
                    plan=plan,
                    arm=p.session.arm,
                    repeat=p.session.repeat,
                    cells=cells_of[(p.session.arm, p.session.repeat)],
                    install=install,
                    gpus=p.gpus,
                    backend=backend.name,
                )
                for slot, p in enumerate(wave.placements)
            ]
            if len(jobs) == 1 and backend.name == "local":
                _run_session(run, jobs[0])
            else:
                _run_wave(run, backend, jobs)
    except KeyboardInterrupt:
        store.update_manifest(status="interrupted", ended_at=utcnow(), counts=outcome.counts())
        raise
    except AvbenchError as exc:  # e.g. disk full mid-run: say why in the manifest if it fits
        _mark_failed(store, outcome, str(exc))
        raise
    except Exception as exc:
        exc.avbench_traceback = save_traceback(exc, store.root, secrets)  # type: ignore[attr-defined]
        _mark_failed(store, outcome, redact(f"{type(exc).__name__}: {exc}", secrets))
        raise
    finally:
        reporter.close()
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
    status = "finished" if not outcome.failed else "finished_with_failures"
    store.update_manifest(status=status, ended_at=utcnow(), counts=outcome.counts())
    return outcome


def _sweep_run(
    store: RunStore,
    opts: SweepOptions,
    plan: list[Cell],
    reporter: SweepReporter,
    outcome: SweepOutcome,
) -> SweepRun:
    return SweepRun(
        store=store,
        settings=_cell_settings(opts),
        workloads=_WorkloadCache(opts, store, plan),
        reporter=reporter,
        outcome=outcome,
        secrets=_secrets(opts),
        provenance=ProvenancePart(**measurement_provenance(_base_url(opts))),
        finished=store.finished_cells(),
    )


# ----------------------------------------------------------------------------- arm sessions
@dataclass(frozen=True)
class SessionJob:
    """One arm session (an arm's cells of one repeat) with everything a process other than
    the sweep's needs to run it: the sweep's options (the port its server gets), the run
    directory it stores into, the whole plan (each workload is loaded for all of it, so every
    arm gets the same prompts) and the GPUs its server gets."""

    opts: SweepOptions
    root: Path
    plan: list[Cell]
    arm: str
    repeat: int
    cells: list[Cell]
    install: VllmInstall | None
    gpus: GpuSet
    backend: str  # where it runs: PlacementEntry.backend


@dataclass(frozen=True)
class SessionResult:
    """What a session run away from the sweep's process measured, failed and skipped."""

    finished: list[dict]
    failed: list[dict]
    unsupported: list[dict]
    skipped: int  # found measured when it started (a re-run task: what its first try stored)


class SessionBackend(Protocol):
    """Where a wave's sessions run: this host's processes, or Ray tasks."""

    name: str  # "local" (alone in avbench's process, else processes side by side) or "ray"

    def inventory(self) -> GpuSet:
        """The GPUs the waves are planned on."""
        ...

    def run_wave(
        self, jobs: Sequence[SessionJob], on_event: Callable[[Event], None]
    ) -> list[SessionResult | None]:
        """Run the sessions at once, passing their progress events on as they come; each
        one's result, None where it was lost (its process, task or node gone)."""
        ...


def run_session(job: SessionJob, put: Callable[[Event], None]) -> SessionResult:
    """A session in a process of its own (beside other arms, or a Ray task): its own load
    driver and event loop, the run directory's store, progress sent through ``put``. Cells
    already stored are skipped, so a session re-run after its process was lost resumes."""
    store = RunStore.open(job.root)
    outcome = SweepOutcome(store=store)
    run = _sweep_run(store, job.opts, job.plan, ForwardingReporter(put), outcome)
    left = [c for c in job.cells if c.id not in run.finished]
    _run_session(run, replace(job, cells=left))
    return SessionResult(
        outcome.finished, outcome.failed, outcome.unsupported, len(job.cells) - len(left)
    )


def _run_session(run: SweepRun, job: SessionJob) -> None:
    """The session's cells on its server, its placement (host, GPUs, span) in the manifest."""
    if not job.cells:
        return
    if job.opts.endpoint:  # someone else's server: no host or GPUs of ours to record
        _run_arm(run, job.opts, Arm.parse(job.arm), job.cells, job.install, job.gpus)
        return
    placement = PlacementEntry(
        arm=job.arm,
        repeat=job.repeat,
        cells=[c.id for c in job.cells],
        host=socket.gethostname(),
        gpus=list(job.gpus.ids),
        started_at=utcnow("microseconds"),
        backend=job.backend,
    )
    run.store.end_placements(job.arm, job.repeat)  # a lost try of this session (Ray re-runs)
    run.store.record_placement(placement)
    try:
        _run_arm(run, job.opts, Arm.parse(job.arm), job.cells, job.install, job.gpus)
    finally:
        run.store.record_placement(
            placement.model_copy(update={"ended_at": utcnow("microseconds")})
        )


def _run_wave(run: SweepRun, backend: SessionBackend, jobs: list[SessionJob]) -> None:
    """Sessions side by side; what each stored joins the sweep's outcome. A lost one's cells
    without a row fail as such (--resume reruns them)."""
    results = backend.run_wave(jobs, lambda event: replay(event, run.reporter))
    outcome = run.outcome
    for result in results:
        if result is not None:
            outcome.finished += result.finished
            outcome.failed += result.failed
            outcome.unsupported += result.unsupported
            outcome.skipped += result.skipped
    run.finished.update(run.store.finished_cells())
    for job, result in zip(jobs, results, strict=True):
        if result is None:
            run.store.end_placements(job.arm, job.repeat)
            lost = [c for c in job.cells if c.id not in run.finished]
            where = "its own process" if job.backend == "local" else f"its {job.backend} task"
            why = f"{job.arm}: the arm's session ({where}) was lost before its cells finished"
            run.fail(Arm.parse(job.arm), lost, Failed(FailureKind.ARM_LOST, why, arm_note=why))


class HostBackend:
    """This host: a wave of one session runs in avbench's process, a wider wave one process
    per session (spawned: no state of the sweep's threads is inherited)."""

    name = "local"

    def __init__(self, opts: SweepOptions) -> None:
        self.opts = opts

    def inventory(self) -> GpuSet:
        if self.opts.endpoint:
            return GpuSet()
        return self.opts.gpus if self.opts.gpus is not None else visible_gpus()

    def run_wave(
        self, jobs: Sequence[SessionJob], on_event: Callable[[Event], None]
    ) -> list[SessionResult | None]:
        ctx = multiprocessing.get_context("spawn")
        events = ctx.Queue()
        procs = [
            ctx.Process(
                target=_session_process,
                args=(i, replace(job, backend="process"), events),
                name=f"avbench-{job.arm}",
            )
            for i, job in enumerate(jobs)
        ]
        results: list[SessionResult | None] = [None] * len(jobs)
        errors: list[Exception] = []
        try:
            for proc in procs:
                proc.start()
            while any(p.is_alive() for p in procs) or not events.empty():
                try:
                    event = events.get(timeout=0.2)
                except queue.Empty:
                    continue
                if event[0] == _RESULT:
                    index, result = event[1]
                    results[index] = result
                elif event[0] == _ERROR:
                    errors.append(event[1])
                else:
                    on_event(event)
        finally:
            for proc in procs:  # Ctrl-C reached them too; SIGTERM (sent to avbench alone) not
                if proc.is_alive():
                    proc.terminate()
                proc.join()
        if errors:  # as if the session had run here: the sweep stops with its error
            raise errors[0]
        return results


_RESULT, _ERROR = "_session_result", "_session_error"


def _stop_with_the_sweep() -> None:
    """The sweep's process gone (SIGKILLed, say), this session stops as on SIGTERM, its server
    with it: no arm goes on writing into a run nobody watches (--resume would race it)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="avbench-sweep-watch", daemon=True).start()


def _session_process(index: int, job: SessionJob, events: Any) -> None:
    """A session's own process: SIGTERM from the sweep stops it as Ctrl-C does (its server
    stopped), and either leaves quietly: the sweep reports the interruption. An error goes to
    the sweep, which stops with it as it would have here (a full disk, a bug)."""
    _install_sigterm()
    _stop_with_the_sweep()
    try:
        result = run_session(job, events.put)
    except KeyboardInterrupt:
        events.cancel_join_thread()  # a sweep gone reads no more: exit without flushing to it
        return
    except AvbenchError as exc:
        events.put((_ERROR, exc))
        return
    except Exception as exc:  # the sweep saves its traceback; this one goes to stderr
        print(redact(traceback.format_exc(), _secrets(job.opts)), file=sys.stderr)
        events.put((_ERROR, RuntimeError(f"arm {job.arm}'s process: {type(exc).__name__}: {exc}")))
        return
    events.put((_RESULT, (index, result)))


def _cell_settings(opts: SweepOptions) -> CellSettings:
    return CellSettings(
        pair=opts.pair,
        sweep=opts.sweep,
        workloads=opts.workloads,
        api_key=opts.api_key,
        attached=opts.endpoint is not None,
        gpus=_gpus(opts),
    )


def _base_url(opts: SweepOptions) -> str:
    """Where every arm's cells go: the endpoint, or where each launched server listens."""
    return opts.endpoint.rstrip("/") if opts.endpoint else f"http://{opts.host}:{opts.port}"


def capture_warnings(opts: SweepOptions, install) -> list[str]:
    """Captures a launched GPU server will not make: Model Runner V2 reads the drafter's
    logits, which vLLM keeps only with probabilistic drafting (docs/capture.md)."""
    settings = settings_for(opts.pair, opts.sweep)
    if opts.endpoint or settings is None or "drafts" not in settings.kinds:
        return []
    if opts.sweep.draft_method == "probabilistic" or (install and install.is_cpu_build):
        return []
    return [
        f"sweep {opts.sweep.name} captures drafts, but its arms draft with vLLM's default "
        "method: on Model Runner V2 (the GPU build's default) the drafts capture needs "
        "draft_sample_method = 'probabilistic' and stays off without it (set it in the sweep)"
    ]


def _mark_failed(store: RunStore, outcome: SweepOutcome, error: str) -> None:
    """Status "failed" with the reason; when even that cannot be written (disk full) the
    manifest keeps its last consistent state, which --resume accepts."""
    try:
        store.update_manifest(
            status="failed", error=error, ended_at=utcnow(), counts=outcome.counts()
        )
    except StoreError:
        pass


def _run_arm(
    run: SweepRun, opts: SweepOptions, arm: Arm, cells: list[Cell], install, gpus: GpuSet
) -> None:
    if opts.endpoint:
        run.reporter.arm_started(arm.name, f"attached to {opts.endpoint}")
        model = opts.served_model or probe_endpoint(opts)
        target = Target(opts.endpoint.rstrip("/"), model, _auth_headers(opts))
        ArmSession(run, arm, target, arm_capture(run.store, opts, arm)).run_cells(cells)
        return
    refused = _refusal(opts, arm, install)
    if refused is not None:
        run.fail(arm, cells, refused)
        return
    capture = arm_capture(run.store, opts, arm)
    # One session serves one repeat: each repeat's server samples with its own seed, so that
    # requests without a seed of their own draw other tokens in each repeat (docs/measurement.md).
    launch = replace(_launch(run, opts, arm, capture), gpus=gpus, seed=cells[0].repeat)
    server = arm_server(opts.pair, arm, launch)
    on = f" on GPUs {gpus.cuda_visible_devices()}" if gpus.ids else ""
    run.reporter.arm_started(
        arm.name, f"starting vLLM on port {opts.port}{on} (log: {server.log_path})"
    )
    try:
        failed = _start(server, run, opts, arm)
        if failed is not None:
            run.fail(arm, cells, failed)
            return
        target = Target(server.base_url, opts.pair.model_name, _auth_headers(opts), server)
        engine = _record_engine(run.store, arm, server, run.reporter)
        ArmSession(run, arm, target, capture, engine).run_cells(cells)
    finally:
        server.stop()
        if opts.pair.engine_cpus is not None:
            release()


def unsupported_reason(opts: SweepOptions, arm: Arm, install: VllmInstall) -> str | None:
    """Why this vLLM cannot run the arm (avbench's checks, then the pre-flight's record of
    vLLM's own), or None."""
    try:
        check_arm_supported(opts.pair, arm, install)
    except UnsupportedArm as exc:
        return str(exc)
    return opts.refused_arms.get(arm.name)


def _refusal(opts: SweepOptions, arm: Arm, install) -> Failed | None:
    """Why this arm's server is not started at all, or None."""
    pair = opts.pair
    reason = unsupported_reason(opts, arm, install)
    if reason is not None:
        return Failed(FailureKind.UNSUPPORTED, reason, arm_note=f"unsupported: {reason}")
    missing = missing_checkpoints(pair, arm)
    if missing:  # vLLM would reject the command line at start (pre-flight says so first)
        reason = f"pair {pair.name}: {missing[0][1]}"
        return Failed(FailureKind.SERVER, reason, arm_note=reason)
    return None


def _launch(run: SweepRun, opts: SweepOptions, arm: Arm, capture: ArmCapture | None) -> Launch:
    return Launch(
        port=opts.port,
        log_path=run.store.arm_dir(arm.name) / "server.log",
        host=opts.host,
        python=opts.vllm_python,
        sweep=opts.sweep,
        api_key=run.secrets[0] if run.secrets else None,
        capture=(capture.settings, capture.directory) if capture is not None else None,
        ready_timeout_s=opts.ready_timeout_s,
        cpu_seed_fix=opts.cpu_seed_fix,
    )


def _start(server: ServerProcess, run: SweepRun, opts: SweepOptions, arm: Arm) -> Failed | None:
    """Start the arm's server and wait for it (pinning its engine when the pair says so);
    why the arm's cells fail when it does not come up."""
    pair = opts.pair
    try:
        server.start()
        server.wait_ready(_auth_headers(opts))
        if pair.engine_cpus is not None and server.pgid is not None:
            layout = layout_for(pair.engine_cpus, pair.name)
            pinned = apply(layout, server.pgid)
            plural = "" if pinned == 1 else "es"
            detail = f"pinned {layout.describe()} ({pinned} engine process{plural})"
            run.reporter.arm_started(arm.name, detail)
            run.store.record_cpu_layout(
                arm.name,
                CpuLayoutEntry(
                    engine_cpus=sorted(layout.engine),
                    rest_cpus=sorted(layout.rest),
                    engine_processes=pinned,
                ),
            )
    except ServerError as exc:
        reason = redact(str(exc), run.secrets)
        return Failed(FailureKind.SERVER, reason, arm_note=reason)
    return None


def _auth_headers(opts: SweepOptions) -> dict[str, str]:
    return {"Authorization": f"Bearer {opts.api_key.get_secret_value()}"} if opts.api_key else {}


def _record_engine(
    store: RunStore, arm: Arm, server: ServerProcess | None, reporter: SweepReporter
) -> dict[str, str | None]:
    """What this arm's server chose (attention backend, CUDA graphs; avbench/serving/server_log.py),
    for its manifest entry and every cell row; a warning when it differs from what the AV
    arm's OFF twin (or the twin's AV arm) chose in this run."""
    from avbench.serving.server_log import engine_choices, engine_differences

    if server is None:  # attached: someone else's server, no log
        return {}
    try:
        choices = engine_choices(server.log_text())
    except OSError:
        return {}
    manifest = store.record_engine(arm.name, choices)
    twin = {"av": "static", "static": "av"}.get(arm.kind)
    other = manifest.arm(f"{twin}-k{arm.k}")
    if twin and other and other.engine:
        off, on = (choices, other.engine) if arm.kind == "static" else (other.engine, choices)
        diff = engine_differences(off, on)
        if diff:
            reporter.warning(
                f"static-k{arm.k} (OFF) and av-k{arm.k} (ON) servers differ beyond AV: "
                f"{'; '.join(diff)}. The AV comparison includes that switch (pin the backend "
                "in the sweep's attention_backend)."
            )
    return choices


class _WorkloadCache:
    """Loads each workload once per run; every arm gets the same list in the same order."""

    def __init__(self, opts: SweepOptions, store: RunStore, plan: list[Cell]) -> None:
        self.opts, self.store, self.plan = opts, store, plan
        self._loaded: dict[str, LoadedWorkload] = {}

    def get(self, name: str, base_url: str, model: str) -> LoadedWorkload:
        """``base_url``/``model``: the server whose /tokenize a generated workload may need."""
        if name not in self._loaded:
            from avbench.workloads.registry import load_workload
            from avbench.workloads.synthetic import ServerTokenizer

            spec = self.opts.workloads[name]
            loaded = load_workload(
                spec,
                tokenizer=_local_tokenizer(self.opts),
                served=ServerTokenizer(base_url, model, _auth_headers(self.opts)),
                count=max(c.warmup + c.num_requests for c in self.plan if c.workload == name),
            )
            if not loaded.conversations:
                raise AvbenchError(f"workload {name}: no prompts left after filtering")
            self._loaded[name] = loaded
            self.store.record_workload_source(name, loaded.manifest())
        return self._loaded[name]
