"""HTML report of a run: throughput per GPU vs interactivity (Pareto view), one trace per arm.

The full report (gain tables, estimator parameters) is a later issue; this page already marks
which points are on the throughput-interactivity frontier of their workload.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from avbench.store import RunStore


def pareto_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """True where no other point is at least as good on both axes and better on one."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ge_x = x[None, :] >= x[:, None]
    ge_y = y[None, :] >= y[:, None]
    strictly = (x[None, :] > x[:, None]) | (y[None, :] > y[:, None])
    dominated = (ge_x & ge_y & strictly).any(axis=1)
    return ~dominated


def _aggregate(cells: pd.DataFrame) -> pd.DataFrame:
    """Mean over repeats, with the spread |max-min|/mean of throughput (DESIGN.md §7)."""
    keys = ["workload", "arm", "concurrency"]
    cells = cells.copy()
    cells["concurrency"] = cells["concurrency"].fillna(-1)
    agg = cells.groupby(keys, dropna=False).agg(
        tput=("output_tok_s_per_gpu", "mean"),
        tput_min=("output_tok_s_per_gpu", "min"),
        tput_max=("output_tok_s_per_gpu", "max"),
        inter=("interactivity_tok_s_user", "mean"),
        accept_len=("acceptance_length", "mean"),
        repeats=("repeat", "count"),
    )
    agg["spread"] = (agg["tput_max"] - agg["tput_min"]) / agg["tput"]
    return agg.reset_index()


def write_report(store: RunStore, out: Path | None = None) -> Path:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    manifest = store.read_manifest()
    cells = store.cells_frame()
    out = Path(out) if out else store.root / "report.html"
    if cells.empty:
        out.write_text("<html><body><p>No finished cells in this run.</p></body></html>")
        return out
    agg = _aggregate(cells)
    workloads = list(dict.fromkeys(agg["workload"]))
    fig = make_subplots(
        rows=len(workloads),
        cols=1,
        subplot_titles=workloads,
        vertical_spacing=min(0.15, 0.35 / len(workloads)),
    )
    arms = list(dict.fromkeys(cells["arm"]))
    palette = ["#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692"]
    for wi, w in enumerate(workloads, start=1):
        sub = agg[agg["workload"] == w].dropna(subset=["tput", "inter"])
        front = pareto_mask(sub["inter"].to_numpy(), sub["tput"].to_numpy()) if len(sub) else []
        sub = sub.assign(on_front=front)
        for ai, arm in enumerate(arms):
            a = sub[sub["arm"] == arm].sort_values("concurrency")
            if a.empty:
                continue
            fig.add_trace(
                go.Scatter(
                    x=a["inter"],
                    y=a["tput"],
                    mode="lines+markers+text",
                    name=arm,
                    legendgroup=arm,
                    showlegend=wi == 1,
                    text=[f"c={int(c)}" if c >= 0 else "rate" for c in a["concurrency"]],
                    textposition="top center",
                    marker=dict(
                        color=palette[ai % len(palette)],
                        size=[12 if f else 7 for f in a["on_front"]],
                        symbol=["star" if f else "circle" for f in a["on_front"]],
                    ),
                    line=dict(color=palette[ai % len(palette)]),
                    customdata=np.stack([a["accept_len"].fillna(np.nan), a["spread"]], axis=-1),
                    hovertemplate=(
                        f"{arm}<br>%{{text}}<br>interactivity %{{x:.1f}} tok/s/user<br>"
                        "throughput %{y:.1f} tok/s/GPU<br>accept len %{customdata[0]:.2f}"
                        "<br>spread %{customdata[1]:.1%}<extra></extra>"
                    ),
                ),
                row=wi,
                col=1,
            )
        fig.update_xaxes(
            title_text="interactivity (tok/s/user = 1000 / median TPOT ms)", row=wi, col=1
        )
        fig.update_yaxes(title_text="output tok/s per GPU", row=wi, col=1)
    pair = manifest.get("pair", {}).get("name", "?")
    fig.update_layout(
        title=f"{pair}: throughput vs interactivity (stars: on the frontier of their workload)",
        height=max(450, 420 * len(workloads)),
        template="plotly_white",
    )
    failures = store.failures()
    fail_html = ""
    if failures:
        items = "".join(
            f"<li><code>{f['cell_id']}</code>: {_esc(f['reason'].splitlines()[0])}</li>"
            for f in failures
        )
        fail_html = f"<h2>Cells not measured</h2><ul>{items}</ul>"
    table = agg.rename(
        columns={"tput": "tok/s/GPU", "inter": "tok/s/user", "accept_len": "accept length"}
    ).drop(columns=["tput_min", "tput_max"])
    html = (
        "<html><head><meta charset='utf-8'><title>avbench report</title></head><body>"
        f"<h1>avbench run {manifest.get('run_id')}</h1>"
        f"<p>pair <b>{pair}</b>, sweep <b>{manifest.get('sweep', {}).get('name')}</b>, "
        f"vLLM {manifest.get('versions', {}).get('vllm')}, started {manifest.get('started_at')}</p>"
        + fig.to_html(full_html=False, include_plotlyjs=True)
        + "<h2>Cells (mean over repeats)</h2>"
        + table.to_html(index=False, float_format=lambda v: f"{v:.3g}")
        + fail_html
        + "</body></html>"
    )
    out.write_text(html, encoding="utf-8")
    return out


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
