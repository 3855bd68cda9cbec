"""Latency metrics of one cell (docs/measurement.md), all in milliseconds, successful requests only.

Notation for one request: chunks j = 0..n-1 are the SSE chunks that carried output tokens
(content, or reasoning content for reasoning models), arriving t_j seconds after the request
was sent and carrying k_j tokens. Chunk 0 holds the prefill step's token(s).

- TTFT = time to the first content token (the record's ``ttft``).
- E2E = send to the last byte of the response.
- TPOT = (E2E − TTFT) / (N − 1), N = completion tokens from usage (Σ k_j if usage is missing);
  requests with N ≤ 1 have no TPOT.
- Inter-chunk latency: every gap g_j = t_j − t_{j−1} for j ≥ 1, each gap one sample, pooled
  over all requests. Under speculative decoding one chunk carries every token accepted in one
  engine step, so this is the *step* latency seen by a user.
- Token-normalised ITL: gap g_j is spread evenly over the k_j tokens chunk j carried: each of
  those tokens gets the value g_j / k_j, and the distribution is over all such tokens of all
  requests (one sample per output token after chunk 0; chunks with k_j = 0 contribute nothing).
  Its mean is therefore Σ_r (t_{n−1} − t_0) / Σ_r Σ_{j≥1} k_j. Unlike TPOT it leaves out the
  tokens of chunk 0 and the tail after the last token (usage chunk, ``[DONE]``).
- Queue delay: client-side wait between the scheduler releasing a request and the request
  being written to the connection (every measured request, failed ones included).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from avbench.metrics.base import NoValue, Summary, metric, need
from avbench.metrics.data import CellData

MS = 1e3


@metric(
    "ttft_ms",
    unit="ms",
    kind="distribution",
    inputs=("ttft_s",),
    definition="time to first token: request written to an open connection -> first output "
    "token received (successful requests). Excludes client-side queueing and connection "
    "set-up (see queue_delay_ms; ttft_from_queue_ms includes them, as other clients do).",
)
def ttft_ms(data: CellData, deps: Mapping[str, Any]) -> np.ndarray:
    return need(data.ttft_s, "TTFT samples") * MS


@metric(
    "ttft_from_queue_ms",
    unit="ms",
    kind="distribution",
    inputs=("ttft_from_queue_s",),
    definition="time to first token as vLLM's benchmark client, guidellm and AIPerf count it: "
    "the client released the request -> first output token, i.e. client-side queue delay and "
    "connection set-up included (successful requests).",
)
def ttft_from_queue_ms(data: CellData, deps: Mapping[str, Any]) -> np.ndarray:
    return need(data.ttft_from_queue_s, "TTFT samples") * MS


@metric(
    "e2e_ms",
    unit="ms",
    kind="distribution",
    inputs=("e2e_s",),
    definition="end-to-end latency: request sent -> last byte of the response "
    "(successful requests).",
)
def e2e_ms(data: CellData, deps: Mapping[str, Any]) -> np.ndarray:
    return need(data.e2e_s, "E2E samples") * MS


@metric(
    "tpot_ms",
    unit="ms",
    kind="distribution",
    inputs=("tpot_s",),
    definition="time per output token: (E2E - TTFT) / (completion tokens - 1), one sample "
    "per successful request with more than one token.",
)
def tpot_ms(data: CellData, deps: Mapping[str, Any]) -> np.ndarray:
    return need(data.tpot_s, "TPOT samples") * MS


@metric(
    "itl_ms",
    unit="ms",
    kind="distribution",
    inputs=("gap_s", "gap_tokens"),
    definition="token-normalised inter-token latency: each gap between consecutive "
    "token-bearing chunks divided by the tokens the later chunk carried, one sample per "
    "token (first chunk excluded), pooled over successful requests. vLLM's benchmark client "
    "calls the raw per-chunk gap ITL: that is chunk_latency_ms here.",
)
def itl_ms(data: CellData, deps: Mapping[str, Any]) -> np.ndarray:
    gaps = need(data.gap_s, "inter-chunk gaps")
    tokens = data.gap_tokens
    counts = np.maximum(tokens, 0).astype(np.int64)
    per_token = np.divide(gaps, tokens, out=np.zeros_like(gaps), where=tokens > 0)
    return need(np.repeat(per_token, counts), "tokens after the first chunk") * MS


@metric(
    "chunk_latency_ms",
    unit="ms",
    kind="distribution",
    inputs=("gap_s",),
    definition="inter-chunk latency: raw gap between consecutive token-bearing chunks of a "
    "request (= engine step latency under speculative decoding), one sample per gap, pooled "
    "over successful requests.",
)
def chunk_latency_ms(data: CellData, deps: Mapping[str, Any]) -> np.ndarray:
    return need(data.gap_s, "inter-chunk gaps") * MS


@metric(
    "queue_delay_ms",
    unit="ms",
    kind="distribution",
    inputs=("queue_delay_s",),
    definition="client-side queue delay: scheduler released the request -> request written "
    "to the connection (every measured request).",
)
def queue_delay_ms(data: CellData, deps: Mapping[str, Any]) -> np.ndarray:
    return need(data.queue_delay_s, "queue delays") * MS


@metric(
    "interactivity_tok_s_user",
    unit="tok/s/user",
    inputs=("tpot_s",),
    requires=("tpot_ms",),
    definition="interactivity: 1000 / median TPOT in ms (output tokens per second seen by one "
    "user).",
)
def interactivity(data: CellData, deps: Mapping[str, Any]) -> float:
    tpot: Summary = deps["tpot_ms"]
    if tpot.median <= 0:
        raise NoValue("median TPOT is not positive")
    return 1000.0 / tpot.median


BURST_S = 1e-3


@metric(
    "stream_burst_frac",
    unit="fraction",
    inputs=("stream_span_s",),
    definition="data quality: share of successful requests with >= 3 token chunks whose chunks "
    f"all arrived within {BURST_S * MS:g} ms of each other, i.e. the server delivered the stream "
    "in one burst. Above 0, TTFT, TPOT, ITL and per-request acceptance of those requests "
    "describe the delivery, not the generation (seen with vLLM's CPU build on 2 cores).",
)
def stream_burst_frac(data: CellData, deps: Mapping[str, Any]) -> float:
    spans = need(data.stream_span_s, "requests with >= 3 token chunks")
    return float(np.mean(spans < BURST_S))
