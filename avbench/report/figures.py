"""The report's plotly figures. Each function takes analysed data and returns one figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from avbench.analysis.frontier import frontier_line, static_envelope, with_frontier
from avbench.analysis.points import burst_delivered
from avbench.report.tables import fmt

PALETTE = ["#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880"]
X_TITLE = "interactivity (tok/s/user = 1000 / median TPOT ms)"
Y_TITLE = "output tok/s per GPU"


def arm_colors(arms: list[str]) -> dict[str, str]:
    return {a: PALETTE[i % len(PALETTE)] for i, a in enumerate(arms)}


def _marker(part: pd.DataFrame, shape: str, color: str | None) -> dict:
    """Frontier points large and outlined, predicted ones hollow, burst-delivered ones crossed
    and faded."""
    pairs = list(zip(part["on_frontier"], part["predicted"], strict=True))
    return dict(
        color=color,
        size=[13 if f else 8 for f in part["on_frontier"]],
        symbol=[
            shape + ("-x" if bad else "") + ("-open" if p else "")
            for p, bad in zip(part["predicted"], part["suspect"], strict=True)
        ],
        opacity=[0.45 if bad else 1.0 for bad in part["suspect"]],
        line=dict(
            width=[2 if f or p else 0 for f, p in pairs],
            color=[color if p and not f else "#222" for f, p in pairs],
        ),
    )


def _arm_trace(arm: str, a: pd.DataFrame, part: pd.DataFrame, closed: bool, color: str | None):
    """One arm's closed-loop points (joined) or open-loop rates (diamonds); ``a``: all its points."""
    predicted = bool(a["predicted"].all())
    return go.Scatter(
        x=part["x"],
        y=part["y"],
        mode="lines+markers+text" if closed else "markers+text",
        name=f"{arm} (predicted)" if predicted else arm,
        legendgroup=arm,
        showlegend=bool(closed or a["concurrency"].isna().all()),
        text=[
            f"{lo}{' (pred.)' if p else ''}{' ⚠' if bad else ''}"
            for lo, p, bad in zip(part["load"], part["predicted"], part["suspect"], strict=True)
        ],
        textposition="top center",
        marker=_marker(part, "circle" if closed else "diamond", color),
        line=dict(color=color, dash="dot" if predicted else None),
        # A predicted point's 95% interval (the replay's sampling and the cost model's part
        # one K cannot identify): measured points carry none.
        error_y=_interval(part),
        customdata=np.stack(
            [
                [fmt(x, ".2f") for x in part["acceptance_length"]],
                [fmt(x * 100, ".1f", "%") for x in part["y_spread"]],
                [f"<br>⚠ {bad}" if bad else "" for bad in part["suspect"]],
            ],
            axis=-1,
        ),
        hovertemplate=(
            f"{arm} %{{text}}<br>%{{x:.1f}} tok/s/user<br>%{{y:.1f}} tok/s/GPU"
            "<br>accept length %{customdata[0]}<br>spread %{customdata[1]}"
            "%{customdata[2]}<extra></extra>"
        ),
    )


def _interval(part: pd.DataFrame) -> dict | None:
    if "y_ci95" not in part or not part["predicted"].any():
        return None
    half = part["y_ci95"].where(part["predicted"]).fillna(0.0)
    return dict(type="data", array=half.tolist(), visible=True, thickness=1)


def _add_guides(fig: go.Figure, v: pd.DataFrame) -> None:
    """The best static K per load and the frontier, as lines over the arms' points."""
    env = static_envelope(v)
    if not env.empty:
        fig.add_trace(
            go.Scatter(
                x=env["x"],
                y=env["y"],
                mode="lines",
                name="best static K",
                line=dict(color="#888", dash="dot", width=3),
                text=[f"{lo}: {a}" for lo, a in zip(env["load"], env["arm"], strict=True)],
                hovertemplate="best static K %{text}<extra></extra>",
            )
        )
    front = frontier_line(v)
    if not front.empty:
        fig.add_trace(
            go.Scatter(
                x=front["x"],
                y=front["y"],
                mode="lines",
                name="frontier",
                line=dict(color="#222", dash="dash", width=1),
                hoverinfo="skip",
            )
        )


def pareto(view: pd.DataFrame, title: str, colors: dict[str, str]) -> go.Figure:
    """One trace per arm (closed-loop points joined, open-loop rates as their own diamonds),
    the frontier, and the best static K per load. Predicted points (avbench predict) are
    hollow, with their 95% interval as an error bar, and their arm's legend says so; burst-delivered points are crossed and faded, the
    reason in their hover and a "⚠" by their label."""
    v = with_frontier(view.dropna(subset=["x", "y"])).sort_values("load_order")
    if "predicted" not in v:
        v = v.assign(predicted=False)
    v = v.assign(suspect=[burst_delivered(r) or "" for _, r in v.iterrows()])
    fig = go.Figure()
    for arm in dict.fromkeys(v["arm"]):
        a = v[v["arm"] == arm]
        for closed, part in a.groupby(a["concurrency"].notna(), sort=False):
            fig.add_trace(_arm_trace(arm, a, part, bool(closed), colors.get(arm)))
    _add_guides(fig, v)
    fig.update_layout(
        title=title,
        xaxis_title=X_TITLE,
        yaxis_title=Y_TITLE,
        template="plotly_white",
        height=480,
        margin=dict(t=60),
    )
    return fig


def refit_trajectories(refits: pd.DataFrame, title: str) -> go.Figure:
    """Slope and per-position intercepts of the online estimator, refit by refit."""
    fig = go.Figure()
    for arm, r in refits.sort_values(["arm", "step_count"]).groupby("arm", sort=False):
        fig.add_trace(
            go.Scatter(x=r["step_count"], y=r["slope"], mode="lines+markers", name=f"{arm} slope")
        )
        intercepts = np.array([list(i) for i in r["intercepts"]], dtype=float)
        for pos in range(intercepts.shape[1] if intercepts.ndim == 2 else 0):
            fig.add_trace(
                go.Scatter(
                    x=r["step_count"],
                    y=intercepts[:, pos],
                    mode="lines",
                    name=f"{arm} intercept pos {pos + 1}",
                    line=dict(dash="dot"),
                )
            )
    fig.update_layout(
        title=title,
        xaxis_title="engine step of the refit",
        yaxis_title="coefficient",
        template="plotly_white",
        height=480,
        margin=dict(t=60),
    )
    return fig


def acceptance_by_position(points: pd.DataFrame, colors: dict[str, str]) -> go.Figure | None:
    """Unconditional acceptance per draft position, per workload, mean over loads."""
    cols = sorted(
        (c for c in points.columns if c.startswith("accept_pos_")),
        key=lambda c: int(c.rsplit("_", 1)[1]),
    )
    spec = points.dropna(subset=cols, how="all") if cols else points.iloc[0:0]
    if spec.empty:
        return None
    panels = list(dict.fromkeys(zip(spec["pair"], spec["workload"], strict=True)))
    fig = make_subplots(
        rows=1,
        cols=len(panels),
        # Two lines: a pair labelled with its sampling is too long for a panel of three.
        subplot_titles=[f"{p}<br>{w}" for p, w in panels],
        shared_yaxes=True,
    )
    for i, (pair, workload) in enumerate(panels, start=1):
        sub = spec[(spec["pair"] == pair) & (spec["workload"] == workload)]
        for arm, a in sub.groupby("arm", sort=False):
            means = a[cols].mean()
            keep = means.notna().to_numpy()
            fig.add_trace(
                go.Scatter(
                    x=np.arange(1, len(cols) + 1)[keep],
                    y=means[keep],
                    mode="lines+markers",
                    name=arm,
                    legendgroup=arm,
                    showlegend=i == 1,
                    line=dict(color=colors.get(arm)),
                ),
                row=1,
                col=i,
            )
        fig.update_xaxes(title_text="draft position", dtick=1, row=1, col=i)
    fig.update_yaxes(title_text="accepted / drafts", row=1, col=1)
    fig.update_layout(
        title="Acceptance per draft position (unconditional; under AV 'not accepted' mixes "
        "trimmed and rejected)",
        template="plotly_white",
        height=420,
        margin=dict(t=110),
    )
    fig.update_annotations(font_size=11)
    return fig


def latency_distributions(cells: list[tuple[str, np.ndarray, np.ndarray]], title: str) -> go.Figure:
    """TTFT and TPOT per request, one box per cell (label, ttft ms, tpot ms)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["TTFT (ms)", "TPOT (ms)"])
    for label, ttft, tpot in cells:
        fig.add_trace(go.Box(y=ttft, name=label, showlegend=False, boxpoints=False), row=1, col=1)
        fig.add_trace(go.Box(y=tpot, name=label, showlegend=False, boxpoints=False), row=1, col=2)
    fig.update_layout(title=title, template="plotly_white", height=440)
    return fig
