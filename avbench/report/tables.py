"""The report's tables as rows of text, rendered to Markdown or HTML. Missing values are "—"."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass

from avbench.analysis.gain import GainRow, GainTable
from avbench.analysis.points import POOLED
from avbench.analysis.recommend import Decision, Recommendation
from avbench.inputs.schedule import DYN_TOLERANCE_TOKENS, DynCheck

MISSING = "—"


def fmt(v, spec: str = ".1f", suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return MISSING
    return f"{v:{spec}}{suffix}"


def arrow(off, on, spec: str = ".1f") -> str:
    return f"{fmt(off, spec)} → {fmt(on, spec)}"


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""

    def markdown(self) -> str:
        def line(cells) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        out = [line(self.header), line(["---"] * len(self.header))]
        out += [line(r) for r in self.rows]
        return ("\n".join([f"{self.caption}", "", *out]) if self.caption else "\n".join(out)) + "\n"

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in self.rows
        )
        cap = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ----------------------------------------------------------------------------- gain
def _mark(r: GainRow) -> str:
    v = r.verdict
    if v is None:
        return MISSING
    if not r.noise_known:
        return f"{v} (noise unknown)"
    if v == "within noise":
        return "within noise (not a gain)" if (r.tput_delta_pct or 0) > 0 else "within noise"
    return f"{v} beyond noise"


def _accept_delta(r: GainRow) -> str:
    text = fmt(r.accept_rate_delta_pp, "+.1f", " pp")
    if r.accept_rate_delta_pp is not None and not r.accept_rate_per_verified:
        text += " (ON per scheduled draft)"
    return text


def gain_table(t: GainTable) -> Table:
    rows: list[tuple[str, ...]] = []
    for r in [*t.rows, *([t.mean] if t.mean and len(t.rows) > 1 else [])]:
        rows.append(
            (
                r.workload,
                arrow(r.tput_off, r.tput_on),
                fmt(r.tput_delta_pct, "+.1f", "%"),
                fmt(r.noise_pct, ".1f", "%"),
                arrow(r.tpot_off, r.tpot_on, ".2f"),
                fmt(r.tpot_delta_pct, "+.1f", "%"),
                arrow(r.accept_len_off, r.accept_len_on, ".2f"),
                _accept_delta(r),
                fmt(None if r.trimmed_on is None else r.trimmed_on * 100, ".0f", "%"),
                _mark(r),
            )
        )
    rows += [(w, *[MISSING] * 8, "not measured in both arms") for w in t.missing]
    return Table(
        header=(
            "workload",
            "tok/s/GPU OFF → ON",
            "Δ",
            "noise",
            "median TPOT ms OFF → ON",
            "Δ TPOT",
            "accept length OFF → ON",
            "Δ accepted/verified",
            "ON trimmed",
            "",
        ),
        rows=tuple(rows),
        caption=f"{t.pair}: {t.off_arm} (OFF) → {t.on_arm} (ON) at {t.load}",
    )


def gain_summary(t: GainTable) -> str:
    """One sentence: the mean change and where ON loses."""
    m = t.mean
    if m is None:
        return f"{t.off_arm} → {t.on_arm} at {t.load}: no workload measured in both arms."
    text = f"{t.off_arm} → {t.on_arm} at {t.load}: mean {fmt(m.tput_delta_pct, '+.1f', '%')}"
    if m.noise_pct is None:
        text += " (noise unknown: one repeat)"
    else:
        text += f" (noise {fmt(m.noise_pct, '.1f', '%')})"
    if t.losses:
        text += f"; {t.on_arm} LOSES on " + ", ".join(
            f"{r.workload} ({fmt(r.tput_delta_pct, '+.1f', '%')})" for r in t.losses
        )
    return text + "."


# ----------------------------------------------------------------------------- recommendation
def _option(o) -> str:
    if not o:
        return MISSING
    return f"{o.label} {o.tput:.1f}" + (" (predicted)" if o.predicted else "")


def _noise(d: Decision) -> str:
    if d.runner_up is None:
        return "nothing to compare with"
    if d.noise_pct is None:
        return "noise unknown (one repeat)"
    return f"noise {d.noise_pct:.1f}%: " + ("beyond noise" if d.beyond_noise else "within noise")


def decisions_table(rec: Recommendation) -> Table:
    rows = []
    for d in rec.decisions:
        rows.append(
            (
                f"c={d.concurrency}",
                d.verdict,
                str(d.best_static.k) if d.best_static else MISSING,
                str(d.schedule_k),
                _option(d.winner),
                _option(d.runner_up),
                fmt(d.margin_pct, "+.1f", "%"),
                _noise(d),
                "; ".join(d.notes),
            )
        )
    scope = "all workloads (mean)" if rec.scope == POOLED else rec.scope
    return Table(
        header=(
            "load",
            "verdict",
            "best static K",
            "deploy K",
            "winner tok/s/GPU",
            "runner-up tok/s/GPU",
            "margin",
            "noise",
            "notes",
        ),
        rows=tuple(rows),
        caption=f"{rec.pair}, {scope}",
    )


def recommendation_text(rec: Recommendation, deploy: dict[str, dict | None]) -> str:
    """The verdict per concurrency range and the exact configs to deploy (Markdown)."""
    if not rec.decisions:
        return f"{rec.pair}: no closed-loop concurrency measured; nothing to recommend.\n"
    lines = [f"**{rec.pair}** ({'all workloads' if rec.scope == POOLED else rec.scope}):", ""]
    for r in rec.ranges:
        span = f"c={r.first}" if r.first == r.last else f"c={r.first}–{r.last}"
        ds = [d for d in rec.decisions if r.first <= d.concurrency <= r.last]
        detail = ", ".join(
            f"c={d.concurrency}: {fmt(d.margin_pct, '+.1f', '%')} over "
            f"{d.runner_up.label if d.runner_up else MISSING} ({_noise(d)})"
            for d in ds
        )
        what: str = r.verdict
        if r.verdict == "schedule":
            what += " (K " + ", ".join(str(k) for k in r.ks) + ")"
        predicted = sorted({label for d in ds for label in d.predicted})
        if predicted:
            detail += f"; rests on predicted {', '.join(predicted)} (not measured)"
        bursts = [f"{o.label} at c={d.concurrency}" for d in ds for o in d.burst_delivered]
        if bursts:
            detail += (
                f"; caveat: {', '.join(bursts)} burst-delivered (its throughput counts, its "
                "latency does not)"
            )
        lines.append(f"- {span}: **{what}** — {detail}")
    lines.append("")
    if rec.schedule is not None:
        lines.append(
            f"Best static K as a schedule (what `sweep --schedule-from` measures as a dyn arm): "
            f"`{json.dumps(rec.schedule)}`."
        )
    if rec.deploy_schedule is None:
        lines.append("To deploy: no speculation (it wins at every concurrency measured).")
    else:
        lines.append(
            "To deploy (num_speculative_tokens_per_batch_size, K 0 where no speculation wins; "
            f"vLLM keeps the last range's K for larger batches): "
            f"`{json.dumps(rec.deploy_schedule)}`."
        )
        if any(k == 0 for _, _, k in rec.deploy_schedule):
            lines.append(
                "A K 0 range is not a server without speculation: vLLM still runs the "
                "drafter's first pass over each step's new tokens there (docs/answer.md); "
                "`avbench predict --schedule` prices it from a captured arm, a dyn arm "
                "measures it."
            )
    for name, cfg in deploy.items():
        if cfg is not None:
            lines += ["", f"Deploy {name}:", "", f"    --speculative-config '{json.dumps(cfg)}'"]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- dyn
def dyn_table(arm: str, scope: str, checks: list[DynCheck]) -> Table:
    rows = tuple(
        (
            f"c={c.concurrency}",
            str(c.scheduled_k),
            fmt(c.draft_tokens_per_draft, ".2f"),
            "yes" if c.matches else "NO",
        )
        for c in checks
    )
    return Table(
        header=("load", "scheduled K", "measured draft tokens per draft", "matches"),
        rows=rows,
        caption=f"{arm}, {scope}: counters vs schedule (match: nearer the scheduled K than any "
        f"other K of the schedule; ±{DYN_TOLERANCE_TOKENS} tokens for a single K)",
    )


# ----------------------------------------------------------------------------- predictions
_METRIC_LABEL = {
    "output_tok_s_per_gpu": "tok/s/GPU",
    "tpot_ms_median": "median TPOT ms",
    "acceptance_length": "accept length",
}


def _interval(c, absolute: bool) -> str:
    if c.interval is None:
        return MISSING
    half = fmt(c.interval, ".3f") if absolute else fmt(c.interval * 100, ".1f", "%")
    return f"±{half} ({'yes' if c.covered else 'NO'})"


def _spread(spread: float | None, absolute: bool) -> str:
    if spread is None:
        return MISSING
    return fmt(spread, ".3f") if absolute else fmt(spread * 100, ".1f", "%")


def prediction_table(compared: list, caption: str = "") -> Table:
    """Predicted vs measured per cell group (``avbench.predict.validate.Compared`` rows)."""
    rows = []
    for c in compared:
        absolute = c.metric == "acceptance_length"
        rows.append(
            (
                c.workload,
                c.arm,
                c.load,
                _METRIC_LABEL.get(c.metric, c.metric),
                fmt(c.predicted, ".2f"),
                fmt(c.measured, ".2f"),
                fmt(c.error, "+.3f") if absolute else fmt(c.error * 100, "+.1f", "%"),
                _spread(c.spread, absolute),
                _spread(c.source_spread, absolute),
                (fmt(c.tolerance, ".2f") if absolute else fmt(c.tolerance * 100, ".0f", "%")),
                "yes" if c.within else "NO",
                _interval(c, absolute),
            )
        )
    return Table(
        header=(
            "workload",
            "arm",
            "load",
            "metric",
            "predicted",
            "measured",
            "error",
            "repeat spread",
            "source spread",
            "tolerance",
            "within",
            "interval (covers)",
        ),  # fmt: skip
        rows=tuple(rows),
        caption=caption,
    )
