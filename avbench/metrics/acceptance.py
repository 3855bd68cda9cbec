"""Acceptance metrics of one cell (docs/measurement.md).

From vLLM's ``/metrics`` counters, as deltas over the measured window, summed over engines:

- acceptance rate = Δaccepted / Δdraft_tokens;
- acceptance length = 1 + Δaccepted / Δdrafts (tokens emitted per verification step that had
  drafts: the accepted drafts plus the one token the target always contributes);
- per-position rate i = Δaccepted_pos[i] / Δdrafts, *unconditional* (not divided by the drafts
  that reached position i). vLLM does not count draft tokens per position, so under Adaptive
  Verification a trimmed slot and a rejected one both count as "not accepted" here.

From the stream itself (docs/measurement.md, per-request acceptance): each SSE chunk of a request carries the tokens
of one engine step, so tokens per chunk ≈ accepted drafts + 1 for that step. The first chunk is
the prefill step and is left out. This gives a per-request distribution the counters cannot.
Known biases, which is why it is reported beside the counter value rather than instead of it:
the server may coalesce several steps into one chunk under load (ratio > 1); a request's last
step is cut short by ``max_tokens`` or a stop string (ratio < 1); decode steps without drafts
count in the chunks but not in Δdrafts.

From the server per request (vLLM's ``--per-request-spec-decode-metrics detailed``, which
avbench turns on for speculative arms): each response's final usage chunk carries its accepted
and proposed drafts per verify step. Summed over a cell's successful requests they must equal
the counter deltas exactly when every measured request succeeded (the counters also count
what a failed request verified); ``req_spec_vs_counter_accepted`` shows it per cell.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from avbench.metrics.base import NoValue, metric, need, ratio
from avbench.metrics.data import CellData
from avbench.metrics.prometheus import SpecDecodeCounters


def _spec(data: CellData) -> SpecDecodeCounters:
    counters = need(data.counters, "/metrics scrapes")
    if not counters.has_spec_decode:
        raise NoValue("server exports no spec_decode counters (no speculation)")
    return counters


@metric(
    "num_drafts",
    unit="drafts",
    inputs=("counters",),
    definition="Δ vllm:spec_decode_num_drafts over the window (verification steps with "
    "drafts, summed over requests and engines).",
)
def num_drafts(data: CellData, deps: Mapping[str, Any]) -> float:
    return need(_spec(data).drafts, "drafts counter")


@metric(
    "num_draft_tokens",
    unit="tokens",
    inputs=("counters",),
    definition="Δ vllm:spec_decode_num_draft_tokens over the window: draft tokens scheduled "
    "for verification (under AV, before AV trims them).",
)
def num_draft_tokens(data: CellData, deps: Mapping[str, Any]) -> float:
    return need(_spec(data).draft_tokens, "draft tokens counter")


@metric(
    "num_accepted",
    unit="tokens",
    inputs=("counters",),
    definition="Δ vllm:spec_decode_num_accepted_tokens over the window.",
)
def num_accepted(data: CellData, deps: Mapping[str, Any]) -> float:
    return need(_spec(data).accepted, "accepted tokens counter")


@metric(
    "acceptance_rate",
    unit="ratio",
    inputs=("counters",),
    requires=("num_accepted", "num_draft_tokens"),
    definition="acceptance rate: Δaccepted / Δdraft_tokens over the window, a fraction in "
    "[0, 1] (vLLM's benchmark client prints the same ratio in percent). Per verified draft on "
    "arms without AV; under AV per scheduled draft, trimmed drafts counting as not accepted "
    "(acceptance_rate_per says which; verified_acceptance_rate is AV's per verified draft).",
)
def acceptance_rate(data: CellData, deps: Mapping[str, Any]) -> float:
    return ratio(deps["num_accepted"], deps["num_draft_tokens"], "acceptance rate")


@metric(
    "acceptance_length",
    unit="tokens/step",
    inputs=("counters",),
    requires=("num_accepted", "num_drafts"),
    definition="acceptance length: 1 + Δaccepted / Δdrafts over the window.",
)
def acceptance_length(data: CellData, deps: Mapping[str, Any]) -> float:
    return 1.0 + ratio(deps["num_accepted"], deps["num_drafts"], "acceptance length")


@metric(
    "accept_pos",
    unit="ratio",
    kind="indexed",
    inputs=("counters",),
    requires=("num_drafts",),
    definition="unconditional acceptance at draft position i: Δaccepted_pos[i] / Δdrafts "
    "(under AV, trimmed and rejected drafts both count as not accepted).",
)
def accept_pos(data: CellData, deps: Mapping[str, Any]) -> dict[int, float]:
    per_pos = _spec(data).accepted_per_pos
    if not per_pos:
        raise NoValue("no per-position counters")
    return {pos: ratio(n, deps["num_drafts"], f"position {pos}") for pos, n in per_pos.items()}


@metric(
    "chunk_tokens_mean",
    unit="tokens/chunk",
    inputs=("gap_tokens",),
    definition="mean tokens per token-bearing chunk, first (prefill) chunk of each request "
    "excluded, pooled over successful requests: a stream-side estimate of acceptance length.",
)
def chunk_tokens_mean(data: CellData, deps: Mapping[str, Any]) -> float:
    return float(np.mean(need(data.gap_tokens, "chunks after the first")))


@metric(
    "req_accept_length",
    unit="tokens/chunk",
    kind="distribution",
    inputs=("request_tokens_per_step",),
    definition="per-request acceptance length estimated from the stream: a request's mean "
    "tokens per chunk over chunks after the first, one sample per successful request.",
)
def req_accept_length(data: CellData, deps: Mapping[str, Any]) -> np.ndarray:
    return need(data.request_tokens_per_step, "requests with two or more chunks")


@metric(
    "chunk_vs_counter_accept_length",
    unit="ratio",
    requires=("chunk_tokens_mean", "acceptance_length"),
    definition="chunk_tokens_mean / acceptance_length: 1 when each chunk is one engine step; "
    "above 1 when the server coalesces steps into one chunk.",
)
def chunk_vs_counter(data: CellData, deps: Mapping[str, Any]) -> float:
    return ratio(deps["chunk_tokens_mean"], deps["acceptance_length"], "chunk/counter ratio")


@metric(
    "req_spec",
    unit="count",
    kind="indexed",
    inputs=("request_spec",),
    definition="summed over successful requests, from each response's per-request "
    "spec-decode metrics: steps (verify steps; = num_drafts when every measured request "
    "succeeded), accepted (per_step_accepted; = num_accepted), draft_tokens (per_step_drafted; "
    "= num_draft_tokens).",
)
def req_spec(data: CellData, deps: Mapping[str, Any]) -> dict[str, float]:
    spec = need(data.request_spec, "per-request spec-decode metrics (server flag off?)")
    totals = spec.sum(axis=0)
    return {
        "steps": float(totals[0]),
        "accepted": float(totals[1]),
        "draft_tokens": float(totals[2]),
    }


@metric(
    "req_spec_accept_length",
    unit="tokens/step",
    requires=("req_spec",),
    definition="1 + req_spec_accepted / req_spec_steps: acceptance length from the server's "
    "per-request metrics.",
)
def req_spec_accept_length(data: CellData, deps: Mapping[str, Any]) -> float:
    spec = deps["req_spec"]
    return 1.0 + ratio(spec["accepted"], spec["steps"], "per-request steps")


@metric(
    "req_spec_vs_counter_accepted",
    unit="ratio",
    requires=("req_spec", "num_accepted"),
    definition="req_spec_accepted / num_accepted: 1 when the per-request metrics account for "
    "every accepted draft the counters saw.",
)
def req_spec_vs_counter(data: CellData, deps: Mapping[str, Any]) -> float:
    accepted = deps["req_spec"]["accepted"]
    return ratio(accepted, deps["num_accepted"], "per-request/counter ratio")


@metric(
    "chunk_vs_req_spec_accept_length",
    unit="ratio",
    requires=("chunk_tokens_mean", "req_spec_accept_length"),
    definition="chunk_tokens_mean / req_spec_accept_length: the chunk-size proxy against the "
    "server's own per-request count (1 when each chunk is one step).",
)
def chunk_vs_req_spec(data: CellData, deps: Mapping[str, Any]) -> float:
    return ratio(deps["chunk_tokens_mean"], deps["req_spec_accept_length"], "chunk/request ratio")
