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

import hashlib
import itertools
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from pydantic import SecretStr

from avbench.capture import arm_capture, capture_env, file_cell, settings_for
from avbench.cpu_layout import apply, layout_for, release
from avbench.errors import AvbenchError, ServerError, StoreError, UnsupportedArm, save_traceback
from avbench.inputs import check_api_key, check_endpoint, check_port, check_positive
from avbench.loadgen.config import EndpointConfig, SamplingParams
from avbench.plan import Arm, Cell, build_plan
from avbench.progress import SweepReporter
from avbench.records import RequestRecord
from avbench.server import (
    ServerProcess,
    build_command,
    build_env,
    check_arm_supported,
    missing_checkpoints,
    probe_vllm,
    redact,
    require_free_port,
    require_vllm,
    speculative_config,
)
from avbench.store import (
    RunStore,
    check_results_dir,
    check_run_id,
    git_commit,
    host_info,
    new_run_id,
    utcnow,
    versions,
)
from avbench.suite import MAX_PARALLEL, Pair, Sweep
from avbench.workloads.base import Conversation
from avbench.workloads.spec import WorkloadSpec

if TYPE_CHECKING:
    from avbench.loadgen.client import Stop


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
    served_model: str | None = None  # attach: what the endpoint serves (found by the probe)
    capture_dir: Path | None = None  # attach: where that server's avbench plugin writes


@dataclass
class SweepOutcome:
    store: RunStore
    finished: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    unsupported: list[dict] = field(default_factory=list)  # reported, not failures
    skipped: int = 0

    def counts(self) -> dict[str, int]:
        return {
            "measured": len(self.finished),
            "failed": len(self.failed),
            "unsupported": len(self.unsupported),
            "already_done": self.skipped,
        }


@dataclass
class CellMeasurement:
    """What one cell produced, before it is judged measured or failed."""

    row: dict
    records: list[RequestRecord]
    scrapes: dict[str, str | None]
    stop: Stop | None = None  # the drive ended early: the server stalled, or the cell deadline


# ----------------------------------------------------------------------------- entry points
def start_sweep(opts: SweepOptions, reporter: SweepReporter | None = None) -> SweepOutcome:
    """Create a new run directory and run every cell of the plan."""
    reporter = reporter or SweepReporter()
    install = check_new_run(opts)
    if opts.endpoint is not None:
        opts.served_model = probe_endpoint(opts)
        probe_tokenizer(opts)
    plan = build_plan(opts.pair, opts.sweep, _attached_arms(opts))
    run_id = opts.run_id or new_run_id(opts.pair.name)
    secrets = _secrets(opts)
    manifest = {
        "run_id": run_id,
        "status": "running",
        "mode": "attach" if opts.endpoint else "managed",
        "endpoint": opts.endpoint,
        "served_model": opts.served_model,  # attach: the model checked on /v1/models
        "pair": opts.pair.model_dump(mode="json"),
        "sweep": opts.sweep.model_dump(mode="json"),
        "workloads": {w: opts.workloads[w].model_dump(mode="json") for w in opts.sweep.workloads},
        "arms": _describe_arms(opts, plan, install, secrets),
        "plan": [c.to_dict() for c in plan],
        "gpus_per_server": _gpus(opts),
        "versions": versions(
            install.distribution if install else None, install.version if install else None
        ),
        "host": host_info(),
        "git_commit": git_commit(),
        "provenance": measurement_provenance(opts.endpoint or f"http://{opts.host}:{opts.port}"),
        "command": redact(" ".join(sys.argv), secrets),
        "started_at": utcnow(),
        "ended_at": None,
        "workload_sources": {},
    }
    store = RunStore.create(opts.results_dir, run_id, manifest)
    return _execute(store, opts, plan, install, reporter)


def resume_sweep(
    run_dir: Path, opts_override: dict, reporter: SweepReporter | None = None
) -> SweepOutcome:
    """Rerun every cell of a stored plan that has no finished row (failed ones included)."""
    reporter = reporter or SweepReporter()
    store = RunStore.open(run_dir)
    m = store.read_manifest()
    try:
        opts = SweepOptions(
            pair=Pair.model_validate(m["pair"]),
            sweep=Sweep.model_validate(m["sweep"]),
            workloads={k: WorkloadSpec.model_validate(v) for k, v in m["workloads"].items()},
            results_dir=store.root.parent,
            run_id=m["run_id"],
            endpoint=m.get("endpoint"),
            **opts_override,
        )
        if opts.endpoint and m["arms"]:
            a = m["arms"][0]
            opts.attach_arm = Arm(a["kind"], a["k"])
            opts.attach_gpus = m.get("gpus_per_server")
        plan = [Cell(**{k: v for k, v in c.items() if k != "cell_id"}) for c in m["plan"]]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise StoreError(f"{store.manifest_path}: {_manifest_problem(exc)}") from None
    _check_options(opts)
    store.require_writable()
    install = None
    if opts.endpoint is None:
        install = probe_vllm(opts.vllm_python)
        require_vllm(install)
        require_free_port(opts.port, opts.host)
    else:
        opts.served_model = probe_endpoint(opts)
        probe_tokenizer(opts)
    store.update_manifest(status="running", resumed_at=utcnow())
    return _execute(store, opts, plan, install, reporter)


# ----------------------------------------------------------------------------- internals
def _manifest_problem(exc: Exception) -> str:
    """One line for a manifest that does not describe a run this avbench can resume."""
    from pydantic import ValidationError

    if isinstance(exc, KeyError):
        return f"not a sweep manifest (no {exc.args[0]!r} key)"
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        return f"{exc.title.lower()}.{loc}: {err['msg']} (a manifest from another avbench?)"
    return f"not a sweep manifest ({exc})"


def check_new_run(opts: SweepOptions):
    """Everything about a new run that can be checked without a server: options, results
    directory, run id, and (launching) the vLLM install and the port. Returns the install."""
    _check_options(opts)
    build_plan(opts.pair, opts.sweep, _attached_arms(opts))  # duplicate cells, no arms, ...
    check_results_dir(opts.results_dir)
    if opts.run_id is not None:
        check_run_id(opts.run_id)
    if opts.endpoint is not None:
        return None
    install = probe_vllm(opts.vllm_python)
    require_vllm(install)
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


def _describe_arms(opts, plan, install, secrets) -> list[dict]:
    out = []
    for name in dict.fromkeys(c.arm for c in plan):
        arm = Arm.parse(name)
        d: dict = {"name": name, "kind": arm.kind, "k": arm.k}
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
            env = build_env(opts.pair, arm, None, opts.sweep)
            d["command"] = [redact(x, secrets) for x in cmd]
            d["env"] = env | ({"VLLM_API_KEY": "***"} if secrets else {})
            capture = settings_for(opts.pair, opts.sweep)
            if capture is not None and arm.kind != "baseline":
                d["capture"] = {
                    "kinds": list(capture.kinds),
                    "draft_fraction": capture.draft_fraction,
                }
            try:
                check_arm_supported(opts.pair, arm, install)
                d["supported"], d["unsupported_reason"] = True, None
            except UnsupportedArm as exc:
                d["supported"], d["unsupported_reason"] = False, str(exc)
        out.append(d)
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
    store: RunStore, opts: SweepOptions, plan: list[Cell], install, reporter: SweepReporter
) -> SweepOutcome:
    previous_sigterm = _install_sigterm()
    outcome = SweepOutcome(store=store)
    reporter.run_started(store.root)
    for text in capture_warnings(opts, install):
        reporter.warning(text)
    secrets = _secrets(opts)
    try:
        finished = store.finished_cells()
        workloads = _WorkloadCache(opts, store, plan)
        for (_repeat, arm_name), group in itertools.groupby(plan, key=lambda c: (c.repeat, c.arm)):
            cells = list(group)
            todo = [c for c in cells if c.id not in finished]
            outcome.skipped += len(cells) - len(todo)
            if todo:
                _run_arm(
                    store,
                    opts,
                    Arm.parse(arm_name),
                    todo,
                    install,
                    workloads,
                    secrets,
                    reporter,
                    outcome,
                )
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


def _fail_cells(store, cells, reason, kind, reporter, outcome) -> None:
    """Record every cell of an arm that could not run; the arm's failure was already shown."""
    for c in cells:
        row = c.to_dict() | {"reason": reason, "failure_kind": kind}
        store.write_failure(row)
        (outcome.unsupported if kind == "unsupported" else outcome.failed).append(row)


def _run_arm(store, opts, arm, cells, install, workloads, secrets, reporter, outcome) -> None:
    pair = opts.pair
    headers = _auth_headers(opts)
    if opts.endpoint:
        reporter.arm_started(arm.name, f"attached to {opts.endpoint}")
        base_url = opts.endpoint.rstrip("/")
        model = opts.served_model or probe_endpoint(opts)
        capture = arm_capture(store, opts, arm)
        _run_cells(
            store, opts, arm, cells, base_url, model, None, workloads, reporter, outcome, capture
        )
        return
    try:
        check_arm_supported(pair, arm, install)
    except UnsupportedArm as exc:
        reporter.arm_failed(arm.name, f"unsupported: {exc}")
        _fail_cells(store, cells, str(exc), "unsupported", reporter, outcome)
        return
    missing = missing_checkpoints(pair, arm)
    if missing:  # vLLM would reject the command line at start (pre-flight says so first)
        reason = f"pair {pair.name}: {missing[0][1]}"
        reporter.arm_failed(arm.name, reason)
        _fail_cells(store, cells, reason, "server", reporter, outcome)
        return
    arm_dir = store.arm_dir(arm.name)
    env = build_env(pair, arm, secrets[0] if secrets else None, opts.sweep)
    capture = arm_capture(store, opts, arm)
    if capture is not None:
        env |= capture_env(capture.settings, capture.directory, env)
    server = ServerProcess(
        cmd=build_command(
            pair, arm, port=opts.port, host=opts.host, python=opts.vllm_python, sweep=opts.sweep
        ),
        env=env,
        port=opts.port,
        host=opts.host,
        log_path=arm_dir / "server.log",
        secrets=secrets,
        ready_timeout_s=opts.ready_timeout_s or pair.ready_timeout_s,
    )
    reporter.arm_started(arm.name, f"starting vLLM on port {opts.port} (log: {server.log_path})")
    try:
        try:
            server.start()
            server.wait_ready(headers)
            if pair.engine_cpus is not None:
                layout = layout_for(pair.engine_cpus, pair.name)
                pinned = apply(layout, server.pgid)
                detail = f"pinned {layout.describe()} ({pinned} engine processes)"
                reporter.arm_started(arm.name, detail)
        except ServerError as exc:
            reason = redact(str(exc), secrets)
            reporter.arm_failed(arm.name, reason)
            _fail_cells(store, cells, reason, "server", reporter, outcome)
            return
        _run_cells(
            store,
            opts,
            arm,
            cells,
            server.base_url,
            pair.model_name,
            server,
            workloads,
            reporter,
            outcome,
            capture=capture,
        )
    finally:
        server.stop()
        if pair.engine_cpus is not None:
            release()


def _auth_headers(opts: SweepOptions) -> dict[str, str]:
    return {"Authorization": f"Bearer {opts.api_key.get_secret_value()}"} if opts.api_key else {}


def _run_cells(
    store, opts, arm, cells, base_url, model, server, workloads, reporter, outcome, capture=None
) -> None:
    secrets = _secrets(opts)
    engine = _record_engine(store, arm, server, reporter)
    for i, cell in enumerate(cells):
        if server is not None and not server.alive():
            reason = f"vLLM server died during the arm (exit code {server.exit_code})"
            reporter.arm_failed(arm.name, reason + "; last log lines:\n" + server.log_tail())
            for c in cells[i:]:
                row = c.to_dict() | {"reason": reason, "failure_kind": "server_died"}
                store.write_failure(row | {"log_tail": server.log_tail()})
                outcome.failed.append(row)
            return
        reporter.cell_started(cell)
        cell_started = time.time()
        try:
            measured = run_cell(store, opts, arm, cell, base_url, model, workloads, reporter)
        except (KeyboardInterrupt, StoreError):
            raise
        except Exception as exc:  # one bad cell must not lose the others
            died = _server_gone(server, base_url, opts, refused=0)
            reason = died or redact(f"{type(exc).__name__}: {exc}", secrets)
            detail = redact(traceback.format_exc(limit=6), secrets)
            row = cell.to_dict() | {
                "reason": reason,
                "failure_kind": "server_died" if died else "cell",
                "traceback": detail,
            }
            store.write_failure(row | _log_tail(server))
            outcome.failed.append(row)
            reporter.cell_failed(cell, reason)
            if died and server is None:
                _fail_cells(store, cells[i + 1 :], died, "server_died", reporter, outcome)
                return
            continue
        verdict = judge_cell(measured, server, base_url, opts)
        if verdict is None:
            measured.row |= engine
            if capture is not None:
                measured.row |= _file_capture(store, cell, capture, cell_started, measured)
            store.write_cell(measured.row, measured.records, measured.scrapes)
            outcome.finished.append(measured.row)
            reporter.cell_finished(cell, measured.row)
            continue
        kind, reason = verdict
        counts = {k: measured.row.get(k) for k in ("requests_ok", "requests_failed")}
        row = cell.to_dict() | {"reason": reason, "failure_kind": kind} | counts
        store.write_failed_cell(row | _log_tail(server), measured.records)
        outcome.failed.append(row)
        reporter.cell_failed(cell, reason)
        # A stalled server is not waited for again; attached, a dead one cannot be restarted.
        if kind == "server_stalled" or (kind == "server_died" and server is None):
            if kind == "server_stalled":
                reporter.arm_failed(arm.name, f"{reason}; the arm's remaining cells are not run")
            _fail_cells(store, cells[i + 1 :], reason, kind, reporter, outcome)
            return


def _record_engine(store: RunStore, arm: Arm, server, reporter: SweepReporter) -> dict:
    """What this arm's server chose (attention backend, CUDA graphs; avbench/server_log.py),
    for its manifest entry and every cell row; a warning when it differs from what the AV
    arm's OFF twin (or the twin's AV arm) chose in this run."""
    from avbench.server_log import engine_choices, engine_differences

    if server is None:  # attached: someone else's server, no log
        return {}
    try:
        choices = engine_choices(server.log_path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return {}
    arms = store.read_manifest().get("arms") or []
    for a in arms:
        if a.get("name") == arm.name:
            a["engine"] = choices
    store.update_manifest(arms=arms)
    twin = {"av": "static", "static": "av"}.get(arm.kind)
    other = next((a for a in arms if a.get("name") == f"{twin}-k{arm.k}"), None)
    if twin and other and other.get("engine"):
        off, on = (choices, other["engine"]) if arm.kind == "static" else (other["engine"], choices)
        diff = engine_differences(off, on)
        if diff:
            reporter.warning(
                f"static-k{arm.k} (OFF) and av-k{arm.k} (ON) servers differ beyond AV: "
                f"{'; '.join(diff)}. The AV comparison includes that switch (pin the backend "
                "in the sweep's attention_backend)."
            )
    return choices


def _file_capture(store, cell, capture, cell_started: float, measured) -> dict:
    """The cell's live captures (avbench/capture.py); a capture problem never loses the cell."""
    ids = [r.response_id for r in measured.records if not r.warmup and r.response_id]
    try:
        return file_cell(store.root, cell.id, cell.workload, capture, cell_started, ids)
    except (AvbenchError, OSError) as exc:
        return {"capture": list(capture.settings.kinds), "capture_failed": str(exc)[:300]}


def _log_tail(server: ServerProcess | None) -> dict:
    return {"log_tail": server.log_tail()} if server is not None else {}


def _server_gone(server, base_url: str, opts: SweepOptions, refused: int) -> str | None:
    """Why the server is gone, or None: the launched process exited, or (refused
    connections seen) the endpoint no longer accepts connections at all."""
    if server is not None and not server.alive():
        return f"vLLM server died during the cell (exit code {server.exit_code})"
    if refused:
        try:
            httpx.get(f"{base_url}/health", headers=_auth_headers(opts), timeout=5)
        except httpx.HTTPError:
            return (
                f"server at {base_url} stopped answering during the cell ({refused} "
                "request(s) could not connect)"
            )
    return None


def judge_cell(
    m: CellMeasurement, server: ServerProcess | None, base_url: str, opts: SweepOptions
) -> tuple[str, str] | None:
    """(failure_kind, reason) when the cell must not count as measured, else None."""
    exited = server is not None and not server.alive()
    if m.stop is not None and not exited:  # a frozen server may also refuse connections
        return ("server_stalled" if m.stop.kind == "stalled" else "cell_deadline"), m.stop.reason
    refused = sum(r.error_kind == "connect" for r in m.records)
    gone = _server_gone(server, base_url, opts, refused)
    if gone:
        return "server_died", gone
    measured = [r for r in m.records if not r.warmup]
    failed = [r for r in measured if not r.ok]
    limit = opts.sweep.max_failed_share
    if measured and len(failed) <= limit * len(measured) and len(failed) < len(measured):
        return None
    kinds: dict[str, int] = {}
    for r in failed:
        kinds[r.error_kind or "unknown"] = kinds.get(r.error_kind or "unknown", 0) + 1
    detail = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    if not measured:
        return "requests_failed", "no measured request"
    return (
        "requests_failed",
        f"{len(failed)} of {len(measured)} measured requests failed "
        f"({len(failed) / len(measured):.0%} > max_failed_share {limit:.0%}): {detail}",
    )


class _WorkloadCache:
    """Loads each workload once per run; every arm gets the same list in the same order."""

    def __init__(self, opts: SweepOptions, store: RunStore, plan: list[Cell]):
        self.opts, self.store, self.plan, self._loaded = opts, store, plan, {}

    def get(self, name: str, base_url: str, model: str):
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
            m = self.store.read_manifest()
            sources = m.get("workload_sources") or {}
            sources[name] = loaded.manifest()
            self.store.update_manifest(workload_sources=sources)
        return self._loaded[name]


def select_conversations(
    conversations: list[Conversation], warmup: int, n: int
) -> tuple[list[Conversation], list[Conversation]]:
    """Warmup takes the first prompts, the measured set the next n (cycling when short)."""
    total = warmup + n
    picked = list(itertools.islice(itertools.cycle(conversations), total))
    return picked[:warmup], picked[warmup:]


def per_turn_columns(records, window_s: float, gpus: int) -> dict:
    """``turn<k>_<column>`` for each turn when the cell holds more than one turn."""
    from avbench.cellrow import PER_TURN_COLUMNS
    from avbench.metrics import compute_cell_metrics

    turns = sorted({r.turn for r in records})
    if len(turns) < 2:
        return {}
    out = {}
    for t in turns:
        m = compute_cell_metrics(
            [r for r in records if r.turn == t],
            window_s=window_s,
            gpus=gpus,
            counters_before=None,
            counters_after=None,
        )
        out |= {f"turn{t + 1}_{c}": m.values.get(c) for c in PER_TURN_COLUMNS}
    return out


def run_cell(store, opts, arm, cell, base_url, model, workloads, reporter) -> CellMeasurement:
    """Drive one cell and compute its row; the caller judges it and stores it."""
    from avbench.loadgen.client import DriveHooks, Load, run_drive
    from avbench.metrics import compute_cell_metrics

    loaded = workloads.get(cell.workload, base_url, model)
    spec = opts.workloads[cell.workload]
    warm, measured = select_conversations(loaded.conversations, cell.warmup, cell.num_requests)
    sampling: SamplingParams = opts.sweep.sampling
    if opts.pair.chat_template_kwargs and sampling.chat_template_kwargs is None:
        sampling = sampling.model_copy(
            update={"chat_template_kwargs": opts.pair.chat_template_kwargs}
        )
    endpoint = EndpointConfig(
        base_url=base_url,
        model=model,
        api=spec.api,
        api_key=opts.api_key,
        timeouts=opts.sweep.timeouts,
    )
    render = None
    if spec.api == "completions" and spec.prompt_template == "none":
        render = lambda messages: messages[-1]["content"]  # noqa: E731
    elif spec.api == "completions":
        from avbench.workloads.registry import render_chat_prompt

        target = opts.pair.resolve(opts.pair.target)
        render = lambda messages: render_chat_prompt(messages, target)  # noqa: E731

    scrapes: dict[str, str | None] = {"before": None, "after": None}
    headers = _auth_headers(opts)

    async def scrape(which: str) -> None:
        # A frozen server is caught by the drive's stall detector, which counts this in flight.
        wait = opts.sweep.timeouts.read_s
        async with httpx.AsyncClient(timeout=wait, headers=headers) as client:
            try:
                r = await client.get(f"{base_url}/metrics")
                scrapes[which] = r.text if r.status_code == 200 else None
            except httpx.HTTPError:
                scrapes[which] = None

    monitor = None
    if opts.sweep.sequential is not None:
        from avbench.metrics.sequential import SequentialMonitor

        monitor = SequentialMonitor(opts.sweep.sequential)
    result = run_drive(
        endpoint,
        sampling,
        warm + measured,
        Load(concurrency=cell.concurrency, rate=cell.rate, warmup=len(warm)),
        DriveHooks(
            on_record=reporter.request_done,
            render_prompt=render,
            before_measure=lambda: scrape("before"),
            after_measure=lambda: scrape("after"),
            finish_when=monitor.observe if monitor is not None else None,
        ),
    )
    records = result.records
    if result.stop is not None:  # a failed cell (judge_cell): nothing to compute
        counts = {"requests_ok": result.ok, "requests_failed": result.failed}
        return CellMeasurement(cell.to_dict() | counts, records, scrapes, result.stop)
    measured_records = [r for r in records if not r.warmup]
    window = result.window_end - result.window_start
    # All of them, or the first ones of a sequential cell that stopped.
    conversations_sent = len(warm) + sum(r.turn == 0 for r in measured_records)
    metrics = compute_cell_metrics(
        measured_records,
        window_s=window,
        gpus=_gpus(opts),
        counters_before=scrapes["before"],
        counters_after=scrapes["after"],
        model_name=model,
    )
    row = cell.to_dict() | {
        "run_id": store.root.name,
        "pair": opts.pair.name,
        "arm_kind": arm.kind,
        "k": arm.k,
        # What the launched server ran (unknown when attached to someone else's server).
        "speculative_config": None
        if opts.endpoint
        else speculative_config(opts.pair, arm, opts.sweep),
        "gpus": _gpus(opts),
        **measurement_provenance(base_url),
        "window_s": window,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
        "input_len": spec.input_len,
        "output_len": spec.output_len,
        "len_range": spec.len_range if spec.dataset == "synthetic" else None,
        "ignore_eos": sampling.ignore_eos,
        "chat_template_kwargs": sampling.chat_template_kwargs,
        "api": spec.api,
        "conversations_cycled": conversations_sent > len(loaded.conversations),
        # Same hash in every arm's cell = the same prompts in the same order.
        "prompts_sha256": hashlib.sha256(
            "\n".join(c.id for c in warm + measured).encode()
        ).hexdigest(),
        "per_position_note": (
            "unconditional accepted/drafts; under AV 'not accepted' mixes trimmed and rejected"
            if arm.kind == "av"
            else "unconditional accepted/drafts"
        ),
        "acceptance_rate_per": None
        if arm.kind == "baseline"
        else ("scheduled draft" if arm.kind == "av" else "verified draft"),
    }
    row |= metrics.values
    row["metric_notes"] = list(metrics.notes) or None
    if monitor is not None:
        from avbench.metrics.sequential import sequential_columns

        span = (result.window_start, result.window_end)
        row |= sequential_columns(monitor, measured_records, span)
    row |= per_turn_columns(measured_records, window, _gpus(opts))
    row |= _quality(store, arm, cell, measured_records, sampling, loaded)
    return CellMeasurement(row, records, scrapes)


def _quality(store, arm, cell, records, sampling, loaded) -> dict:
    """The output-quality guard's columns: this cell against the baseline arm's stored cell
    of the same workload, load and repeat (when the run has one), and GSM8K exact match."""
    from dataclasses import replace

    from avbench.metrics.quality import quality_columns

    base_id = replace(cell, arm="baseline").id
    baseline = None
    if arm.kind != "baseline" and base_id in store.finished_cells():
        baseline = store.read_records(base_id)
    refs = None
    if loaded.spec.dataset == "gsm8k":
        refs = {c.id: c.reference for c in loaded.conversations}
    return quality_columns(
        records,
        baseline=baseline,
        baseline_cell_id=base_id if baseline is not None else None,
        temperature=sampling.temperature,
        references=refs,
    )
