"""Throughput and request-count metrics of one cell (docs/measurement.md).

``window_s`` is the measured window the caller timed (warmup excluded). Output tokens are the
completion tokens (from usage) of the *successful* measured requests; tokens that failed or
cut-off requests streamed are reported separately (``output_tokens_failed``) and are not
credited, so an arm cannot look faster by failing. Per-GPU figures divide by the GPUs one
server uses (TP × PP × DP), passed in as ``gpus``.

The ``server_*`` columns are the same quantities as vLLM's own counters saw them over the
window (Δ of ``generation_tokens``, ``prompt_tokens``, ``request_success``): a cross-check
of the client's numbers, not a replacement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from avbench.metrics.base import NoValue, metric, need, ratio
from avbench.metrics.data import CellData


def _window(data: CellData) -> float:
    if not data.window_s > 0:
        raise NoValue("measured window is empty")
    return data.window_s


@metric("requests_ok", unit="requests", definition="successful measured requests.")
def requests_ok(data: CellData, deps: Mapping[str, Any]) -> int:
    return data.requests_ok


@metric(
    "requests_failed",
    unit="requests",
    definition="measured requests that failed or were cut off (any error kind).",
)
def requests_failed(data: CellData, deps: Mapping[str, Any]) -> int:
    return data.requests_failed


@metric(
    "requests_warmup_excluded",
    unit="requests",
    definition="warmup requests dropped before computing any metric.",
)
def requests_warmup(data: CellData, deps: Mapping[str, Any]) -> int:
    return data.requests_warmup


@metric(
    "errors",
    unit="requests",
    kind="indexed",
    inputs=("error_counts",),
    definition="failed measured requests of this error kind.",
)
def errors(data: CellData, deps: Mapping[str, Any]) -> dict[str, int]:
    return dict(data.error_counts)


@metric(
    "output_tokens",
    unit="tokens",
    inputs=("output_tokens",),
    definition="completion tokens of successful measured requests (usage; streamed token "
    "count where usage is missing).",
)
def output_tokens(data: CellData, deps: Mapping[str, Any]) -> int:
    return int(data.output_tokens.sum())


@metric(
    "output_tokens_failed",
    unit="tokens",
    inputs=("failed_output_tokens",),
    definition="tokens streamed to measured requests that then failed (not in throughput).",
)
def output_tokens_failed(data: CellData, deps: Mapping[str, Any]) -> int:
    return data.failed_output_tokens


@metric(
    "output_tok_s",
    unit="tok/s",
    inputs=("output_tokens", "window_s"),
    requires=("output_tokens",),
    definition="output throughput: output tokens of successful measured requests / "
    "measured window.",
)
def output_tok_s(data: CellData, deps: Mapping[str, Any]) -> float:
    return deps["output_tokens"] / _window(data)


@metric(
    "output_tok_s_per_gpu",
    unit="tok/s/GPU",
    inputs=("gpus",),
    requires=("output_tok_s",),
    definition="output throughput per GPU: output_tok_s / (TP x PP x DP).",
)
def output_tok_s_per_gpu(data: CellData, deps: Mapping[str, Any]) -> float:
    return deps["output_tok_s"] / data.gpus


@metric(
    "total_tok_s",
    unit="tok/s",
    inputs=("prompt_tokens", "output_tokens", "window_s"),
    requires=("output_tokens",),
    definition="total token throughput: (prompt + output tokens of successful measured "
    "requests) / measured window.",
)
def total_tok_s(data: CellData, deps: Mapping[str, Any]) -> float:
    if data.prompt_tokens is None:
        raise NoValue("a successful request has no prompt token usage")
    prompt = data.prompt_tokens
    return (float(prompt.sum()) + deps["output_tokens"]) / _window(data)


@metric(
    "total_tok_s_per_gpu",
    unit="tok/s/GPU",
    inputs=("gpus",),
    requires=("total_tok_s",),
    definition="total token throughput per GPU: total_tok_s / (TP x PP x DP).",
)
def total_tok_s_per_gpu(data: CellData, deps: Mapping[str, Any]) -> float:
    return deps["total_tok_s"] / data.gpus


@metric(
    "request_s",
    unit="req/s",
    inputs=("requests_ok", "window_s"),
    definition="request throughput: successful measured requests / measured window.",
)
def request_s(data: CellData, deps: Mapping[str, Any]) -> float:
    return data.requests_ok / _window(data)


def _counter(data: CellData, name: str) -> float:
    counters = need(data.counters, "/metrics scrapes")
    return need(getattr(counters, name), f"vllm:{name} counter")


@metric(
    "server_generation_tokens",
    unit="tokens",
    inputs=("counters",),
    definition="Δ vllm:generation_tokens over the window (server-side, all requests it ran).",
)
def server_generation_tokens(data: CellData, deps: Mapping[str, Any]) -> float:
    return _counter(data, "generation_tokens")


@metric(
    "server_prompt_tokens",
    unit="tokens",
    inputs=("counters",),
    definition="Δ vllm:prompt_tokens over the window (server-side prefill tokens).",
)
def server_prompt_tokens(data: CellData, deps: Mapping[str, Any]) -> float:
    return _counter(data, "prompt_tokens")


@metric(
    "prefix_cache_hit_share",
    unit="fraction",
    inputs=("counters",),
    definition="Δ vllm:prefix_cache_hits / Δ vllm:prefix_cache_queries over the window: the "
    "share of the prompt tokens the server found in its prefix cache. Cells of one workload send "
    "the same prompts, so a cell served after another on the same server starts warm (lower "
    "TTFT, higher tok/s) where a cell measured alone does not.",
)
def prefix_cache_hit_share(data: CellData, deps: Mapping[str, Any]) -> float:
    counters = need(data.counters, "/metrics scrapes")
    return ratio(counters.prefix_cache_hits, counters.prefix_cache_queries, "prefix cache")


@metric(
    "server_request_success",
    unit="requests",
    inputs=("counters",),
    definition="Δ vllm:request_success over the window, summed over finished_reason.",
)
def server_request_success(data: CellData, deps: Mapping[str, Any]) -> float:
    return _counter(data, "request_success")
