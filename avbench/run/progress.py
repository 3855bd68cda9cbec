"""Live progress for a sweep (rich): arm, workload, concurrency, requests done, current tok/s."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from avbench.loadgen.records import RequestRecord
from avbench.metrics.quality import identity_text
from avbench.plan.cells import Cell

if TYPE_CHECKING:
    from avbench.analysis.adaptive import Standing


class SweepReporter:
    """Receives sweep events. The base class is silent (tests, library use)."""

    run_dir: Path | None = None  # known once the run directory exists (for the resume hint)

    def run_started(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def arm_started(self, arm: str, detail: str) -> None: ...
    def arm_failed(self, arm: str, reason: str) -> None: ...
    def cell_started(self, cell: Cell) -> None: ...
    def request_done(self, record: RequestRecord, cell_id: str | None = None) -> None:
        """``cell_id``: which running cell it belongs to (None: the one cell running)."""

    def cell_finished(self, cell: Cell, row: dict) -> None: ...
    def cell_failed(self, cell: Cell, reason: str) -> None: ...
    def warning(self, text: str) -> None: ...
    def close(self) -> None: ...


# A reporter call made where the sweep's reporter is not (an arm's own process, a Ray task):
# the method's name and its arguments, sent back to be replayed on the sweep's reporter.
Event = tuple[str, tuple[Any, ...]]
_FORWARDED = frozenset(
    {"arm_started", "arm_failed", "cell_started", "request_done", "cell_finished", "cell_failed",
     "warning"}
)  # fmt: skip


class ForwardingReporter(SweepReporter):
    """Sends each event through ``put`` (a queue's); ``replay`` delivers it."""

    def __init__(self, put: Callable[[Event], None]) -> None:
        self.put = put
        self._cell: str | None = None  # a session runs one cell at a time

    def arm_started(self, arm: str, detail: str) -> None:
        self.put(("arm_started", (arm, detail)))

    def arm_failed(self, arm: str, reason: str) -> None:
        self.put(("arm_failed", (arm, reason)))

    def cell_started(self, cell: Cell) -> None:
        self._cell = cell.id
        self.put(("cell_started", (cell,)))

    def request_done(self, record: RequestRecord, cell_id: str | None = None) -> None:
        self.put(("request_done", (record, cell_id or self._cell)))

    def cell_finished(self, cell: Cell, row: dict) -> None:
        self.put(("cell_finished", (cell, row)))

    def cell_failed(self, cell: Cell, reason: str) -> None:
        self.put(("cell_failed", (cell, reason)))

    def warning(self, text: str) -> None:
        self.put(("warning", (text,)))


def replay(event: Event, reporter: SweepReporter) -> None:
    name, args = event
    if name in _FORWARDED:  # nothing else of the reporter is reachable from a queue
        getattr(reporter, name)(*args)


def make_console() -> Console:
    """stderr console; wide enough for the tables when output goes to a file or CI log."""
    probe = Console(stderr=True)
    return probe if probe.is_terminal else Console(stderr=True, width=160)


def _fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def cell_summary(row: dict) -> str:
    pos = [row[f"accept_pos_{i}"] for i in range(64) if row.get(f"accept_pos_{i}") is not None]
    acc = ""
    if row.get("acceptance_length") is not None:
        acc = (
            f" | accept len {row['acceptance_length']:.2f} per-pos ["
            + ", ".join(f"{p:.2f}" for p in pos)
            + "]"
        )
    if row.get("verified_acceptance_rate") is not None and row.get("arm_kind") == "av":
        acc += (
            f" | accepted/verified {row['verified_acceptance_rate']:.2f}, trimmed "
            f"{row.get('trimmed_share') or 0:.0%} (captured)"
        )
    elif row.get("acceptance_rate_per") == "scheduled draft" and acc:
        acc += " (counters: per scheduled draft, before AV trims)"
    fails = row.get("requests_failed") or 0
    same = identity_text(row, short=True)
    if same != "-":
        acc += f" | identical to baseline: {same}"
    if row.get("stop_reason"):  # a sequential cell: why it stopped, its intervals
        rel = [_fmt(row.get(f"{m}_ci_rel"), ".1%") for m in ("output_tok_s", "tpot_ms_median")]
        acc += (
            f" | {row['stop_reason']} after {row['requests_sent']} requests "
            f"(95% ± {rel[0]} tok/s, ± {rel[1]} TPOT)"
        )
    burst = row.get("stream_burst_frac") or 0
    if burst:
        acc += f" | ⚠ {burst:.0%} of streams arrived in one burst (see stream_burst_frac)"
    return (
        f"{row.get('output_tok_s') and round(row['output_tok_s'], 1)} tok/s | "
        f"TPOT p50 {_fmt(row.get('tpot_ms_median'))} ms | TTFT p50 {_fmt(row.get('ttft_ms_median'))} ms"
        f"{acc}" + (f" | {fails} failed" if fails else "")
    )


@dataclass
class _CellBar:
    task: TaskID
    t0: float  # perf_counter at the cell's start
    tokens: int = 0  # measured output tokens so far


class RichReporter(SweepReporter):
    def __init__(self, console: Console | None = None):
        self.console = console or make_console()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[tok_s]} tok/s"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.progress.start()
        self._cells: dict[str, _CellBar] = {}  # by cell id: arms side by side run cells at once

    def run_started(self, run_dir: Path) -> None:
        super().run_started(run_dir)
        self.progress.start()  # again after close(): an adaptive sweep runs several rounds
        self.console.print(f"run directory: {run_dir}", highlight=False)

    def arm_started(self, arm: str, detail: str) -> None:
        self.console.print(f"[bold cyan]arm {arm}[/]: {detail}")

    def arm_failed(self, arm: str, reason: str) -> None:
        first, *rest = reason.splitlines() or [""]
        self.console.print(f"[bold red]arm {arm} failed:[/] {first}")
        for line in rest[-10:]:
            self.console.print(f"    {line}", markup=False, highlight=False)

    def cell_started(self, cell: Cell) -> None:
        load = f"c={cell.concurrency}" if cell.rate is None else f"rate={cell.rate:g}/s"
        task = self.progress.add_task(
            f"{cell.arm} · {cell.workload} · {load}",
            total=cell.num_requests + cell.warmup,
            tok_s="-",
        )
        self._cells[cell.id] = _CellBar(task, time.perf_counter())

    def request_done(self, record: RequestRecord, cell_id: str | None = None) -> None:
        bar = self._cells.get(cell_id or next(reversed(self._cells), ""))
        if bar is None:
            return
        if not record.warmup:
            bar.tokens += sum(record.chunk_tokens)
        dt = max(time.perf_counter() - bar.t0, 1e-9)
        # The bar counts conversations: a multi-turn one advances on its first turn only.
        self.progress.update(
            bar.task, advance=1 if record.turn == 0 else 0, tok_s=f"{bar.tokens / dt:.0f}"
        )

    def cell_finished(self, cell: Cell, row: dict) -> None:
        bar = self._cells.pop(cell.id, None)
        if bar is not None:
            self.progress.update(bar.task, completed=cell.num_requests + cell.warmup)
            self.progress.remove_task(bar.task)
        self.console.print(f"  ✓ {cell.id}: {cell_summary(row)}", highlight=False)

    def cell_failed(self, cell: Cell, reason: str) -> None:
        bar = self._cells.pop(cell.id, None)
        if bar is not None:
            self.progress.remove_task(bar.task)
        self.console.print(f"  [red]✗ {cell.id}[/]: {reason.splitlines()[0] if reason else ''}")

    def warning(self, text: str) -> None:
        self.console.print(f"[bold yellow]warning:[/] {text}", highlight=False)

    def close(self) -> None:
        self.progress.stop()


# (column, header, format) of the end-of-sweep table; headers are explained by its caption.
SUMMARY_COLUMNS = (
    ("output_tok_s", "tok/s", ".1f"),
    ("output_tok_s_per_gpu", "tok/s/GPU", ".1f"),
    ("ttft_ms_median", "TTFT p50 ms", ".1f"),
    ("queue_delay_ms_median", "queue p50 ms", ".1f"),
    ("tpot_ms_median", "TPOT p50 ms", ".1f"),
    ("itl_ms_median", "ITL/token p50 ms", ".2f"),
    ("chunk_latency_ms_median", "chunk gap p50 ms", ".1f"),
    ("acceptance_length", "accept len", ".2f"),
    ("identical_to_baseline_share", "= baseline", ".0%"),
)
IDENTITY = "identical_to_baseline_share"  # shown as identity_text: a share, or why there is none


def summary_table(rows: list[dict]) -> Table:
    from avbench.store.cellrow import PEER_DIFFERENCES

    table = Table(title="cells", caption="\n".join(PEER_DIFFERENCES), caption_justify="left")
    table.add_column("cell", overflow="fold", min_width=28)
    for _, header, _ in SUMMARY_COLUMNS:
        table.add_column(header, justify="right", overflow="fold")
    table.add_column("per-position", overflow="fold")
    for r in rows:
        pos = [r.get(f"accept_pos_{i}") for i in range(64)]
        pos = [p for p in pos if p is not None]
        load = f"c={r['concurrency']}" if r.get("rate") is None else f"rate={r['rate']:g}/s"
        table.add_row(
            f"{r['arm']} · {r['workload']} · {load}",
            *(
                identity_text(r, short=True) if col == IDENTITY else _fmt(r.get(col), spec)
                for col, _, spec in SUMMARY_COLUMNS
            ),
            " ".join(f"{p:.2f}" for p in pos) or "-",
        )
    return table


def standings_table(standings: list[Standing], title: str = "verdicts (adaptive)") -> Table:
    """An adaptive sweep's verdict per concurrency, with what it rests on."""
    noise = max((s.cell_noise for s in standings), default=0.0)
    table = Table(title=title, caption=f"one measured cell's noise: ±{noise:.1%}")
    for header in ("load", "verdict", "standing", "margin", "contenders", "rests on"):
        table.add_column(header)
    for s in standings:
        table.add_row(
            f"c={s.concurrency}",
            s.verdict,
            s.state,
            "-" if s.margin is None else f"{s.margin:+.1%}",
            ", ".join(o.arm for o in s.contenders) or "-",
            "a prediction" if s.rests_on_prediction else "measurements",
        )
    return table
