"""Every table of the study, regenerated from labeled drafts (and estimator logs when stored).

Each table is computed into a `Table` (pure data) and rendered to markdown and CSV. Published
values (docs/published-numbers.md) sit in their own columns whose names start with "published".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from avbench.estimator import published as pub
from avbench.estimator.calibration import DEFAULT_BINS, Bootstrap, compare, metrics
from avbench.estimator.drafts import (
    DRAFTS_SUFFIX,
    ESTIMATOR_SUFFIX,
    DraftsError,
    find_files,
    read_drafts,
    read_estimator_log,
)
from avbench.estimator.features import (
    FEATURES,
    GROUP_KEYS,
    FeatureMode,
    StreamKey,
    fitted_predictions,
    stream_key,
)
from avbench.estimator.lossless import check_features
from avbench.estimator.online import ReplayResult


@dataclass
class Table:
    name: str  # file stem
    title: str
    columns: list[str]
    rows: list[list[object]]
    notes: list[str] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)  # figures quoted in notes, for callers


def _fmt(v: object, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        return "n/a" if math.isnan(v) else f"{v:.{digits}f}"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return str(v)


def to_markdown(t: Table) -> str:
    lines = [
        f"### {t.title}",
        "",
        "| " + " | ".join(t.columns) + " |",
        "|" + "---|" * len(t.columns),
    ]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in t.rows]
    lines += [""] + [f"- {n}" for n in t.notes]
    return "\n".join(lines).rstrip() + "\n"


def to_frame(t: Table) -> pd.DataFrame:
    return pd.DataFrame(
        [[_fmt(v, 6) if isinstance(v, (float, np.floating)) else v for v in r] for r in t.rows],
        columns=t.columns,
    )


# ----------------------------------------------------------------------------- inputs


@dataclass
class Inputs:
    drafts: pd.DataFrame
    estimator_logs: pd.DataFrame | None
    sources: list[Path]


def load_inputs(sources: Sequence[Path]) -> Inputs:
    paths = find_files(sources, DRAFTS_SUFFIX)
    if not paths:
        raise DraftsError(
            f"{', '.join(str(s) for s in sources)}: no *{DRAFTS_SUFFIX} files found (run `avbench trace` first)"
        )
    frames = [read_drafts(p) for p in paths]
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    logs = [read_estimator_log(p) for p in find_files(sources, ESTIMATOR_SUFFIX)]
    return Inputs(df, pd.concat(logs, ignore_index=True) if logs else None, paths)


# ----------------------------------------------------------------------------- computation


@dataclass
class Context:
    """Drafts plus every feature's prediction, computed once and shared by the tables."""

    df: pd.DataFrame
    preds: dict[str, np.ndarray]  # a feature absent from the drafts (the head) has no entry
    replays: dict[StreamKey, ReplayResult]  # logit(q_max) estimator per stream
    n_bins: int = DEFAULT_BINS
    round_steps: int = 100
    feature_mode: FeatureMode = "exact"  # "vllm": logit(q_max) rounded as vLLM's kernel does

    @classmethod
    def build(
        cls,
        df: pd.DataFrame,
        n_bins: int = DEFAULT_BINS,
        round_steps: int = 100,
        feature_mode: FeatureMode = "exact",
    ) -> Context:
        preds: dict[str, np.ndarray] = {}
        replays: dict[StreamKey, ReplayResult] = {}
        for feat in FEATURES:
            raw = feat.raw(df, feature_mode)
            if raw is None:
                continue
            if feat.fitted:
                preds[feat.key], res = fitted_predictions(df, raw, round_steps)
                if feat.key == "logit_qmax_fitted":
                    replays = res
            else:
                preds[feat.key] = raw
        # A stored estimator prediction (e.g. logged by the server) wins over our replay.
        stored = df["estimator_pred"].to_numpy(dtype=np.float64)
        preds["estimator"] = stored if not np.isnan(stored).any() else preds["logit_qmax_fitted"]
        return cls(df, preds, replays, n_bins, round_steps, feature_mode)

    @property
    def y(self) -> np.ndarray:
        return self.df["label"].to_numpy(dtype=np.float64)

    @property
    def position(self) -> np.ndarray:
        return self.df["position"].to_numpy()

    def pairs_without_head(self) -> list[str]:
        h = self.df["head_score"].isna()
        return sorted(self.df.loc[h, "pair_id"].astype(str).unique())


def feature_table(ctx: Context, lossless_n: int = 500) -> Table:
    checks = {r.key: r for r in check_features(n=lossless_n)}
    y = ctx.y
    cols = [
        "feature", "lossless (exact check)", "AUC", "log-loss", f"ECE ({ctx.n_bins} bins)",
        "mean pred", "observed",
        "published lossless", "published AUC", "published ECE", "published mean pred", "published observed",
    ]  # fmt: skip
    rows: list[list[object]] = []
    partial: list[str] = []
    for feat in FEATURES:
        chk = checks[feat.key]
        lossless = (
            "yes (by construction)" if chk.lossless is None else ("yes" if chk.lossless else "NO")
        )
        p = pub.FEATURES.get(feat.key, {})
        pubcols = [p.get(k) for k in ("lossless", "auc", "ece", "mean_pred", "observed")]
        pred = ctx.preds.get(feat.key)
        if pred is None:
            rows.append(
                [
                    feat.label,
                    lossless,
                    "no head scores in these drafts",
                    None,
                    None,
                    None,
                    None,
                    *pubcols,
                ]
            )
            continue
        ok = ~np.isnan(pred)  # only the head can be partly missing
        m = metrics(y[ok], pred[ok], ctx.n_bins)
        if not ok.all():
            partial.append(f"{feat.label}: scored on the {int(ok.sum())} drafts that have one")
        rows.append(
            [feat.label, lossless, m.auc, m.log_loss, m.ece, m.mean_pred, m.observed, *pubcols]
        )
    notes = [
        f"{len(y)} labeled drafts; ECE over {ctx.n_bins} equal-width bins of the prediction.",
        f"'fitted' = the online estimator's model and update rule (shared slope, per-position intercepts, "
        f"rounds of {ctx.round_steps} steps) replayed on that feature; each draft scored with the parameters "
        f"in force when it was drafted; logit(q_max) feature mode '{ctx.feature_mode}'. Entropy enters negated.",
        "lossless: exact output distribution of rejection sampling with trimming decided by the feature, over "
        f"{checks['qmax_nofit'].cases} random (p, q, threshold) cases, tolerance 1e-12.",
        f"published columns: {pub.SOURCE}.",
        *partial,
    ]
    return Table(
        "features", "Confidence features: losslessness, ranking and calibration", cols, rows, notes
    )


def _clusters(df: pd.DataFrame) -> np.ndarray:
    return df.groupby([*GROUP_KEYS, "request_id"], sort=False, observed=True).ngroup().to_numpy()


def estimator_vs_head_table(ctx: Context, n_boot: int = 200, level: float = 0.95) -> Table:
    est, head = ctx.preds["estimator"], ctx.preds.get("head")
    title = "Online estimator vs confidence head"
    if head is None:
        return Table(
            "estimator_vs_head",
            title,
            ["subset", "result", "published"],
            [
                [
                    "all positions",
                    f"not applicable: no confidence-head scores for pair(s) {', '.join(ctx.pairs_without_head())}",
                    pub.ESTIMATOR_VS_HEAD["all"],
                ],
                [
                    "excluding position 1",
                    "not applicable: no confidence-head scores",
                    pub.ESTIMATOR_VS_HEAD["excl1"],
                ],
            ],
            [f"published column: {pub.SOURCE}."],
        )
    y, pos, cl = ctx.y, ctx.position, _clusters(ctx.df)
    has = ~np.isnan(head)  # compare on the drafts that have a head score
    pct = int(round(level * 100))
    cols = ["subset", "n"]
    for m in ("AUC", "log-loss", f"ECE ({ctx.n_bins} bins)"):
        cols += [f"estimator {m}", f"head {m}", f"estimator - head {m} [{pct}% CI]"]
    cols.append("published")
    rows: list[list[object]] = []
    for label, mask, key in (
        ("all positions", has, "all"),
        ("excluding position 1", has & (pos > 1), "excl1"),
    ):
        c = compare(y[mask], est[mask], head[mask], cl[mask], Bootstrap(n_boot, level), ctx.n_bins)
        row: list[object] = [label, c.a.n]
        for k in ("auc", "log_loss", "ece"):
            row += [
                getattr(c.a, k),
                getattr(c.b, k),
                f"{c.diff[k]:+.4f} [{c.ci_low[k]:+.4f}, {c.ci_high[k]:+.4f}]",
            ]
        row.append(pub.ESTIMATOR_VS_HEAD[key])
        rows.append(row)
    notes = [
        f"CI: paired percentile bootstrap over requests ({n_boot} replicates); both predictors see the same resample.",
        f"published column: {pub.SOURCE}.",
    ]
    return Table("estimator_vs_head", title, cols, rows, notes)


def per_position_table(ctx: Context) -> Table:
    y, pos = ctx.y, ctx.position
    est, head, qmax = ctx.preds["estimator"], ctx.preds.get("head"), ctx.preds["qmax_nofit"]
    cols = [
        "position",
        "n",
        "acceptance",
        "estimator AUC",
        "head AUC",
        "estimator - head",
        "q_max AUC",
        "estimator ECE",
    ]
    rows: list[list[object]] = []
    for k in np.unique(pos):
        m = pos == k
        me = metrics(y[m], est[m], ctx.n_bins)
        mh = None
        if head is not None:
            mm = m & ~np.isnan(head)
            mh = metrics(y[mm], head[mm], ctx.n_bins)
        mq = metrics(y[m], qmax[m], ctx.n_bins)
        rows.append(
            [
                int(k), me.n, me.observed, me.auc,
                mh.auc if mh else "no head", (me.auc - mh.auc) if mh else "n/a", mq.auc, me.ece,
            ]
        )  # fmt: skip
    notes = [
        "AUC within one draft position (label 1 accepted, 0 first rejection); n/a where one class is absent.",
        f"published ({pub.SOURCE}): {pub.PER_POSITION}.",
    ]
    if head is None:
        notes.insert(0, "no confidence-head scores in these drafts: head columns not applicable.")
    return Table("auc_per_position", "AUC per draft position", cols, rows, notes)


def _final_params(ctx: Context, logs: pd.DataFrame | None) -> pd.DataFrame:
    """Final (omega, beta_1) per stream: from the stored estimator log, else from our replay."""
    out = []
    df = ctx.df
    stats = df.groupby(GROUP_KEYS, observed=True).agg(
        n=("label", "size"), acceptance=("label", "mean"), mean_entropy=("entropy", "mean")
    )
    for key, st in stats.iterrows():
        omega = beta1 = float("nan")
        refits, source = "0/0", "replay"
        if logs is not None:
            sel = logs[
                (logs["run_id"] == key[0])
                & (logs["pair_id"] == key[1])
                & (logs["workload_id"] == key[2])
            ]
            if len(sel):
                last = sel[sel["round"] == sel["round"].max()]
                omega = float(last["omega"].iloc[0])
                b1 = last.loc[last["position"] == 1, "beta"]
                beta1 = float(b1.iloc[0]) if len(b1) else float("nan")
                per_round = sel.groupby("round")["moved"].any()
                refits, source = f"{int(per_round.sum())}/{len(per_round)}", "estimator log"
        if source == "replay":
            res = ctx.replays.get(stream_key(key))
            if res is not None and res.refits:
                omega, beta1 = res.omega, float(res.beta[0])
                refits = f"{sum(r.moved for r in res.refits)}/{len(res.refits)}"
        out.append(
            {
                "run_id": key[0], "pair_id": key[1], "workload_id": key[2], "n": int(st["n"]),
                "acceptance": float(st["acceptance"]), "mean_entropy": float(st["mean_entropy"]),
                "refits": refits, "omega": omega, "beta1": beta1, "source": source,
            }
        )  # fmt: skip
    return pd.DataFrame(out)


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    ok = ~(np.isnan(a) | np.isnan(b))
    if ok.sum() < 3 or np.std(a[ok]) == 0 or np.std(b[ok]) == 0:
        return float("nan")
    return float(np.corrcoef(a[ok], b[ok])[0, 1])


def workload_table(ctx: Context, logs: pd.DataFrame | None) -> Table:
    fp = _final_params(ctx, logs)
    cols = [
        "pair",
        "workload",
        "run",
        "drafts",
        "acceptance",
        "mean draft entropy (nats)",
        "refits that moved/total",
        "slope ω",
        "position-1 intercept β1",
        "source",
    ]
    rows = [
        [
            r.pair_id,
            r.workload_id,
            r.run_id,
            r.n,
            r.acceptance,
            r.mean_entropy,
            r.refits,
            r.omega,
            r.beta1,
            r.source,
        ]
        for r in fp.itertuples()
    ]
    lo, hi = pub.SLOPE_RANGE_WORKLOADS
    # Streams where no refit moved any parameter still hold the cold start: they would
    # correlate the absence of data, not the fit, so they are left out. A refit whose slope
    # step was masked still moves the intercepts: such streams stay in.
    moved = fp[fp["refits"].map(lambda r: not str(r).startswith("0/"))]
    r_w = _corr(moved["omega"].to_numpy(), moved["mean_entropy"].to_numpy())
    r_b = _corr(moved["beta1"].to_numpy(), moved["mean_entropy"].to_numpy())
    need = "n/a (needs >= 3 workloads whose parameters moved)"
    rows.append(
        ["published", "all", "-", None, None, None, None, f"{lo}-{hi}", pub.BETA1_TEXT, pub.SOURCE]
    )
    notes = [
        f"correlation with mean draft entropy over the {len(moved)} streams above whose parameters moved "
        f"in at least one refit: slope r = {_fmt(r_w, 3) if not math.isnan(r_w) else need} "
        f"(published r = {pub.R_SLOPE_ENTROPY}); position-1 intercept r = {_fmt(r_b, 3) if not math.isnan(r_b) else need} "
        f"(published r = {pub.R_BETA1_ENTROPY}).",
        f"final parameters after the last complete round of {ctx.round_steps} steps; n/a when a stream has fewer "
        "steps. As in vLLM's refit kernel, a slope step that is NaN or would make the slope negative is "
        "masked and the intercepts still move; a refit moves nothing only when its round has no labels.",
    ]
    extra = {"r_slope_entropy": r_w, "r_beta1_entropy": r_b}
    return Table(
        "slope_per_workload",
        "Fitted slope and position-1 intercept per workload",
        cols,
        rows,
        notes,
        extra,
    )


def pair_table(ctx: Context, logs: pd.DataFrame | None) -> Table:
    fp = _final_params(ctx, logs)
    cols = [
        "pair",
        "workloads",
        "mean slope ω",
        "min slope",
        "max slope",
        "published slope range across pairs",
    ]
    lo, hi = pub.SLOPE_RANGE_PAIRS
    rows: list[list[object]] = []
    for pair, g in fp.groupby("pair_id", sort=True):
        w = g["omega"].to_numpy()
        ok = w[~np.isnan(w)]
        rows.append(
            [pair, len(g), float(ok.mean()) if ok.size else float("nan"), float(ok.min()) if ok.size else float("nan"),
             float(ok.max()) if ok.size else float("nan"), f"{lo}-{hi}"]
        )  # fmt: skip
    notes = [
        f"published column: {pub.SOURCE}; slope per pair = final slope of each workload stream."
    ]
    return Table("slope_per_pair", "Fitted slope per model pair", cols, rows, notes)


def refit_table(ctx: Context) -> Table:
    """What each stream's logit(q_max) estimator did at its refits (see online.newton_update)."""
    cols = [
        "pair",
        "workload",
        "run",
        "refits",
        "refits that moved",
        "slope step masked (negative)",
        "slope step masked (NaN)",
        "refits without labels",
        "slope ω",
        "β1",
    ]
    rows: list[list[object]] = []
    for key, res in sorted(ctx.replays.items(), key=lambda kv: tuple(map(str, kv[0]))):
        refits = res.refits
        rows.append(
            [
                key[1], key[2], key[0], len(refits), sum(r.moved for r in refits),
                sum(r.slope_masked == "negative-slope" for r in refits),
                sum(r.slope_masked == "nan" for r in refits),
                sum(int(r.n.sum()) == 0 for r in refits),
                res.omega, float(res.beta[0]) if len(res.beta) else float("nan"),
            ]
        )  # fmt: skip
    notes = [
        "vLLM's refit kernel masks only the slope step (NaN, or a slope that would turn negative); "
        "the intercepts still take their step, solved with the slope step actually taken.",
        f"A round of {ctx.round_steps} step() calls without a labeled draft still ends in a refit, which moves "
        "nothing.",
    ]
    return Table(
        "estimator_refits", "Estimator refits per stream (logit(q_max))", cols, rows, notes
    )


def all_tables(
    inputs: Inputs,
    n_bins: int = DEFAULT_BINS,
    n_boot: int = 200,
    feature_mode: FeatureMode = "exact",
) -> list[Table]:
    ctx = Context.build(inputs.drafts, n_bins, feature_mode=feature_mode)
    return [
        feature_table(ctx),
        estimator_vs_head_table(ctx, n_boot),
        per_position_table(ctx),
        workload_table(ctx, inputs.estimator_logs),
        pair_table(ctx, inputs.estimator_logs),
        refit_table(ctx),
    ]


def write_tables(tables: list[Table], out_dir: Path, sources: Sequence[Path] = ()) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = ["# avbench estimator tables", ""]
    if sources:
        parts += ["Inputs: " + ", ".join(str(s) for s in sources), ""]
    for t in tables:
        to_frame(t).to_csv(out_dir / f"{t.name}.csv", index=False)
        parts.append(to_markdown(t))
    md = out_dir / "tables.md"
    md.write_text("\n".join(parts))
    return md
