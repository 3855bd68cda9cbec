"""The sweep: for each arm, start its server, run its cells, store every number, stop it.

Data flow: suite → plan (cells) → server arm → load driver → records → metrics → store.
A failed arm or cell is recorded with its reason and the sweep goes on; Ctrl-C stops the
server group before the exception leaves; --resume reruns only what did not finish.
"""

from __future__ import annotations

import hashlib
import itertools
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from pydantic import SecretStr

from avbench.errors import AvbenchError, ServerError, UnsupportedArm
from avbench.loadgen.config import EndpointConfig, SamplingParams
from avbench.plan import Arm, Cell, build_plan
from avbench.progress import SweepReporter
from avbench.server import (
    ServerProcess,
    build_command,
    build_env,
    check_arm_supported,
    probe_vllm,
    redact,
    require_free_port,
    require_vllm,
)
from avbench.store import RunStore, git_commit, host_info, new_run_id, utcnow, versions
from avbench.suite import Pair, Sweep
from avbench.workloads.base import Conversation
from avbench.workloads.spec import WorkloadSpec


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
    request_timeout_s: float = 600.0


@dataclass
class SweepOutcome:
    store: RunStore
    finished: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    skipped: int = 0


# ----------------------------------------------------------------------------- entry points
def start_sweep(opts: SweepOptions, reporter: SweepReporter | None = None) -> SweepOutcome:
    """Create a new run directory and run every cell of the plan."""
    reporter = reporter or SweepReporter()
    install = None
    if opts.endpoint is None:
        install = probe_vllm(opts.vllm_python)
        require_vllm(install)
        require_free_port(opts.port, opts.host)
    arms = [opts.attach_arm or Arm("static", opts.pair.max_k)] if opts.endpoint else None
    plan = build_plan(opts.pair, opts.sweep, arms)
    run_id = opts.run_id or new_run_id(opts.pair.name)
    secrets = _secrets(opts)
    manifest = {
        "run_id": run_id,
        "status": "running",
        "mode": "attach" if opts.endpoint else "managed",
        "endpoint": opts.endpoint,
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
    install = None
    if opts.endpoint is None:
        install = probe_vllm(opts.vllm_python)
        require_vllm(install)
    plan = [Cell(**{k: v for k, v in c.items() if k != "cell_id"}) for c in m["plan"]]
    store.update_manifest(status="running", resumed_at=utcnow())
    return _execute(store, opts, plan, install, reporter)


# ----------------------------------------------------------------------------- internals
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
                opts.pair, arm, port=opts.port, host=opts.host, python=opts.vllm_python
            )
            env = build_env(opts.pair, arm, None)
            d["command"] = [redact(x, secrets) for x in cmd]
            d["env"] = env | ({"VLLM_API_KEY": "***"} if secrets else {})
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
    finished = store.finished_cells()
    workloads = _WorkloadCache(opts, store)
    secrets = _secrets(opts)
    try:
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
        store.update_manifest(status="interrupted", ended_at=utcnow())
        raise
    finally:
        reporter.close()
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
    status = "finished" if not outcome.failed else "finished_with_failures"
    store.update_manifest(status=status, ended_at=utcnow())
    return outcome


def _fail_cells(store, cells, reason, kind, reporter, outcome) -> None:
    """Record every cell of an arm that could not run; the arm's failure was already shown."""
    for c in cells:
        row = c.to_dict() | {"reason": reason, "failure_kind": kind}
        store.write_failure(row)
        outcome.failed.append(row)


def _run_arm(store, opts, arm, cells, install, workloads, secrets, reporter, outcome) -> None:
    pair = opts.pair
    headers = _auth_headers(opts)
    if opts.endpoint:
        reporter.arm_started(arm.name, f"attached to {opts.endpoint}")
        base_url = opts.endpoint.rstrip("/")
        model = pair.served_model_name or _discover_model(base_url, headers)
        _run_cells(store, opts, arm, cells, base_url, model, None, workloads, reporter, outcome)
        return
    try:
        check_arm_supported(pair, arm, install)
    except UnsupportedArm as exc:
        reporter.arm_failed(arm.name, f"unsupported: {exc}")
        _fail_cells(store, cells, str(exc), "unsupported", reporter, outcome)
        return
    arm_dir = store.arm_dir(arm.name)
    server = ServerProcess(
        cmd=build_command(pair, arm, port=opts.port, host=opts.host, python=opts.vllm_python),
        env=build_env(pair, arm, secrets[0] if secrets else None),
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
        )
    finally:
        server.stop()


def _auth_headers(opts: SweepOptions) -> dict[str, str]:
    return {"Authorization": f"Bearer {opts.api_key.get_secret_value()}"} if opts.api_key else {}


def _discover_model(base_url: str, headers: dict) -> str:
    try:
        r = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=10)
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise ServerError(
            f"{base_url}/v1/models: cannot discover the served model ({exc})"
        ) from None


def _run_cells(
    store, opts, arm, cells, base_url, model, server, workloads, reporter, outcome
) -> None:
    for i, cell in enumerate(cells):
        if server is not None and not server.alive():
            reason = "vLLM server died during the arm; last log lines:\n" + server.log_tail()
            reporter.arm_failed(arm.name, reason)
            _fail_cells(store, cells[i:], reason, "server", reporter, outcome)
            return
        reporter.cell_started(cell)
        try:
            row = run_cell(store, opts, arm, cell, base_url, model, workloads, reporter)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # one bad cell must not lose the others
            reason = redact(f"{type(exc).__name__}: {exc}", _secrets(opts))
            detail = redact(traceback.format_exc(limit=6), _secrets(opts))
            row = cell.to_dict() | {"reason": reason, "failure_kind": "cell", "traceback": detail}
            store.write_failure(row)
            outcome.failed.append(row)
            reporter.cell_failed(cell, reason)
            continue
        outcome.finished.append(row)
        reporter.cell_finished(cell, row)


class _WorkloadCache:
    """Loads each workload once per run; every arm gets the same list in the same order."""

    def __init__(self, opts: SweepOptions, store: RunStore):
        self.opts, self.store, self._loaded = opts, store, {}

    def get(self, name: str):
        if name not in self._loaded:
            from avbench.workloads.registry import load_workload

            spec = self.opts.workloads[name]
            target = self.opts.pair.resolve(self.opts.pair.target)
            tokenizer = target if target and Path(target).is_dir() else None
            loaded = load_workload(spec, tokenizer=tokenizer)
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


# Latency and volume columns repeated per turn for multi-turn workloads (MT-Bench): a second
# turn has a longer prompt (the first answer is in it), so its TTFT is not the first turn's.
PER_TURN_COLUMNS = (
    "requests_ok",
    "requests_failed",
    "output_tokens",
    "ttft_ms_median",
    "ttft_ms_p90",
    "tpot_ms_median",
    "itl_ms_median",
    "e2e_ms_median",
)


def per_turn_columns(records, window_s: float, gpus: int) -> dict:
    """``turn<k>_<column>`` for each turn when the cell holds more than one turn."""
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


def run_cell(store, opts, arm, cell, base_url, model, workloads, reporter) -> dict:
    from avbench.loadgen.client import run_drive
    from avbench.metrics import compute_cell_metrics

    loaded = workloads.get(cell.workload)
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
        request_timeout_s=opts.request_timeout_s,
    )
    render = None
    if spec.api == "completions":
        from avbench.workloads.registry import render_chat_prompt

        target = opts.pair.resolve(opts.pair.target)
        render = lambda messages: render_chat_prompt(messages, target)  # noqa: E731

    scrapes: dict[str, str | None] = {"before": None, "after": None}
    headers = _auth_headers(opts)

    async def scrape(which: str) -> None:
        async with httpx.AsyncClient(timeout=30, headers=headers) as client:
            try:
                r = await client.get(f"{base_url}/metrics")
                scrapes[which] = r.text if r.status_code == 200 else None
            except httpx.HTTPError:
                scrapes[which] = None

    result = run_drive(
        endpoint,
        sampling,
        warm + measured,
        concurrency=cell.concurrency,
        rate=cell.rate,
        warmup=len(warm),
        on_record=reporter.request_done,
        render_prompt=render,
        before_measure=lambda: scrape("before"),
        after_measure=lambda: scrape("after"),
    )
    records = result.records
    measured_records = [r for r in records if not r.warmup]
    window = result.window_end - result.window_start
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
        "gpus": _gpus(opts),
        "window_s": window,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
        "ignore_eos": sampling.ignore_eos,
        "chat_template_kwargs": sampling.chat_template_kwargs,
        "api": spec.api,
        "conversations_cycled": cell.num_requests + cell.warmup > len(loaded.conversations),
        # Same hash in every arm's cell = the same prompts in the same order.
        "prompts_sha256": hashlib.sha256(
            "\n".join(c.id for c in warm + measured).encode()
        ).hexdigest(),
        "per_position_note": (
            "unconditional accepted/drafts; under AV 'not accepted' mixes trimmed and rejected"
            if arm.kind == "av"
            else "unconditional accepted/drafts"
        ),
    }
    row |= metrics.values
    row["metric_notes"] = list(metrics.notes) or None
    row |= per_turn_columns(measured_records, window, _gpus(opts))
    store.write_cell(row, records, scrapes)
    return row
