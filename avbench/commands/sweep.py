"""`avbench sweep`: one request, checked once, to the runner's `SweepOptions`; then the summary."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import model_validator

from avbench.commands.request import (
    RATES_HELP,
    IntList,
    NameList,
    RateList,
    Request,
    Suites,
    VllmPython,
    command,
)
from avbench.errors import AvbenchError

if TYPE_CHECKING:
    from pydantic import SecretStr
    from rich.console import Console

    from avbench.inputs.suite import Pair, Sweep, SweepUpdate
    from avbench.inputs.workload import WorkloadSpec
    from avbench.plan.cells import Arm
    from avbench.plan.gpus import GpuSet
    from avbench.run.progress import RichReporter
    from avbench.run.runner import SessionBackend, SweepOptions, SweepOutcome

SEQUENTIAL = "Sequential cells: "
Opt = typer.Option


class SweepRequest(Request):
    """What `avbench sweep` was asked: a new run (by pair, or attached to --endpoint) or
    --resume of a stored one."""

    pair: Annotated[str | None, Opt("--pair", help="Pair id (see `avbench pairs`)")] = None
    sweep: Annotated[str | None, Opt("--sweep", help="Sweep id (default: the pair's)")] = None
    suites: Suites = None
    resume: Annotated[Path | None, Opt("--resume", help="Run directory to complete")] = None
    results: Annotated[
        Path | None, Opt("--results", help="Results directory (default: results)")
    ] = None
    run_id: Annotated[str | None, Opt("--run-id")] = None
    port: Annotated[
        int,
        Opt(
            help="Port for the launched vLLM server (arms side by side: the next ones too; "
            "--ray: a free port of each task's node)"
        ),
    ] = 8000
    endpoint: Annotated[
        str | None, Opt(help="Attach to a running server (http://host:port) instead")
    ] = None
    arm: Annotated[
        str, Opt(help="With --endpoint: what the server runs (baseline, static-k3, av-k8)")
    ] = ""
    gpus: Annotated[
        str | None,
        Opt(
            help="Launched: this host's GPUs the arms' servers share, as many arms at once as "
            "fit on disjoint GPUs (0-7, 0,2,5; default all visible); with --endpoint: how "
            "many GPUs are behind the server"
        ),
    ] = None
    isolate: Annotated[
        NameList,
        Opt(help="Arms measured with no other arm on the host, e.g. av-k8,static-k8"),
    ] = None
    ray: Annotated[
        str | None,
        Opt(
            "--ray",
            help="Run each arm as a task of this Ray cluster (its address, or 'local': one on "
            "this machine), requesting its GPUs; needs pip install 'avbench[ray]'",
        ),
    ] = None
    api_key: Annotated[
        str | None,
        Opt("--api-key", help="API key; visible in `ps`: prefer --api-key-file or OPENAI_API_KEY"),
    ] = None
    api_key_file: Annotated[
        Path | None, Opt("--api-key-file", help="File holding the API key; never stored")
    ] = None
    model: Annotated[
        str | None, Opt(help="With --endpoint: served model (default: the one /v1/models lists)")
    ] = None
    tokenizer: Annotated[
        Path | None,
        Opt(help="Local tokenizer dir for synthetic prompts (default: server /tokenize)"),
    ] = None
    workloads: Annotated[
        NameList, Opt("--workloads", "--workload", help="Comma-separated workload ids")
    ] = None
    concurrencies: Annotated[IntList, Opt(help="e.g. 1,4,16")] = None
    rates: Annotated[RateList, Opt(help=RATES_HELP)] = None
    k_values: Annotated[IntList, Opt("--k", help="Static K list, e.g. 1,3")] = None
    arms: Annotated[NameList, Opt(help="Arm kinds to run, e.g. baseline,static,av")] = None
    warmup: Annotated[int | None, Opt(help="Warmup conversations per cell")] = None
    requests: Annotated[int | None, Opt(help="Minimum measured conversations per cell")] = None
    target_half_width: Annotated[
        float | None,
        Opt(
            "--target-half-width",
            help=SEQUENTIAL + "run each until the 95% intervals of output throughput and "
            "median TPOT are within ± this fraction, e.g. 0.03 (docs/measurement.md)",
        ),
    ] = None
    cell_min_requests: Annotated[
        int | None, Opt(help=SEQUENTIAL + "measured requests before the first look")
    ] = None
    cell_max_requests: Annotated[
        int | None, Opt(help=SEQUENTIAL + "the most measured requests (default 4096)")
    ] = None
    cell_min_time: Annotated[
        float | None, Opt(help=SEQUENTIAL + "measured seconds before the first look")
    ] = None
    cell_max_time: Annotated[
        float | None, Opt(help=SEQUENTIAL + "the most measured seconds (default 600)")
    ] = None
    temperature: Annotated[float | None, Opt()] = None
    top_p: Annotated[float | None, Opt("--top-p")] = None
    max_tokens: Annotated[int | None, Opt("--max-tokens")] = None
    ignore_eos: Annotated[
        bool, Opt("--ignore-eos", help="Generate max_tokens tokens, past any EOS")
    ] = False
    input_len: Annotated[
        int | None, Opt("--input-len", help="Synthetic workload: prompt tokens")
    ] = None
    output_len: Annotated[
        int | None, Opt("--output-len", help="Synthetic workload: output tokens")
    ] = None
    len_range: Annotated[
        float | None,
        Opt("--len-range", help="Synthetic: lengths uniform in len x (1 ± this), e.g. 0.1"),
    ] = None
    capture: Annotated[
        NameList,
        Opt(
            help="Live captures: drafts,refits (speculative arms), steps (every arm); avbench vLLM plugin"
        ),
    ] = None
    draft_fraction: Annotated[
        float | None, Opt(help="Share of requests whose drafts are captured")
    ] = None
    capture_dir: Annotated[
        Path | None,
        Opt(help="With --endpoint: the AVBENCH_CAPTURE_DIR that server was started with"),
    ] = None
    ready_timeout: Annotated[float | None, Opt(help="Seconds to wait for /health")] = None
    request_timeout: Annotated[
        float | None, Opt(help="Seconds one request may take (default 600)")
    ] = None
    read_timeout: Annotated[
        float | None, Opt(help="Seconds one request may go without progress (default 120)")
    ] = None
    stall_timeout: Annotated[
        float | None,
        Opt(
            help="Seconds without progress on any in-flight request before the cell fails as "
            "'server stalled' with the arm's remaining cells (default 30)"
        ),
    ] = None
    cell_timeout: Annotated[
        float | None, Opt(help="Seconds one cell may take, warmup included (default 3600)")
    ] = None
    vllm_python: VllmPython = None  # type: ignore[assignment]
    cpu_seed_fix: Annotated[
        bool,
        Opt(
            help="vLLM's CPU build: restore a seeded request's generator where the stock build "
            "kills its engine (a split prefill); --no-cpu-seed-fix serves it stock "
            "(docs/cpu-sampler.md)"
        ),
    ] = True
    report: Annotated[bool, Opt(help="Write the HTML report at the end")] = True
    schedule_from: Annotated[
        list[Path] | None,
        Opt(
            "--schedule-from",
            help="Run(s) whose best static K per concurrency to measure as one dyn arm (only "
            "that arm unless --arms names more)",
        ),
    ] = None
    strict: Annotated[
        bool, Opt("--strict", help="Exit 3 when an arm is unsupported by this vLLM")
    ] = False
    adaptive: Annotated[
        bool,
        Opt(
            "--adaptive",
            help="Measure the baseline and the max-K arm, predict the other arms, then measure "
            "only what each concurrency's verdict hinges on (docs/adaptive.md)",
        ),
    ] = False
    budget_cells: Annotated[
        int | None, Opt("--budget-cells", help="--adaptive: stop before measuring more cells")
    ] = None
    budget_s: Annotated[
        float | None,
        Opt("--budget-s", help="--adaptive: stop before spending more server-seconds"),
    ] = None
    complete: Annotated[
        bool,
        Opt(
            "--complete",
            help="With --resume of a finished adaptive run: measure every cell of its sweep "
            "that the rounds left out, for the fixed protocol's verdicts on the same "
            "measurements (docs/adaptive.md)",
        ),
    ] = False
    cell_noise: Annotated[
        float | None,
        Opt(
            "--cell-noise",
            help="--adaptive: one measured cell's relative 95% half-width until the run's "
            "repeats show more (default 0.05; bench/compare_noise.py measures a machine's)",
        ),
    ] = None

    @model_validator(mode="after")
    def _consistent(self) -> SweepRequest:
        refused = self.changed(RESUME_REFUSES)
        if self.resume is not None and refused:
            raise ValueError(
                f"--resume continues the stored plan; refusing {', '.join(refused)} (they would "
                "be ignored): start a new run to change them"
            )
        if self.resume is None and self.endpoint is None and self.arm:
            raise ValueError("--arm describes an attached server: use it with --endpoint")
        if self.endpoint is not None and (self.isolate or self.ray):
            raise ValueError(
                "--isolate and --ray place the servers avbench launches: not with --endpoint"
            )
        if self.ray and self.gpus is not None:
            raise ValueError("--gpus and --ray: Ray gives each arm its GPUs (use one or the other)")
        if self.adaptive and self.ray:
            raise ValueError("--ray runs a planned sweep's arms: not with --adaptive")
        if self.resume is None and self.capture_dir is not None:
            if self.endpoint is None or not self.capture_dir.is_dir():
                raise ValueError(
                    f"--capture-dir {self.capture_dir}: expected the existing directory an "
                    "attached server (--endpoint) writes its captures to; a launched server "
                    "gets one per arm"
                )
        if self.adaptive and (self.endpoint is not None or self.resume is not None):
            raise ValueError(
                "--adaptive launches its arms and records itself in the run: not with "
                "--endpoint, and --resume of an adaptive run continues it without the flag"
            )
        if self.complete and self.resume is None:
            raise ValueError(
                "--complete measures what a stored adaptive run left out: use it with --resume RUN"
            )
        if not self.adaptive and (self.budget_cells is not None or self.budget_s is not None):
            raise ValueError("--budget-cells and --budget-s bound an --adaptive sweep")
        if self.cell_noise is not None and not (self.adaptive and 0 < self.cell_noise < 1):
            raise ValueError(
                f"--cell-noise {self.cell_noise}: expected a fraction in (0, 1), with --adaptive"
            )
        if self.sequential() is not None and self.requests is not None:
            raise ValueError(
                "--requests fixes the request count of a cell; a sequential cell is bounded "
                "by --cell-min-requests/--cell-max-requests instead"
            )
        return self

    def sequential(self) -> dict[str, Any] | None:
        """--target-half-width and the cell floors/ceilings, as fields of the sweep's
        `sequential`."""
        given = {
            "target": self.target_half_width,
            "min_requests": self.cell_min_requests,
            "max_requests": self.cell_max_requests,
            "min_time_s": self.cell_min_time,
            "max_time_s": self.cell_max_time,
        }
        return {k: v for k, v in given.items() if v is not None} or None

    def sampling(self) -> dict[str, float | int | bool]:
        given = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "ignore_eos": self.ignore_eos or None,
        }
        return {k: v for k, v in given.items() if v is not None}

    def timeouts(self) -> dict[str, float]:
        given = {
            "request_s": self.request_timeout,
            "read_s": self.read_timeout,
            "stall_s": self.stall_timeout,
            "cell_s": self.cell_timeout,
        }
        return {k: v for k, v in given.items() if v is not None}

    def sweep_update(self) -> SweepUpdate:
        """The sweep fields this request sets (None: keep the sweep file's)."""
        from avbench.commands.resolve import load_update
        from avbench.inputs.suite import SweepUpdate

        loads = load_update(self.workloads, self.concurrencies, self.rates, self.k_values)
        given = {
            "arms": self.arms,
            "warmup": self.warmup,
            "min_requests": self.requests,
            "requests_per_concurrency": 1 if self.requests else None,
            "capture": self.capture,
            "draft_fraction": self.draft_fraction,
            "sequential": self.sequential() or {},
            "sampling": self.sampling(),
            "timeouts": self.timeouts(),
        }
        dyn = _dyn_update(self.pair, self.schedule_from, self.arms)
        return SweepUpdate.model_validate(loads.model_dump() | given | dyn)


# What a resume takes from this invocation: the server's settings on this machine and what to
# print. Every other option would change the stored plan, so --resume refuses it (a new option
# is refused until it is listed here).
RESUME_READS = (
    "resume", "port", "api_key", "api_key_file", "ready_timeout", "vllm_python", "cpu_seed_fix",
    "report", "strict", "adaptive", "budget_cells", "budget_s", "gpus", "isolate", "ray",
    "complete",
)  # fmt: skip
RESUME_REFUSES = tuple(f for f in SweepRequest.model_fields if f not in RESUME_READS)


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)


@command(SweepRequest)
def sweep(req: SweepRequest) -> None:
    """Launch vLLM per arm (baseline, static K, AV) and measure every cell of the sweep.

    Exit code: 0 every supported cell measured, 1 some cells failed, 2 bad input, 3 an arm
    unsupported (with --strict), 4 internal error, 130 interrupted."""
    from avbench.inputs.apikey import resolve_api_key
    from avbench.run.progress import RichReporter, make_console

    secret = resolve_api_key(req.api_key, req.api_key_file)
    console = make_console()
    reporter = RichReporter(console)
    from avbench.store.artefacts import ADAPTIVE

    adaptive = req.adaptive or bool(req.resume and (req.resume / ADAPTIVE).exists())
    if req.complete and not adaptive:
        raise AvbenchError(f"--complete: {req.resume} is not an adaptive run (no {ADAPTIVE})")
    try:
        if adaptive:
            _adaptive(req, secret, reporter, console)
            return
        outcome = _resume(req, secret, reporter) if req.resume else _start(req, secret, reporter)
    except KeyboardInterrupt:
        reporter.close()
        console.print(
            "[yellow]interrupted[/]: servers stopped; finish the run with --resume "
            f"{reporter.run_dir or 'RUN_DIR'}",
            highlight=False,
        )
        raise typer.Exit(130) from None
    except AvbenchError as exc:
        reporter.close()
        if reporter.run_dir is not None and exc.exit_code == 1:
            console.print(f"the run can continue with --resume {reporter.run_dir}", highlight=False)
        raise
    _summarize(console, outcome, req.report)
    if outcome.failed:
        raise typer.Exit(1)
    if req.strict and outcome.unsupported:
        raise typer.Exit(3)


def _override(req: SweepRequest, secret: SecretStr | None) -> dict[str, Any]:
    return {
        "api_key": secret,
        "vllm_python": req.vllm_python,
        "port": req.port,
        "ready_timeout_s": req.ready_timeout,
        "cpu_seed_fix": req.cpu_seed_fix,
        "gpus": _host_gpus(req),
        "isolate": _isolated(req),
    }


def _host_gpus(req: SweepRequest) -> GpuSet | None:
    """--gpus of a launched sweep: the host's GPUs the arms share."""
    from avbench.plan.gpus import GpuSet

    if req.gpus is None or req.endpoint is not None:
        return None
    return GpuSet.parse(req.gpus)


def _attached_gpus(req: SweepRequest) -> int | None:
    """--gpus with --endpoint: how many GPUs are behind the server."""
    if req.gpus is None or req.endpoint is None:
        return None
    try:
        return int(req.gpus)
    except ValueError:
        raise AvbenchError(
            f"--gpus {req.gpus!r}: with --endpoint, expected the number of GPUs behind the server"
        ) from None


def _isolated(req: SweepRequest) -> list[str]:
    from avbench.plan.cells import Arm

    for name in req.isolate or []:
        try:
            Arm.parse(name)
        except ValueError as exc:
            raise AvbenchError(f"--isolate: {exc}") from None
    return list(req.isolate or [])


def _backend(req: SweepRequest) -> SessionBackend | None:
    """--ray: the arms as tasks of that cluster (Ray is imported only then); else this host."""
    if req.ray is None:
        return None
    try:
        from avbench.run.ray_backend import RayBackend
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "ray":
            raise
        raise AvbenchError("--ray: Ray is not installed (pip install 'avbench[ray]')") from None

    return RayBackend.connect(req.ray)


def _resume(req: SweepRequest, secret: SecretStr | None, reporter: RichReporter) -> SweepOutcome:
    from avbench.run.runner import resume_sweep

    assert req.resume is not None
    refused = _preflight_stored(req.resume, req.vllm_python)
    override = _override(req, secret) | {"refused_arms": refused}
    return resume_sweep(req.resume, override, reporter, _backend(req))


def _adaptive(
    req: SweepRequest, secret: SecretStr | None, reporter: RichReporter, console: Console
) -> None:
    """--adaptive, or --resume of an adaptive run: the rounds, then each verdict's standing."""
    from avbench.analysis.adaptive import Uncertainty
    from avbench.run.adaptive import (
        AdaptivePolicy,
        adaptive_sweep,
        complete_adaptive,
        resume_adaptive,
    )
    from avbench.run.progress import standings_table

    if req.resume is not None:
        refused = _preflight_stored(req.resume, req.vllm_python)
        go_on = complete_adaptive if req.complete else resume_adaptive
        done = go_on(req.resume, _override(req, secret) | {"refused_arms": refused}, reporter)
    else:
        opts = _options(req, secret)
        noise = Uncertainty() if req.cell_noise is None else Uncertainty(single=req.cell_noise)
        policy = AdaptivePolicy(noise, budget_cells=req.budget_cells, budget_s=req.budget_s)
        done = adaptive_sweep(opts, policy, reporter)
    reporter.close()
    state = done.state
    title = "verdicts, every cell measured" if state.completion else "verdicts (adaptive)"
    console.print(standings_table(done.standings, title))
    console.print(
        f"adaptive run {done.run_dir}: {state.status}; {state.cells} cells measured in "
        f"{len(state.rounds) - 1} round(s), {state.seconds:.0f} server-seconds",
        highlight=False,
    )
    if state.completion is not None:
        console.print(_completion_line(state.completion, state.rounds[-1]), highlight=False)
    if req.report:
        from avbench.report import write_report

        console.print(f"report: {write_report([done.run_dir], static_figures=False).html}")


def _completion_line(completion: dict, last_round: dict) -> str:
    """What --complete measured, and at how many loads the rounds' verdict is the one every
    cell gives (the table above)."""
    rounds = {s["concurrency"]: s["verdict"] for s in last_round.get("standings", [])}
    full = {s["concurrency"]: s["verdict"] for s in completion["standings"]}
    same = sum(rounds.get(c) == v for c, v in full.items())
    return (
        f"completed: {len(completion['cells'])} more cells, {completion['seconds']:.0f} "
        f"server-seconds; with every cell measured (above), the rounds' verdict stands at "
        f"{same} of {len(full)} loads"
    )


def _start(req: SweepRequest, secret: SecretStr | None, reporter: RichReporter) -> SweepOutcome:
    from avbench.run.runner import start_sweep

    backend = _backend(req)  # Ray missing or its cluster unreachable: before the pre-flight
    return start_sweep(_options(req, secret, servers_here=backend is None), reporter, backend)


def _options(
    req: SweepRequest, secret: SecretStr | None, servers_here: bool = True
) -> SweepOptions:
    """The new run's options, checked (and, launching, pre-flighted) before any server starts."""
    from avbench.run.runner import SweepOptions, check_new_run

    if req.pair is None and req.endpoint is None:
        raise AvbenchError(
            "--pair is required (or --endpoint URL, or --resume RUN); see `avbench pairs`"
        )
    pair, sweep, specs, pairs_file = _attached(req) if req.pair is None else _from_suite(req)
    opts = SweepOptions(
        pair=pair,
        sweep=sweep,
        workloads=specs,
        results_dir=req.results or Path("results"),
        run_id=req.run_id,
        port=req.port,
        endpoint=req.endpoint,
        attach_arm=_attach_arm(req, pair),
        attach_gpus=_attached_gpus(req),
        gpus=_host_gpus(req),
        isolate=_isolated(req),
        api_key=secret,
        vllm_python=req.vllm_python,
        ready_timeout_s=req.ready_timeout,
        cpu_seed_fix=req.cpu_seed_fix,
        capture_dir=req.capture_dir,
    )
    check_new_run(opts, servers_here)  # bad options fail before the slower pre-flight
    if req.endpoint is None:
        opts.refused_arms = _preflight(pair, sweep, pairs_file, req.vllm_python)
    return opts


Setup = tuple["Pair", "Sweep", "dict[str, WorkloadSpec]", Path | None]


def _attached(req: SweepRequest) -> Setup:
    """Attached with no suite file: an in-memory pair and sweep."""
    from avbench.serving.attach import AttachedServer, Lengths, attached_setup
    from avbench.workloads.registry import all_workloads, builtin_workloads

    assert req.endpoint is not None
    pair, sweep, specs = attached_setup(
        AttachedServer(req.endpoint, model=req.model, arm=req.arm, tokenizer=req.tokenizer),
        update=req.sweep_update(),
        workloads=all_workloads(req.suites) if req.suites else builtin_workloads(),
        lengths=Lengths(req.input_len, req.output_len, req.len_range),
    )
    return pair, sweep, specs, None


def _from_suite(req: SweepRequest) -> Setup:
    from avbench.commands.resolve import resolve
    from avbench.serving.attach import Lengths, apply_lengths

    assert req.pair is not None
    got = resolve(req.suites, req.pair, req.sweep, req.sweep_update())
    lengths = Lengths(req.input_len, req.output_len, req.len_range)
    specs = apply_lengths(got.suite.workloads, got.sweep.workloads, lengths)
    pair = got.pair
    if req.model is not None:
        pair = pair.model_copy(update={"served_model_name": req.model})
    if req.tokenizer is not None:
        pair = pair.model_copy(update={"target": str(req.tokenizer)})
    return pair, got.sweep, specs, got.suite.root / "pairs.toml"


def _attach_arm(req: SweepRequest, pair: Pair) -> Arm | None:
    """With --endpoint: the arm the server runs (--arm; default the pair's largest static K,
    or the baseline when there is no suite pair)."""
    from avbench.plan.cells import Arm

    if not req.endpoint:
        return None
    try:
        return Arm.parse(req.arm or ("baseline" if req.pair is None else f"static-k{pair.max_k}"))
    except ValueError as exc:
        raise AvbenchError(f"--arm: {exc}") from None


def _preflight(pair: Pair, sweep: Sweep, pairs_file: Path | None, python: str) -> dict[str, str]:
    """Every server command line checked by the installed vLLM before any server starts.
    Returns the arms vLLM would refuse at start (arm -> reason): never started."""
    from avbench.checks.preflight import Target, require_preflight
    from avbench.plan.cells import arms_for

    report = require_preflight(
        [Target(pair, a, pairs_file, sweep) for a in arms_for(pair, sweep)],
        python,
        echo=lambda line: typer.echo(line, err=True),
    )
    return report.refused(pair.name)


def _preflight_stored(run_dir: Path, python: str) -> dict[str, str]:
    """Pre-flight of a run being resumed: the vLLM may have changed since it started."""
    from pydantic import ValidationError

    from avbench.inputs.suite import Pair, Sweep
    from avbench.store.artefacts import SweepManifest
    from avbench.store.run_store import RunStore

    m = RunStore.open(run_dir).read_manifest()
    if not isinstance(m, SweepManifest) or m.endpoint:
        return {}
    try:
        pair, sweep = Pair.model_validate(m.pair), Sweep.model_validate(m.sweep)
    except ValidationError:
        return {}  # resume_sweep names what the manifest lacks
    return _preflight(pair, sweep, None, python)


def _summarize(console: Console, outcome: SweepOutcome, write_report: bool) -> None:
    """The cells' table, the report's path, the counts and each reason a cell was not
    measured."""
    from avbench.metrics.quality import fill_identity
    from avbench.run.progress import summary_table

    store = outcome.store
    rows = fill_identity(list(store.finished_cells().values()), store.read_records)
    console.print(summary_table(rows))
    if write_report and rows:
        from avbench.report import write_report as write

        console.print(f"report: {write([store.root], static_figures=False).html}")
    n = outcome.counts()
    console.print(
        f"run {store.root}: {n['measured']} cells measured, {n['already_done']} already "
        f"done, {n['failed']} failed, {n['unsupported']} unsupported",
        highlight=False,
    )
    by_reason: dict[str, list[str]] = {}
    for f in outcome.failed + outcome.unsupported:
        by_reason.setdefault(f["reason"].splitlines()[0], []).append(f["cell_id"])
    for reason, ids in by_reason.items():
        console.print(f"  {len(ids)} cell(s) not measured: {reason}", highlight=False)
    if outcome.failed:
        console.print(f"rerun the failed cells with --resume {store.root}", highlight=False)


def _dyn_update(pair: str | None, runs: list[Path] | None, arms: list[str] | None) -> dict:
    """--schedule-from: those runs' best-static-K schedule and drafting settings, + a dyn arm."""
    if not runs:
        return {}
    from avbench.report.answer import dyn_settings_from
    from avbench.report.runs import load_runs
    from avbench.serving.attach import ATTACHED_PAIR

    kinds = [*(arms or []), "dyn"]
    found = dyn_settings_from(load_runs(runs), pair or ATTACHED_PAIR)
    return found | {"arms": list(dict.fromkeys(kinds))}
