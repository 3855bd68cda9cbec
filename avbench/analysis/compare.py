"""Compare two runs cell by cell: is tonight worse than last night by more than the noise?

A cell of one run matches a cell of the other when they share pair, workload, arm and load
(concurrency or rate). Matching cells are compared only when their settings agree too: the
sampling, the prompts (hash of the ordered conversation ids), the request counts and the
server (the arm's vLLM command line without host, port and interpreter, its environment and
its plugin captures).
Cells whose settings differ are listed with the settings that differ, never compared; the
vLLM version is deliberately *not* a setting: a vLLM upgrade is what a nightly comparison is
for.

Noise. Each run's noise for a metric is the spread of its repeats, (max - min) / mean
(docs/fair-comparisons.md). A latency median (TTFT, TPOT) also has a sampling noise from its
requests, which a single repeat has too: the half-width of the 95% bootstrap interval of the
relative difference between the two runs' medians, resampling each run's requests (pooled
over its repeats). A difference counts only when |new - base| / base exceeds the largest of
the two spreads, the sampling noise and the tolerance floor (default 5%). A cell is "worse"
when any metric is worse beyond the noise, "better" when one is better and none worse, else
"same within noise". A cell without a throughput on either side (none measured, NaN) is "not
comparable", whatever its latencies say.

Pure: pandas in, typed results out.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from avbench.store.artefacts import RunManifest

DEFAULT_TOLERANCE = 0.05
BOOTSTRAP_RESAMPLES = 2000
KEYS = ("pair", "workload", "arm", "concurrency", "rate")
SAMPLING_COLUMNS = ("temperature", "top_p", "max_tokens", "ignore_eos", "chat_template_kwargs")
REQUEST_COLUMNS = (
    "num_requests",
    "warmup",
    "prompts_sha256",
    "api",
    "input_len",
    "output_len",
    "len_range",
)

Verdict = Literal["better", "same within noise", "worse", "n/a", "not comparable"]


@dataclass(frozen=True)
class Metric:
    column: str
    label: str
    higher_is_better: bool
    unit: str
    required: bool = False  # without it on both sides the cell is not comparable


METRICS = (
    Metric("output_tok_s", "throughput", True, "tok/s", required=True),
    Metric("tpot_ms_median", "TPOT", False, "ms"),
    Metric("ttft_ms_median", "TTFT", False, "ms"),
    Metric("acceptance_length", "acceptance length", True, "tok"),
)


@dataclass(frozen=True)
class MetricDelta:
    metric: Metric
    base: float
    new: float
    rel: float  # (new - base) / base
    base_spread: float  # NaN with one repeat
    new_spread: float
    sampling: float  # bootstrap half-width of rel (latency medians); NaN without requests
    noise: float  # the threshold |rel| had to exceed
    verdict: Verdict


@dataclass(frozen=True)
class RunCells:
    """One run's side of a comparison: its cell rows and, per row, the settings that must
    agree (``cell_settings``) and the per-request samples of its latency medians
    (column -> values, ``metrics.data.request_latencies_ms``; empty when not stored)."""

    rows: pd.DataFrame
    settings: list[dict[str, Any]]
    requests: list[dict[str, np.ndarray]] | None = None

    def __post_init__(self) -> None:
        if len(self.settings) != len(self.rows) or (
            self.requests is not None and len(self.requests) != len(self.rows)
        ):
            raise ValueError("RunCells: one settings (and requests) entry per row")


@dataclass(frozen=True)
class CellComparison:
    key: dict[str, Any]
    base_repeats: int
    new_repeats: int
    deltas: list[MetricDelta]
    ignored: list[str]  # settings that differ but were ignored on request

    @property
    def verdict(self) -> Verdict:
        if any(d.metric.required and d.verdict == "n/a" for d in self.deltas):
            return "not comparable"
        verdicts = {d.verdict for d in self.deltas}
        if "worse" in verdicts:
            return "worse"
        if "better" in verdicts:
            return "better"
        return "same within noise" if "same within noise" in verdicts else "n/a"


@dataclass(frozen=True)
class Mismatch:
    key: dict[str, Any]
    differences: dict[str, tuple[Any, Any]]  # setting -> (base value, new value)


@dataclass
class Comparison:
    tolerance: float
    cells: list[CellComparison] = field(default_factory=list)
    mismatched: list[Mismatch] = field(default_factory=list)
    only_base: list[dict[str, Any]] = field(default_factory=list)
    only_new: list[dict[str, Any]] = field(default_factory=list)

    def count(self, verdict: Verdict) -> int:
        return sum(c.verdict == verdict for c in self.cells)

    @property
    def exit_code(self) -> int:
        """0: nothing worse; 1: a cell worse beyond noise; 3: nothing comparable."""
        if not any(c.verdict not in ("n/a", "not comparable") for c in self.cells):
            return 3
        return 1 if self.count("worse") else 0


# ----------------------------------------------------------------------------- settings
_ASSETS = re.compile(r"[^\s\"']*/avbench/assets/")
# A derived model dir in avbench's cache (avbench/assets/derived.py): written by its recipe and
# key, so a cache elsewhere is the same model and another recipe or source is not.
_DERIVED = re.compile(r"[^\s\"']*/derived/([^/\s\"']+-[0-9a-f]{12})/")
# A folder of a repository's snapshot in a Hugging Face cache (a sub-folder drafter): written
# as repo@revision, so a cache elsewhere is the same setting and another revision is not.
_SNAPSHOT = re.compile(r"[^\s\"']*/models--([^/\s\"']+?)--([^/\s\"']+)/snapshots/([0-9a-f]+)/")
# --per-request-spec-decode-metrics only adds to the response, not to what is served.
_DROP_WITH_VALUE = {"--host", "--port", "--per-request-spec-decode-metrics"}


def server_signature(command: list[str] | None) -> list[str] | None:
    """An arm's server command without what may differ between identical runs.

    Drops the interpreter and module, --host/--port (and the per-request spec-decode metrics
    flag, which only adds to the response) with their values, writes the package's embedded
    assets as ``@assets/`` (checkouts live in different directories), a derived asset as
    ``@derived/<name>-<key>/`` and a Hugging Face snapshot folder as ``hf:org/name@revision/``
    (caches live in different directories)."""
    if not command:
        return None
    args = command[3:] if len(command) > 2 and command[1] == "-m" else list(command)
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in _DROP_WITH_VALUE:
            skip = True
            continue
        if a.split("=", 1)[0] in _DROP_WITH_VALUE:
            continue
        a = _DERIVED.sub(r"@derived/\1/", _ASSETS.sub("@assets/", a))
        out.append(_SNAPSHOT.sub(r"hf:\1/\2@\3/", a))
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


def cell_settings(row: dict[str, Any], manifest: RunManifest) -> dict[str, Any]:
    """What must agree for a cell of two runs to be compared (see the module docstring).

    ``manifest`` is the run manifest the row came from (for a merged run, its source's)."""
    arm = next((a for a in manifest.arms if a.name == row.get("arm")), None)
    settings = {c: _jsonable(row.get(c)) for c in (*SAMPLING_COLUMNS, *REQUEST_COLUMNS)}
    settings["server_command"] = server_signature(arm.command if arm else None)
    settings["server_env"] = arm.env if arm else None
    # live captures cost the server some time
    settings["capture"] = (
        arm.capture.model_dump(exclude_unset=True) if arm and arm.capture else None
    )
    settings["gpus"] = _jsonable(row.get("gpus"))
    return settings


# ----------------------------------------------------------------------------- comparison
def _spread(v: pd.Series) -> float:
    v = v.dropna()
    if len(v) < 2 or v.mean() == 0:
        return float("nan")
    return float((v.max() - v.min()) / abs(v.mean()))


def _key_of(row: Any) -> tuple[Any, ...]:
    return tuple(_norm_key(row.get(k)) for k in KEYS)


def _norm_key(v: Any) -> Any:
    v = _jsonable(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _groups(run: RunCells) -> dict[tuple[Any, ...], dict[str, Any]]:
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    requests = run.requests or [{} for _ in run.settings]
    for (_, row), s, req in zip(run.rows.iterrows(), run.settings, requests, strict=True):
        g = out.setdefault(_key_of(row), {"rows": [], "settings": s, "requests": []})
        g["rows"].append(row)
        g["requests"].append(req)
    return out


def sampling_noise(base: np.ndarray, new: np.ndarray, seed: int = 0) -> float:
    """Half-width of the 95% bootstrap interval of median(new) / median(base) - 1; NaN when
    either side has fewer than two requests."""
    if len(base) < 2 or len(new) < 2:
        return float("nan")
    rng = np.random.default_rng(seed)
    mb = np.median(rng.choice(base, (BOOTSTRAP_RESAMPLES, len(base))), axis=1)
    mn = np.median(rng.choice(new, (BOOTSTRAP_RESAMPLES, len(new))), axis=1)
    ok = mb > 0
    if not ok.any():
        return float("nan")
    lo, hi = np.percentile(mn[ok] / mb[ok] - 1.0, [2.5, 97.5])
    return float((hi - lo) / 2)


def _pooled(requests: list[dict[str, np.ndarray]], column: str) -> np.ndarray:
    parts = [r[column] for r in requests if column in r]
    return np.concatenate(parts) if parts else np.zeros(0)


def _delta(
    metric: Metric, base: dict[str, Any], new: dict[str, Any], tolerance: float
) -> MetricDelta:
    def values(g: dict[str, Any]) -> pd.Series:
        col = g["frame"].get(metric.column, pd.Series(dtype=float))
        return pd.to_numeric(col, errors="coerce")

    vb, vn = values(base), values(new)
    b, n = float(vb.mean()), float(vn.mean())
    bs, ns = _spread(vb), _spread(vn)
    sampling = sampling_noise(
        _pooled(base["requests"], metric.column), _pooled(new["requests"], metric.column)
    )
    noise = max([tolerance, *(s for s in (bs, ns, sampling) if not math.isnan(s))])
    if math.isnan(b) or math.isnan(n) or b == 0:
        return MetricDelta(metric, b, n, float("nan"), bs, ns, sampling, noise, "n/a")
    rel = (n - b) / abs(b)
    if abs(rel) <= noise:
        verdict: Verdict = "same within noise"
    else:
        verdict = "better" if (rel > 0) == metric.higher_is_better else "worse"
    return MetricDelta(metric, b, n, rel, bs, ns, sampling, noise, verdict)


def compare_cells(
    base: RunCells,
    new: RunCells,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    ignore: frozenset[str] = frozenset(),
) -> Comparison:
    """Compare two runs cell by cell (see the module docstring)."""
    gb, gn = _groups(base), _groups(new)
    result = Comparison(tolerance=tolerance)
    for key in gb.keys() - gn.keys():
        result.only_base.append(dict(zip(KEYS, key, strict=True)))
    for key in gn.keys() - gb.keys():
        result.only_new.append(dict(zip(KEYS, key, strict=True)))
    for key in [k for k in gb if k in gn]:
        kd = dict(zip(KEYS, key, strict=True))
        sb, sn = gb[key]["settings"], gn[key]["settings"]
        diffs = {
            name: (sb.get(name), sn.get(name))
            for name in sorted(sb.keys() | sn.keys())
            if sb.get(name) != sn.get(name)
        }
        blocking = {k: v for k, v in diffs.items() if k not in ignore}
        if blocking:
            result.mismatched.append(Mismatch(kd, blocking))
            continue
        for g in (gb[key], gn[key]):
            g["frame"] = pd.DataFrame(g["rows"])
        deltas = [_delta(m, gb[key], gn[key], tolerance) for m in METRICS]
        result.cells.append(
            CellComparison(kd, len(gb[key]["rows"]), len(gn[key]["rows"]), deltas, sorted(diffs))
        )
    order = {k: i for i, k in enumerate(gb)}
    result.cells.sort(key=lambda c: order[tuple(c.key[k] for k in KEYS)])
    return result


# ----------------------------------------------------------------------------- rendering
def load_label(key: dict[str, Any]) -> str:
    if key.get("rate") is not None:
        return f"r={key['rate']:g}/s"
    return f"c={key['concurrency']}"


def cell_label(key: dict[str, Any]) -> str:
    return f"{key['pair']} / {key['workload']} / {key['arm']} / {load_label(key)}"


def format_delta(d: MetricDelta) -> str:
    if d.verdict == "n/a":
        return "–"
    mark = {"better": " ▲", "worse": " ▼", "same within noise": ""}[d.verdict]
    return f"{d.rel:+.1%} (±{d.noise:.0%}){mark}"


def _short(v: Any) -> str:
    s = json.dumps(v, sort_keys=True, default=str) if not isinstance(v, str) else v
    return s if len(s) <= 80 else s[:77] + "..."


def describe_difference(base: Any, new: Any) -> str:
    """A setting's change, short: for argument lists only what was added and removed."""
    if isinstance(base, list) and isinstance(new, list):
        a, b = [str(x) for x in base], [str(x) for x in new]
        parts = []
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b).get_opcodes():
            if op in ("delete", "replace"):
                parts.append("- " + " ".join(a[i1:i2]))
            if op in ("insert", "replace"):
                parts.append("+ " + " ".join(b[j1:j2]))
        return "; ".join(_short(p) for p in parts) or "same"
    return f"{_short(base)} → {_short(new)}"


def to_markdown(cmp: Comparison, base_name: str, new_name: str) -> str:
    worse, better, same = cmp.count("worse"), cmp.count("better"), cmp.count("same within noise")
    unknown = cmp.count("not comparable")
    head = "REGRESSION" if worse else ("nothing comparable" if cmp.exit_code == 3 else "OK")
    lines = [
        f"## avbench compare: {head}",
        "",
        f"Baseline `{base_name}` → new `{new_name}`: {len(cmp.cells)} cells compared, "
        f"**{worse} worse**, {better} better, {same} same within noise"
        + (f", {unknown} not comparable (no throughput measured)" if unknown else "")
        + "; noise floor "
        f"{cmp.tolerance:.0%} (or the repeats' spread, or a latency median's sampling noise, "
        "when larger).",
        "",
    ]
    if cmp.cells:
        lines += [
            "| cell | verdict | " + " | ".join(m.label for m in METRICS) + " |",
            "|---|---|" + "---|" * len(METRICS),
        ]
        for c in cmp.cells:
            lines.append(
                f"| {cell_label(c.key)} | {c.verdict} | "
                + " | ".join(format_delta(d) for d in c.deltas)
                + " |"
            )
        lines.append("")
        lines.append(
            "Deltas are (new − baseline) / baseline of the mean over repeats; ± is the noise "
            "the difference had to exceed."
        )
        lines.append("")
    if cmp.mismatched:
        lines += [f"### {len(cmp.mismatched)} cells not compared: settings differ", ""]
        for m in cmp.mismatched:
            diffs = "; ".join(
                f"`{k}`: {describe_difference(a, b)}" for k, (a, b) in m.differences.items()
            )
            lines.append(f"- {cell_label(m.key)}: {diffs}")
        lines.append("")
    for title, keys in (
        ("only in the baseline", cmp.only_base),
        ("only in the new run", cmp.only_new),
    ):
        if keys:
            lines += [f"### {len(keys)} cells {title}", ""]
            lines += [f"- {cell_label(k)}" for k in keys]
            lines.append("")
    return "\n".join(lines)
