"""`avbench pairs | plan | sweep`: thin wrappers over suite, plan and runner."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from avbench.commands.listing import JsonOpt, print_json, print_table
from avbench.errors import AvbenchError

RATES_HELP = "Open loop instead: requests per second, e.g. 2,8 (like vllm bench --request-rate)"
SuitesOpt = Annotated[
    Path | None,
    typer.Option("--suites", help="Suite directory (default: ./suites or $AVBENCH_SUITES)"),
]


def register(app: typer.Typer) -> None:
    app.command("pairs")(pairs)
    app.command("plan")(plan)
    app.command("sweep")(sweep)


def pairs(suites: SuitesOpt = None, as_json: Annotated[bool, JsonOpt] = False) -> None:
    """List the model pairs defined in the suite files."""
    from avbench.suite import load_suite

    suite = load_suite(suites)
    if as_json:
        print_json([p.model_dump(mode="json") for p in suite.pairs.values()])
        return
    rows = [
        [
            p.name,
            p.target,
            p.drafter or "(in target)",
            p.method,
            str(p.max_k),
            str(p.gpus_per_server),
            p.description,
        ]
        for p in suite.pairs.values()
    ]
    print_table(
        f"pairs ({suite.root / 'pairs.toml'})",
        ("pair", "target", "drafter", "method", "max K", "GPUs", "description"),
        rows,
        ids=("pair", "target", "drafter"),
    )


def _preflight(pair, sweep, pairs_file: Path | None, python: str) -> None:
    """Every server command line checked by the installed vLLM before any server starts."""
    from avbench.plan import arms_for
    from avbench.preflight import Target, require_preflight

    require_preflight(
        [Target(pair, a, pairs_file, sweep) for a in arms_for(pair, sweep)],
        python,
        echo=lambda line: typer.echo(line, err=True),
    )


def _preflight_stored(run_dir: Path, python: str) -> None:
    """Pre-flight of a run being resumed: the vLLM may have changed since it started."""
    from pydantic import ValidationError

    from avbench.store import RunStore
    from avbench.suite import Pair, Sweep

    m = RunStore.open(run_dir).read_manifest()
    if m.get("endpoint"):
        return
    try:
        pair, sweep = Pair.model_validate(m["pair"]), Sweep.model_validate(m["sweep"])
    except (KeyError, TypeError, ValidationError):
        return  # resume_sweep names what the manifest lacks
    _preflight(pair, sweep, None, python)


def _resolve(suites, pair_name, sweep_name, overrides):
    """Load the suite, pick pair and sweep, apply CLI overrides with the same validation."""
    from pydantic import ValidationError

    from avbench.inputs import validation_error
    from avbench.suite import Sweep, load_suite

    suite = load_suite(suites)
    pair = suite.pair(pair_name)
    sweep = suite.sweep(sweep_name or pair.default_sweep)
    data = sweep.model_dump()
    for nested in ("sampling", "timeouts"):  # merged field by field into the sweep's own
        given = overrides.pop(nested, None) or {}
        data[nested] |= {k: v for k, v in given.items() if v is not None}
    data["sequential"] = merge_sequential(data.get("sequential"), overrides.pop("sequential", None))
    data |= {k: v for k, v in overrides.items() if v is not None}
    if overrides.get("concurrencies"):  # closed loop asked for: the file's rates step aside
        data["rates"] = None
    try:
        sweep = Sweep.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, "command-line override") from None
    for w in sweep.workloads:
        suite.workload(w)
    if overrides.get("k_values"):  # --k wins over the pair's own k_values
        too_big = [k for k in sweep.k_values if k > pair.max_k]
        if too_big:
            raise AvbenchError(
                f"--k: {', '.join(map(str, too_big))} above max_k {pair.max_k} of pair {pair.name}"
            )
        pair = pair.model_copy(update={"k_values": sweep.k_values})
    return suite, pair, sweep


def sequential_override(
    target: float | None,
    requests: tuple[int | None, int | None],
    time_s: tuple[float | None, float | None],
) -> dict | None:
    """--target-half-width and the cell floors/ceilings, as fields of the sweep's `sequential`."""
    given = {
        "target": target,
        "min_requests": requests[0],
        "max_requests": requests[1],
        "min_time_s": time_s[0],
        "max_time_s": time_s[1],
    }
    return {k: v for k, v in given.items() if v is not None} or None


def merge_sequential(stored: dict | None, given: dict | None) -> dict | None:
    """The sweep file's sequential setting with the command line's fields over it."""
    if not given:
        return stored
    if stored is None and "target" not in given:
        raise AvbenchError(
            "--cell-min-requests/--cell-max-requests/--cell-min-time/--cell-max-time bound "
            "sequential cells: give --target-half-width too (or a sweep with a `sequential` table)"
        )
    return (stored or {}) | given


def _csv_ints(v: str | None) -> list[int] | None:
    if v is None:
        return None
    try:
        return [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        raise AvbenchError(f"expected a comma-separated list of integers, got {v!r}") from None


def _load_overrides(concurrencies: str | None, rates: str | None) -> dict:
    """--concurrencies (closed loop) or --rates (open loop, requests per second, like
    `vllm bench serve --request-rate`); either one replaces the sweep's loads."""
    if concurrencies is not None and rates is not None:
        raise AvbenchError(
            "--rates and --concurrencies: give one (a cell runs open loop at a rate or closed "
            "loop at a concurrency)"
        )
    if rates is None:
        return {"concurrencies": _csv_ints(concurrencies)}
    try:
        values = [float(x) for x in rates.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(r) and r > 0 for r in values):
        raise AvbenchError(
            f"--rates {rates!r}: expected a comma-separated list of positive, finite requests "
            "per second, e.g. 2,8"
        )
    return {"rates": values}


def plan(
    pair: Annotated[str, typer.Option("--pair", help="Pair id (see `avbench pairs`)")],
    sweep: Annotated[
        str | None, typer.Option("--sweep", help="Sweep id (default: the pair's)")
    ] = None,
    suites: SuitesOpt = None,
    workloads: Annotated[str | None, typer.Option(help="Comma-separated workload ids")] = None,
    concurrencies: Annotated[str | None, typer.Option(help="e.g. 1,4,16")] = None,
    rates: Annotated[str | None, typer.Option(help=RATES_HELP)] = None,
    k_values: Annotated[str | None, typer.Option("--k", help="Static K list, e.g. 1,3")] = None,
    from_run: Annotated[
        Path | None,
        typer.Option("--from", help="Previous run whose measured speed prices the wall time"),
    ] = None,
    vllm_python: Annotated[
        str | None, typer.Option(help="Python interpreter that has vLLM (default: this one)")
    ] = None,
    as_json: Annotated[bool, JsonOpt] = False,
) -> None:
    """Print the cells a sweep would run, each arm's server command and the work, without
    running them."""
    from rich.console import Console

    from avbench.plan import arms_for, build_plan

    overrides = {
        "workloads": workloads.split(",") if workloads else None,
        **_load_overrides(concurrencies, rates),
        "k_values": _csv_ints(k_values),
    }
    suite, p, s = _resolve(suites, pair, sweep, overrides)
    cells = build_plan(p, s)
    arm_names = [a.name for a in arms_for(p, s)]
    if as_json:
        print_json(
            {
                "pair": p.name,
                "sweep": s.name,
                "arms": arm_names,
                "sampling": s.sampling.model_dump(mode="json"),
                "cells": [c.to_dict() for c in cells],
            }
        )
        return
    rows = []
    for i, c in enumerate(cells):
        load = f"c={c.concurrency}" if c.rate is None else f"{c.rate:g} req/s"
        rows.append(
            [str(i), c.arm, c.workload, load, str(c.num_requests), str(c.warmup), str(c.repeat)]
        )
    print_table(
        f"plan: pair {p.name}, sweep {s.name}: {len(cells)} cells, arms {', '.join(arm_names)}",
        ("#", "arm", "workload", "load", "requests", "warmup", "repeat"),
        rows,
        ids=("arm", "workload"),
    )
    smp = s.sampling
    Console().print(
        f"sampling: temperature {smp.temperature}, top_p {smp.top_p}, max_tokens {smp.max_tokens}"
        f", ignore_eos {smp.ignore_eos}"
    )
    if s.sequential is not None:
        q = s.sequential
        Console().print(
            f"sequential cells: each runs until the 95% intervals of {' and '.join(q.metrics)} "
            f"are within ±{q.target:.1%}, or {q.max_requests} requests, or {q.max_time_s:g} s: "
            "the requests and work shown are ceilings",
            highlight=False,
        )
    python = vllm_python or os.environ.get("AVBENCH_VLLM_PYTHON") or sys.executable
    print_plan_work(Console(highlight=False, soft_wrap=True), suite, p, s, cells, python, from_run)


def print_plan_work(console, suite, pair, sweep, cells, python: str, from_run: Path | None):
    """`avbench plan`'s second half: each arm's server command, then the work and its time."""
    import shlex

    from avbench import checkpoints
    from avbench.errors import UnsupportedArm
    from avbench.plan import Arm
    from avbench.plan_cost import estimate_wall_time, format_duration, plan_work
    from avbench.server import build_command, check_arm_supported, probe_vllm
    from avbench.workloads.registry import LOADERS

    try:
        install = probe_vllm(python)
    except AvbenchError:
        install = None
    commands, unsupported = {}, {}
    for name in dict.fromkeys(c.arm for c in cells):
        arm = Arm.parse(name)
        commands[name] = build_command(pair, arm, port=8000, python=python, sweep=sweep)
        if install is not None and install.distribution is not None:
            try:
                check_arm_supported(pair, arm, install)
            except UnsupportedArm as exc:
                unsupported[name] = str(exc)
    turns: dict[str, int | None] = {}
    for w in sweep.workloads:
        spec = suite.workloads[w]
        try:
            turns[w] = max(len(c.turns) for c in LOADERS[spec.dataset].load(spec).conversations)
        except Exception:  # not available here: the bound counts one turn and says so
            turns[w] = None
    work = plan_work(
        cells,
        max_tokens=sweep.sampling.max_tokens,
        turns=turns,
        commands=commands,
        unsupported=unsupported,
    )
    console.print("server command per arm (port chosen at run time):")
    for a in work.arms:
        note = f"  [unsupported here, not started: {a.unsupported}]" if a.unsupported else ""
        console.print(f"  {a.arm}: {shlex.join(a.command or [])}{note}", markup=False)
    for role, ref in (("target", pair.target), ("drafter", pair.drafter)):
        line = checkpoints.describe(role, ref)
        if line:
            console.print(f"  {line}", markup=False)
    unknown = (
        f" (counting one turn for {', '.join(work.unknown_turns)}: not available here)"
        if work.unknown_turns
        else ""
    )
    console.print(
        f"work: {work.requests:,} requests (warmup included), at most "
        f"{work.max_output_tokens:,} output tokens{unknown}, {work.server_starts} server starts",
        markup=False,
    )
    if from_run is not None:
        from avbench.store import RunStore

        store = RunStore.open(from_run)
        try:
            est = estimate_wall_time(cells, work, store.cells_frame(), store.read_manifest())
        except ValueError as exc:
            raise AvbenchError(f"--from {from_run}: {exc}") from None
        console.print(
            f"estimated wall time: {format_duration(est.seconds)} from run {store.root.name} "
            f"({est.cells_priced} cells priced from the same cell, {est.cells_fallback} from a "
            f"coarser match; {format_duration(est.server_start_s)} per server start)",
            markup=False,
        )


def sweep(
    pair: Annotated[
        str | None, typer.Option("--pair", help="Pair id (see `avbench pairs`)")
    ] = None,
    sweep: Annotated[
        str | None, typer.Option("--sweep", help="Sweep id (default: the pair's)")
    ] = None,
    suites: SuitesOpt = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Run directory to complete")
    ] = None,
    results: Annotated[
        Path | None, typer.Option("--results", help="Results directory (default: results)")
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run-id")] = None,
    port: Annotated[int, typer.Option(help="Port for the launched vLLM server")] = 8000,
    endpoint: Annotated[
        str | None, typer.Option(help="Attach to a running server (http://host:port) instead")
    ] = None,
    arm: Annotated[
        str, typer.Option(help="With --endpoint: what the server runs (baseline, static-k3, av-k8)")
    ] = "",
    gpus: Annotated[
        int | None, typer.Option(help="With --endpoint: GPUs behind the server")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", help="API key; visible in `ps`: prefer --api-key-file or OPENAI_API_KEY"
        ),
    ] = None,
    api_key_file: Annotated[
        Path | None, typer.Option("--api-key-file", help="File holding the API key; never stored")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="With --endpoint: served model (default: the one /v1/models lists)"),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="Local tokenizer dir for synthetic prompts (default: server /tokenize)"),
    ] = None,
    workloads: Annotated[
        str | None, typer.Option("--workloads", "--workload", help="Comma-separated workload ids")
    ] = None,
    concurrencies: Annotated[str | None, typer.Option(help="e.g. 1,4,16")] = None,
    rates: Annotated[str | None, typer.Option(help=RATES_HELP)] = None,
    k_values: Annotated[str | None, typer.Option("--k", help="Static K list, e.g. 1,3")] = None,
    arms: Annotated[
        str | None, typer.Option(help="Arm kinds to run, e.g. baseline,static,av")
    ] = None,
    warmup: Annotated[int | None, typer.Option(help="Warmup conversations per cell")] = None,
    requests: Annotated[
        int | None, typer.Option(help="Minimum measured conversations per cell")
    ] = None,
    target_half_width: Annotated[
        float | None,
        typer.Option(
            "--target-half-width",
            help="Sequential cells: run each until the 95% intervals of output throughput and "
            "median TPOT are within ± this fraction, e.g. 0.03 (docs/measurement.md)",
        ),
    ] = None,
    cell_min_requests: Annotated[
        int | None, typer.Option(help="Sequential cells: measured requests before the first look")
    ] = None,
    cell_max_requests: Annotated[
        int | None, typer.Option(help="Sequential cells: the most measured requests (default 4096)")
    ] = None,
    cell_min_time: Annotated[
        float | None, typer.Option(help="Sequential cells: measured seconds before the first look")
    ] = None,
    cell_max_time: Annotated[
        float | None, typer.Option(help="Sequential cells: the most measured seconds (default 600)")
    ] = None,
    temperature: Annotated[float | None, typer.Option()] = None,
    top_p: Annotated[float | None, typer.Option("--top-p")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens")] = None,
    ignore_eos: Annotated[
        bool, typer.Option("--ignore-eos", help="Generate max_tokens tokens, past any EOS")
    ] = False,
    input_len: Annotated[
        int | None, typer.Option("--input-len", help="Synthetic workload: prompt tokens")
    ] = None,
    output_len: Annotated[
        int | None, typer.Option("--output-len", help="Synthetic workload: output tokens")
    ] = None,
    len_range: Annotated[
        float | None,
        typer.Option(
            "--len-range", help="Synthetic: lengths uniform in len x (1 ± this), e.g. 0.1"
        ),
    ] = None,
    capture: Annotated[
        str | None,
        typer.Option(
            help="Live captures: drafts,refits (speculative arms), steps (every arm); avbench vLLM plugin"
        ),
    ] = None,
    draft_fraction: Annotated[
        float | None, typer.Option(help="Share of requests whose drafts are captured")
    ] = None,
    capture_dir: Annotated[
        Path | None,
        typer.Option(help="With --endpoint: the AVBENCH_CAPTURE_DIR that server was started with"),
    ] = None,
    ready_timeout: Annotated[float | None, typer.Option(help="Seconds to wait for /health")] = None,
    request_timeout: Annotated[
        float | None, typer.Option(help="Seconds one request may take (default 600)")
    ] = None,
    read_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds one request may go without progress (default 120)"),
    ] = None,
    stall_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds without progress on any in-flight request before the cell fails as "
            "'server stalled' with the arm's remaining cells (default 30)"
        ),
    ] = None,
    cell_timeout: Annotated[
        float | None, typer.Option(help="Seconds one cell may take, warmup included (default 3600)")
    ] = None,
    vllm_python: Annotated[
        str | None, typer.Option(help="Python interpreter that has vLLM (default: this one)")
    ] = None,
    report: Annotated[bool, typer.Option(help="Write the HTML report at the end")] = True,
    schedule_from: Annotated[
        list[Path] | None,
        typer.Option(
            "--schedule-from",
            help="Run(s) whose best static K per concurrency to measure as one dyn arm (only "
            "that arm unless --arms names more)",
        ),
    ] = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 3 when an arm is unsupported by this vLLM")
    ] = False,
) -> None:
    """Launch vLLM per arm (baseline, static K, AV) and measure every cell of the sweep.

    Exit code: 0 every supported cell measured, 1 some cells failed, 2 bad input, 3 an arm
    unsupported (with --strict), 4 internal error, 130 interrupted."""

    from avbench.apikey import resolve_api_key
    from avbench.plan import Arm
    from avbench.progress import RichReporter, make_console, summary_table
    from avbench.runner import SweepOptions, check_new_run, resume_sweep, start_sweep

    secret = resolve_api_key(api_key, api_key_file)
    python = vllm_python or os.environ.get("AVBENCH_VLLM_PYTHON") or sys.executable
    console = make_console()
    if resume is not None:
        given = {
            "--pair": pair, "--sweep": sweep, "--suites": suites, "--results": results,
            "--run-id": run_id, "--endpoint": endpoint, "--arm": arm or None, "--gpus": gpus,
            "--workloads": workloads, "--concurrencies": concurrencies, "--rates": rates,
            "--k": k_values,
            "--arms": arms, "--warmup": warmup, "--requests": requests,
            "--temperature": temperature, "--top-p": top_p, "--max-tokens": max_tokens,
            "--schedule-from": schedule_from, "--capture": capture,
            "--draft-fraction": draft_fraction, "--capture-dir": capture_dir,
            "--model": model, "--tokenizer": tokenizer, "--ignore-eos": ignore_eos or None,
            "--input-len": input_len, "--output-len": output_len, "--len-range": len_range,
            "--request-timeout": request_timeout, "--read-timeout": read_timeout,
            "--stall-timeout": stall_timeout, "--cell-timeout": cell_timeout,
            "--target-half-width": target_half_width, "--cell-min-requests": cell_min_requests,
            "--cell-max-requests": cell_max_requests, "--cell-min-time": cell_min_time,
            "--cell-max-time": cell_max_time,
        }  # fmt: skip
        ignored = [name for name, v in given.items() if v is not None]
        if ignored:
            raise AvbenchError(
                f"--resume continues the stored plan; refusing {', '.join(ignored)} (they would "
                "be ignored): start a new run to change them"
            )
    elif endpoint is None and (arm or gpus is not None):
        raise AvbenchError("--arm and --gpus describe an attached server: use them with --endpoint")
    elif capture_dir is not None and (endpoint is None or not capture_dir.is_dir()):
        raise AvbenchError(
            f"--capture-dir {capture_dir}: expected the existing directory an attached server "
            "(--endpoint) writes its captures to; a launched server gets one per arm"
        )
    reporter = RichReporter(console)
    try:
        if resume is not None:
            _preflight_stored(resume, python)
            outcome = resume_sweep(
                resume,
                {
                    "api_key": secret,
                    "vllm_python": python,
                    "port": port,
                    "ready_timeout_s": ready_timeout,
                },
                reporter,
            )
        else:
            if pair is None and endpoint is None:
                raise AvbenchError(
                    "--pair is required (or --endpoint URL, or --resume RUN); see `avbench pairs`"
                )
            sequential = sequential_override(
                target_half_width,
                (cell_min_requests, cell_max_requests),
                (cell_min_time, cell_max_time),
            )
            if sequential is not None and requests is not None:
                raise AvbenchError(
                    "--requests fixes the request count of a cell; a sequential cell is bounded "
                    "by --cell-min-requests/--cell-max-requests instead"
                )
            overrides = {
                "workloads": workloads.split(",") if workloads else None,
                **_load_overrides(concurrencies, rates),
                "k_values": _csv_ints(k_values),
                "arms": arms.split(",") if arms else None,
                "sequential": sequential,
                **_dyn_overrides(pair, schedule_from, arms),
                "warmup": warmup,
                "min_requests": requests,
                "requests_per_concurrency": 1 if requests else None,
                "sampling": {
                    "temperature": temperature,
                    "top_p": top_p,
                    "max_tokens": max_tokens,
                    "ignore_eos": ignore_eos or None,
                },
                "capture": capture.split(",") if capture else None,
                "draft_fraction": draft_fraction,
                "timeouts": {
                    k: v
                    for k, v in {
                        "request_s": request_timeout,
                        "read_s": read_timeout,
                        "stall_s": stall_timeout,
                        "cell_s": cell_timeout,
                    }.items()
                    if v is not None
                },
            }
            from avbench.attach import AttachedServer, Lengths, apply_lengths, attached_setup

            lengths = Lengths(input_len, output_len, len_range)
            if pair is None:  # attached, no suite file: an in-memory pair and sweep
                from avbench.suite import all_workloads
                from avbench.workloads.registry import builtin_workloads

                p, s, specs = attached_setup(
                    AttachedServer(endpoint, model=model, arm=arm, tokenizer=tokenizer),
                    sweep_fields={k: v for k, v in overrides.items() if k != "sampling"}
                    | {"sequential": merge_sequential(None, sequential)},
                    sampling=overrides["sampling"],
                    workloads=all_workloads(suites) if suites else builtin_workloads(),
                    lengths=lengths,
                )
            else:
                suite, p, s = _resolve(suites, pair, sweep, overrides)
                specs = apply_lengths(suite.workloads, s.workloads, lengths)
                if model is not None:
                    p = p.model_copy(update={"served_model_name": model})
                if tokenizer is not None:
                    p = p.model_copy(update={"target": str(tokenizer)})
            attach_arm = None
            if endpoint:
                try:
                    default = "baseline" if pair is None else f"static-k{p.max_k}"
                    attach_arm = Arm.parse(arm or default)
                except ValueError as exc:
                    raise AvbenchError(f"--arm: {exc}") from None
            opts = SweepOptions(
                pair=p,
                sweep=s,
                workloads=specs,
                results_dir=results or Path("results"),
                run_id=run_id,
                port=port,
                endpoint=endpoint,
                attach_arm=attach_arm,
                attach_gpus=gpus,
                api_key=secret,
                vllm_python=python,
                ready_timeout_s=ready_timeout,
                capture_dir=capture_dir,
            )
            check_new_run(opts)  # bad options fail before the slower pre-flight
            if endpoint is None:
                _preflight(p, s, suite.root / "pairs.toml", python)
            outcome = start_sweep(opts, reporter)
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
    from avbench.metrics.quality import fill_identity

    store = outcome.store
    rows = fill_identity(list(store.finished_cells().values()), store.read_records)
    console.print(summary_table(rows))
    if report and rows:
        from avbench.report import write_report

        files = write_report([outcome.store.root], static_figures=False)
        console.print(f"report: {files.html}")
    n = outcome.counts()
    console.print(
        f"run {outcome.store.root}: {n['measured']} cells measured, {n['already_done']} already "
        f"done, {n['failed']} failed, {n['unsupported']} unsupported",
        highlight=False,
    )
    by_reason: dict[str, list[str]] = {}
    for f in outcome.failed + outcome.unsupported:
        by_reason.setdefault(f["reason"].splitlines()[0], []).append(f["cell_id"])
    for reason, ids in by_reason.items():
        console.print(f"  {len(ids)} cell(s) not measured: {reason}", highlight=False)
    if outcome.failed:
        console.print(f"rerun the failed cells with --resume {outcome.store.root}", highlight=False)
        raise typer.Exit(1)
    if strict and outcome.unsupported:
        raise typer.Exit(3)


def _dyn_overrides(pair: str, runs: list[Path] | None, arms: str | None) -> dict:
    """--schedule-from: those runs' best-static-K schedule and drafting settings, + a dyn arm."""
    if not runs:
        return {}
    from avbench.report.answer import dyn_settings_from
    from avbench.report.runs import load_runs

    kinds = [*(arms.split(",") if arms else []), "dyn"]
    return dyn_settings_from(load_runs(runs), pair) | {"arms": list(dict.fromkeys(kinds))}
