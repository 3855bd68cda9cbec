"""vLLM's Prometheus counters: parse a `/metrics` scrape and take before→after deltas.

Parsing uses ``prometheus_client``'s text parser. It names a counter family without its
``_total`` suffix but keeps the suffix on each sample, and reports ``*_created`` samples as
separate gauge families; we therefore match on *sample* names (``<base>_total``), which works
whether or not the scrape carries ``# TYPE`` lines.

Every counter is summed over all label sets except ``position`` (engines under data
parallelism, ``finished_reason`` for request counts, ...), optionally restricted to one
``model_name``. A counter that the server does not export (a baseline arm runs without
speculation, so it has no ``spec_decode`` counters) is ``None``, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from avbench.metrics.base import MetricsError

# Field of SpecDecodeCounters -> counter base name (without the `_total` suffix).
COUNTER_NAMES: dict[str, str] = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "prompt_tokens": "vllm:prompt_tokens",
    "request_success": "vllm:request_success",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
}
PER_POSITION_NAME = "vllm:spec_decode_num_accepted_tokens_per_pos"
_SCALAR_FIELDS = tuple(COUNTER_NAMES)
_BASE_TO_FIELD = {base: name for name, base in COUNTER_NAMES.items()}


class CounterReset(MetricsError):
    """A counter went backwards between two scrapes (the server restarted mid-window)."""


@dataclass(frozen=True)
class SpecDecodeCounters:
    """Cumulative (or, after :func:`delta`, windowed) vLLM counters.

    ``None`` means the server does not export that counter; ``accepted_per_pos`` is empty then.
    """

    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    request_success: float | None = None  # summed over finished_reason
    request_success_by_reason: dict[str, float] = field(default_factory=dict)
    prefix_cache_queries: float | None = None  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: float | None = None  # of those, found cached

    @property
    def has_spec_decode(self) -> bool:
        return self.drafts is not None


def parse_counters(
    text: str, *, model_name: str | None = None, source: str = "/metrics text"
) -> SpecDecodeCounters:
    """Sum vLLM's speculative-decoding and token counters found in a Prometheus text scrape.

    ``model_name`` keeps only samples with that ``model_name`` label (None: every model).
    ``source`` names the scrape in error messages (a file path or URL).
    """
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, IndexError, TypeError) as exc:
        raise MetricsError(f"{source}: not valid Prometheus text format ({exc})") from exc

    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    by_reason: dict[str, float] = {}
    models_seen: set[str] = set()
    for family in families:
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue  # *_created gauges, histogram parts, plain gauges
            base = sample.name[: -len("_total")]
            if base != PER_POSITION_NAME and base not in _BASE_TO_FIELD:
                continue
            sample_model = sample.labels.get("model_name")
            if sample_model is not None:
                models_seen.add(sample_model)
            if model_name is not None and sample_model != model_name:
                continue
            if base == PER_POSITION_NAME:
                try:
                    pos = int(sample.labels["position"])
                except (KeyError, ValueError) as exc:
                    raise MetricsError(
                        f"{source}: {sample.name} sample without an integer 'position' label "
                        f"(labels {sample.labels})"
                    ) from exc
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
                continue
            name = _BASE_TO_FIELD[base]
            sums[name] = sums.get(name, 0.0) + sample.value
            if name == "request_success":
                reason = sample.labels.get("finished_reason", "")
                by_reason[reason] = by_reason.get(reason, 0.0) + sample.value

    if model_name is not None and not sums and not per_pos and models_seen:
        # A wrong served-model name would otherwise silently look like "no speculation".
        raise MetricsError(
            f"{source}: no vLLM counters for model_name {model_name!r} "
            f"(found: {', '.join(sorted(models_seen))})"
        )
    return SpecDecodeCounters(
        **{name: sums.get(name) for name in _SCALAR_FIELDS},
        accepted_per_pos=dict(sorted(per_pos.items())),
        request_success_by_reason=by_reason,
    )


def _sub(name: str, before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    return _increase(name, before, after)


def _increase(name: str, before: float, after: float) -> float:
    diff = after - before
    if diff < 0:
        raise CounterReset(
            f"vLLM counter {name} went backwards ({before:g} -> {after:g}): "
            "the server restarted inside the measured window"
        )
    return diff


def delta(before: SpecDecodeCounters, after: SpecDecodeCounters) -> SpecDecodeCounters:
    """Counters accumulated between two scrapes (``after - before``).

    A field absent from either scrape is ``None``. A label (position, finished_reason) seen only
    in ``after`` counts from 0: vLLM may create labelled children on first use.
    Raises :class:`CounterReset` if any counter decreased.
    """
    scalars = {
        name: _sub(COUNTER_NAMES[name], getattr(before, name), getattr(after, name))
        for name in _SCALAR_FIELDS
    }
    per_pos: dict[int, float] = {}
    if before.has_spec_decode and after.has_spec_decode:
        for pos, value in after.accepted_per_pos.items():
            per_pos[pos] = _increase(
                f"{PER_POSITION_NAME}{{position={pos}}}",
                before.accepted_per_pos.get(pos, 0.0),
                value,
            )
    by_reason: dict[str, float] = {}
    if before.request_success is not None and after.request_success is not None:
        for reason, value in after.request_success_by_reason.items():
            by_reason[reason] = _increase(
                f"{COUNTER_NAMES['request_success']}{{finished_reason={reason}}}",
                before.request_success_by_reason.get(reason, 0.0),
                value,
            )
    return SpecDecodeCounters(
        **scalars, accepted_per_pos=per_pos, request_success_by_reason=by_reason
    )


def window_counters(
    before_text: str | None,
    after_text: str | None,
    *,
    model_name: str | None = None,
) -> SpecDecodeCounters | None:
    """Parse both scrapes and return their delta; None when either scrape is missing."""
    if before_text is None or after_text is None:
        return None
    before = parse_counters(before_text, model_name=model_name, source="/metrics before window")
    after = parse_counters(after_text, model_name=model_name, source="/metrics after window")
    return delta(before, after)
