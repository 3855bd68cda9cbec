"""One cell of an arm: drive its conversations against the arm's server, compute its row from
typed parts (avbench/store/cellrow.py), and judge whether it counts as measured (avbench/run/runner.py
says what a failed cell is)."""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import httpx
from pydantic import SecretStr

from avbench.errors import AvbenchError
from avbench.inputs.request import EndpointConfig, SamplingParams
from avbench.inputs.suite import Pair, Sweep
from avbench.inputs.workload import WorkloadSpec
from avbench.loadgen.records import RequestRecord
from avbench.plan.cells import Arm, Cell
from avbench.serving.prefix_cache import reset_prefix_cache
from avbench.serving.server import ServerProcess, speculative_config
from avbench.store.cellrow import ArmPart, MeasuredRow, ProvenancePart, SamplingPart, WorkloadPart
from avbench.store.failures import FailureKind
from avbench.store.run_store import RunStore
from avbench.workloads.base import Conversation

if TYPE_CHECKING:
    from avbench.loadgen.client import DriveResult, Stop
    from avbench.metrics.sequential import SequentialMonitor
    from avbench.workloads.registry import LoadedWorkload


class Workloads(Protocol):
    """Each workload loaded once per run (runner._WorkloadCache)."""

    def get(self, name: str, base_url: str, model: str) -> LoadedWorkload: ...


@dataclass(frozen=True)
class CellSettings:
    """What measuring a cell needs of the sweep's options."""

    pair: Pair
    sweep: Sweep
    workloads: dict[str, WorkloadSpec]
    api_key: SecretStr | None
    attached: bool  # someone else's server: what it runs is unknown
    gpus: int  # per server


# A dead engine's traceback follows its death line within milliseconds; 2 s covers a loaded box.
_CAUSE_WAIT_S = 2.0


@dataclass(frozen=True)
class Target:
    """The server an arm's cells are sent to."""

    base_url: str
    model: str
    headers: dict[str, str]
    server: ServerProcess | None = None  # launched by the sweep; None when attached

    def exited(self) -> bool:
        return self.server is not None and not self.server.alive()

    def log_tail(self) -> str | None:
        return self.server.log_tail() if self.server is not None else None

    def gone(self, refused: int) -> str | None:
        """Why the server is gone, or None: the launched process exited, or (refused
        connections seen) the endpoint no longer accepts connections at all."""
        if self.server is not None and not self.server.alive():
            cause = self.death_cause()
            said = f"; the server log says: {cause}" if cause else ""
            return f"vLLM server died during the cell (exit {self.server.exit_text}){said}"
        if refused:
            try:
                httpx.get(f"{self.base_url}/health", headers=self.headers, timeout=5)
            except httpx.HTTPError:
                return (
                    f"server at {self.base_url} stopped answering during the cell ({refused} "
                    "request(s) could not connect)"
                )
        return None

    def death_cause(self) -> str | None:
        """The launched server's log line that says why its engine died, or None.

        vLLM logs the death line before the traceback that names the exception, in more than
        one write: while the server lives the log is read again, for up to
        ``_CAUSE_WAIT_S``, until the exception is there."""
        if self.server is None:
            return None
        from avbench.serving.server_log import engine_death, names_exception

        deadline = time.monotonic() + _CAUSE_WAIT_S
        while True:
            try:
                cause = engine_death(self.server.log_text())
            except OSError:
                return None
            settled = cause is None or names_exception(cause) or not self.server.alive()
            if settled or time.monotonic() >= deadline:
                return cause
            time.sleep(0.1)

    def engine_dead(self) -> str | None:
        """Why the engine behind the server's HTTP front is dead, or None: its log shows the
        engine core died, or ``/health`` answers 5xx (vLLM's 503 once its engine is dead; a
        server without the route, 404, says nothing). vLLM's API server outlives its engine,
        so neither a live process nor open connections say this. A server that does not
        answer at all is left to ``gone``."""
        cause = self.death_cause()
        try:
            health = httpx.get(f"{self.base_url}/health", headers=self.headers, timeout=5)
            status = f"HTTP {health.status_code}" if health.status_code >= 500 else None
        except httpx.HTTPError as exc:
            status = f"no answer ({type(exc).__name__})"
            if cause is None:
                return None
        if cause is None and status is None:
            return None
        said = f" (GET /health: {status})" if status else ""
        if cause is None:
            return f"the server's engine is not serving{said}"
        return f"vLLM's engine died{said}; the server log says: {cause}"


@dataclass(frozen=True)
class CellContext:
    """What every cell of one arm is measured with."""

    settings: CellSettings
    arm: ArmPart  # the row's columns for the arm, the same in each of its cells
    target: Target
    provenance: ProvenancePart
    store: RunStore
    workloads: Workloads
    finished: Mapping[str, dict]  # the run's measured cells so far, by id
    on_record: Callable[[RequestRecord], None]


def arm_part(settings: CellSettings, arm: Arm, run_id: str) -> ArmPart:
    # What the launched server ran (unknown when attached to someone else's server).
    spec = None if settings.attached else speculative_config(settings.pair, arm, settings.sweep)
    return ArmPart(run_id, settings.pair.name, arm.kind, arm.k, spec, settings.gpus)


@dataclass
class CellMeasurement:
    """What one cell produced, before it is judged measured or failed."""

    row: dict
    records: list[RequestRecord]
    scrapes: dict[str, str | None]
    stop: Stop | None = None  # the drive ended early: the server stalled, or the cell deadline


@dataclass
class _Drive:
    result: DriveResult
    sampling: SamplingParams
    warm: list[Conversation]
    measured: list[Conversation]
    prefix_cache_reset: bool | None
    scrapes: dict[str, str | None] = field(default_factory=dict)
    monitor: SequentialMonitor | None = None


def measure_cell(ctx: CellContext, cell: Cell) -> CellMeasurement:
    """Drive one cell and compute its row; the caller judges it and stores it."""
    loaded = ctx.workloads.get(cell.workload, ctx.target.base_url, ctx.target.model)
    drive = _drive(ctx, cell, loaded)
    result = drive.result
    if result.stop is not None:  # a failed cell (judge_cell): nothing to compute
        counts = {"requests_ok": result.ok, "requests_failed": result.failed}
        return CellMeasurement(cell.to_dict() | counts, result.records, drive.scrapes, result.stop)
    row = _row(ctx, cell, drive, loaded)
    return CellMeasurement(row.row(), result.records, drive.scrapes)


def select_conversations(
    conversations: list[Conversation], warmup: int, n: int
) -> tuple[list[Conversation], list[Conversation]]:
    """Warmup takes the first prompts, the measured set the next n (cycling when short)."""
    total = warmup + n
    picked = list(itertools.islice(itertools.cycle(conversations), total))
    return picked[:warmup], picked[warmup:]


def cell_sampling(pair: Pair, sweep: Sweep) -> SamplingParams:
    """The sweep's sampling, with the pair's chat template arguments unless it sets its own."""
    if pair.chat_template_kwargs and sweep.sampling.chat_template_kwargs is None:
        return sweep.sampling.model_copy(update={"chat_template_kwargs": pair.chat_template_kwargs})
    return sweep.sampling


def _renderer(spec: WorkloadSpec, pair: Pair) -> Callable[[list[dict]], str] | None:
    """How a completions workload turns a conversation into its prompt (chat: None)."""
    if spec.api != "completions":
        return None
    if spec.prompt_template == "none":
        return lambda messages: messages[-1]["content"]
    from avbench.workloads.tokens import render_chat_prompt

    target = pair.resolve(pair.target)
    if target is None:
        raise AvbenchError(f"pair {pair.name}: no target whose chat template renders the prompts")
    return lambda messages: render_chat_prompt(messages, target)


class _Scrapes:
    """The server's /metrics before and after the measured window (None: no 200 answer)."""

    def __init__(self, target: Target, wait_s: float):
        self.target, self.wait_s = target, wait_s
        self.texts: dict[str, str | None] = {"before": None, "after": None}

    async def take(self, which: str) -> None:
        # A frozen server is caught by the drive's stall detector, which counts this in flight.
        async with httpx.AsyncClient(timeout=self.wait_s, headers=self.target.headers) as client:
            try:
                r = await client.get(f"{self.target.base_url}/metrics")
                self.texts[which] = r.text if r.status_code == 200 else None
            except httpx.HTTPError:
                self.texts[which] = None


def _drive(ctx: CellContext, cell: Cell, loaded: LoadedWorkload) -> _Drive:
    from avbench.loadgen.client import DriveHooks, Load, run_drive

    settings = ctx.settings
    spec = settings.workloads[cell.workload]
    warm, measured = select_conversations(loaded.conversations, cell.warmup, cell.num_requests)
    sampling = cell_sampling(settings.pair, settings.sweep)
    endpoint = EndpointConfig(
        base_url=ctx.target.base_url,
        model=ctx.target.model,
        api=spec.api,
        api_key=settings.api_key,
        timeouts=settings.sweep.timeouts,
    )
    scrapes = _Scrapes(ctx.target, settings.sweep.timeouts.read_s)
    monitor = None
    if settings.sweep.sequential is not None:
        from avbench.metrics.sequential import SequentialMonitor

        monitor = SequentialMonitor(settings.sweep.sequential)
    reset = reset_prefix_cache(ctx.target.base_url, ctx.target.headers)
    result = run_drive(
        endpoint,
        sampling,
        warm + measured,
        Load(concurrency=cell.concurrency, rate=cell.rate, warmup=len(warm)),
        DriveHooks(
            on_record=ctx.on_record,
            render_prompt=_renderer(spec, settings.pair),
            before_measure=lambda: scrapes.take("before"),
            after_measure=lambda: scrapes.take("after"),
            finish_when=monitor.observe if monitor is not None else None,
        ),
    )
    return _Drive(result, sampling, warm, measured, reset, scrapes.texts, monitor)


def _window(result: DriveResult) -> tuple[float, float]:
    if result.window_start is None or result.window_end is None:
        raise AvbenchError("the drive finished no measured request")
    return result.window_start, result.window_end


def _row(ctx: CellContext, cell: Cell, drive: _Drive, loaded: LoadedWorkload) -> MeasuredRow:
    from avbench.metrics import compute_cell_metrics

    settings, sampling = ctx.settings, drive.sampling
    spec = settings.workloads[cell.workload]
    records = [r for r in drive.result.records if not r.warmup]
    span = _window(drive.result)
    window = span[1] - span[0]
    # All of them, or the first ones of a sequential cell that stopped.
    sent = len(drive.warm) + sum(r.turn == 0 for r in records)
    metrics = compute_cell_metrics(
        records,
        window_s=window,
        gpus=settings.gpus,
        counters_before=drive.scrapes["before"],
        counters_after=drive.scrapes["after"],
        model_name=ctx.target.model,
    )
    workload = WorkloadPart(
        api=spec.api,
        input_len=spec.input_len,
        output_len=spec.output_len,
        len_range=spec.len_range if spec.dataset == "synthetic" else None,
        conversations_cycled=sent > len(loaded.conversations),
        # Same hash in every arm's cell = the same prompts in the same order.
        prompts_sha256=hashlib.sha256(
            "\n".join(c.id for c in drive.warm + drive.measured).encode()
        ).hexdigest(),
    )
    sequential: dict[str, Any] = {}
    if drive.monitor is not None:
        from avbench.metrics.sequential import sequential_columns

        sequential = sequential_columns(drive.monitor, records, span)
    notes = list(metrics.notes)
    if drive.prefix_cache_reset is not True:
        notes.append(_NOT_RESET[drive.prefix_cache_reset])
    return MeasuredRow(
        cell=cell.to_dict(),
        arm=ctx.arm,
        provenance=ctx.provenance,
        window_s=window,
        sampling=SamplingPart(sampling.temperature, sampling.top_p, sampling.max_tokens,
                              sampling.ignore_eos, sampling.chat_template_kwargs),
        workload=workload,
        metrics=metrics.values,
        metric_notes=notes or None,
        prefix_cache_reset=drive.prefix_cache_reset,
        sequential=sequential,
        per_turn=per_turn_columns(records, window, settings.gpus),
        quality=_quality(ctx, cell, records, sampling, loaded),
    )  # fmt: skip


_NOT_RESET = {
    False: "prefix cache not emptied before the cell (the engine refused: requests held blocks)",
    None: "prefix cache not emptied before the cell (the server has no avbench reset route): "
    "prefixes of earlier cells' prompts may have been cached",
}


def per_turn_columns(records: list[RequestRecord], window_s: float, gpus: int) -> dict:
    """``turn<k>_<column>`` for each turn when the cell holds more than one turn."""
    from avbench.metrics import compute_cell_metrics
    from avbench.store.cellrow import PER_TURN_COLUMNS

    turns = sorted({r.turn for r in records})
    if len(turns) < 2:
        return {}
    out: dict[str, Any] = {}
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


def _quality(
    ctx: CellContext,
    cell: Cell,
    records: list[RequestRecord],
    sampling: SamplingParams,
    loaded: LoadedWorkload,
) -> dict:
    """The output-quality guard's columns: this cell against the baseline arm's stored cell
    of the same workload, load and repeat (when the run has one), and GSM8K exact match."""
    from avbench.metrics.quality import quality_columns

    base_id = replace(cell, arm="baseline").id
    baseline = None
    if ctx.arm.arm_kind != "baseline" and base_id in ctx.finished:
        baseline = ctx.store.read_records(base_id)
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


def judge_cell(
    m: CellMeasurement, target: Target, max_failed_share: float
) -> tuple[FailureKind, str] | None:
    """(kind, reason) when the cell must not count as measured, else None."""
    if m.stop is not None and not target.exited():  # a frozen server may also refuse connections
        kind = FailureKind.SERVER_STALLED if m.stop.kind == "stalled" else FailureKind.CELL_DEADLINE
        return kind, m.stop.reason
    dead = target.engine_dead()  # first: a dying engine's API server may exit meanwhile
    if dead:
        return FailureKind.ENGINE_DIED, dead
    gone = target.gone(refused=sum(r.error_kind == "connect" for r in m.records))
    if gone:
        return FailureKind.SERVER_DIED, gone
    measured = [r for r in m.records if not r.warmup]
    failed = [r for r in measured if not r.ok]
    limit = max_failed_share
    if measured and len(failed) <= limit * len(measured) and len(failed) < len(measured):
        return None
    if not measured:
        return FailureKind.REQUESTS_FAILED, "no measured request"
    kinds: dict[str, int] = {}
    for r in failed:
        kinds[r.error_kind or "unknown"] = kinds.get(r.error_kind or "unknown", 0) + 1
    detail = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    return (
        FailureKind.REQUESTS_FAILED,
        f"{len(failed)} of {len(measured)} measured requests failed "
        f"({len(failed) / len(measured):.0%} > max_failed_share {limit:.0%}): {detail}",
    )
