"""One cell's records turned into flat numpy arrays, once, for every metric to read.

Which requests count where (decided here, once):

- warmup records are dropped before anything else;
- latency distributions (TTFT, E2E, TPOT, ITL, inter-chunk) and throughput use *successful*
  requests only, as vLLM's own benchmark does: a cut-off stream has no meaningful E2E and
  would reward an arm for failing fast;
- tokens that failed requests did stream are kept apart (``failed_output_tokens``) so that
  they are visible but not credited as throughput;
- queue delay uses every measured request: it describes the client, not the answer.

Per-chunk work is vectorised: the chunk lists of all requests are concatenated into one array
with a request index, and gaps/first-chunk masks are computed with numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from avbench.loadgen.records import ERROR_KINDS, RequestRecord
from avbench.metrics.base import MetricsError
from avbench.metrics.prometheus import SpecDecodeCounters

# Always reported, 0 when none happened, so every cell has the same columns. The drive's own
# stops (stalled, deadline) fail the whole cell instead, so they never reach a row.
KNOWN_ERROR_KINDS: tuple[str, ...] = tuple(
    k for k in ERROR_KINDS if k not in ("stalled", "deadline")
)


def _empty() -> np.ndarray:
    return np.zeros(0)


@dataclass(frozen=True)
class CellData:
    window_s: float
    gpus: int
    requests_ok: int = 0
    requests_failed: int = 0
    requests_warmup: int = 0
    error_counts: dict[str, int] = field(default_factory=dict)
    # Per successful request (seconds / tokens).
    ttft_s: np.ndarray = field(default_factory=_empty)  # requests that got a first token
    e2e_s: np.ndarray = field(default_factory=_empty)
    tpot_s: np.ndarray = field(default_factory=_empty)  # requests with more than one token
    output_tokens: np.ndarray = field(default_factory=_empty)
    prompt_tokens: np.ndarray | None = None  # None when a successful request lacks usage
    failed_output_tokens: int = 0
    # Pooled over the token-bearing chunks of successful requests, first chunk excluded.
    gap_s: np.ndarray = field(default_factory=_empty)  # t_j - t_{j-1}
    gap_tokens: np.ndarray = field(default_factory=_empty)  # tokens carried by chunk j
    # Per successful request with at least two chunks: mean tokens over chunks 1..n-1.
    request_tokens_per_step: np.ndarray = field(default_factory=_empty)
    queue_delay_s: np.ndarray = field(default_factory=_empty)  # every measured request
    # Per successful request with a first token: client queue + connect + TTFT.
    ttft_from_queue_s: np.ndarray = field(default_factory=_empty)
    # Per successful request with >= 3 token chunks: last minus first chunk arrival (s).
    stream_span_s: np.ndarray = field(default_factory=_empty)
    counters: SpecDecodeCounters | None = None  # /metrics delta over the window
    # Per successful request that carried vLLM's per-request spec-decode metrics: verify
    # steps, accepted drafts, proposed drafts (columns); None when no request carried them.
    request_spec: np.ndarray | None = None

    @classmethod
    def from_records(
        cls,
        records: Sequence[RequestRecord],
        *,
        window_s: float,
        gpus: int,
        counters: SpecDecodeCounters | None = None,
    ) -> CellData:
        if gpus < 1:
            raise MetricsError(f"gpus must be >= 1 (got {gpus})")
        measured = [r for r in records if not r.warmup]
        ok = [r for r in measured if r.ok]
        failed = [r for r in measured if not r.ok]
        for r in measured:
            if len(r.chunk_times) != len(r.chunk_tokens):
                raise MetricsError(
                    f"record {r.conversation_id} turn {r.turn}: chunk_times has "
                    f"{len(r.chunk_times)} entries but chunk_tokens has {len(r.chunk_tokens)}"
                )

        errors = dict.fromkeys(KNOWN_ERROR_KINDS, 0)
        for r in failed:
            kind = r.error_kind or "unknown"
            errors[kind] = errors.get(kind, 0) + 1

        out_tokens = np.array([output_token_count(r) for r in ok], dtype=float)
        prompt = None
        if all(r.prompt_tokens is not None for r in ok):
            prompt = np.array([r.prompt_tokens for r in ok], dtype=float)

        ttft = np.array([np.nan if r.ttft is None else r.ttft for r in ok], dtype=float)
        queued = np.array([r.queue_delay for r in ok], dtype=float) + ttft
        e2e = np.array([np.nan if r.e2e is None else r.e2e for r in ok], dtype=float)
        tpot = tpot_seconds(e2e, ttft, out_tokens)
        tpot = tpot[np.isfinite(tpot)]

        gap_s, gap_tokens, per_request = _chunk_arrays(ok)

        return cls(
            window_s=float(window_s),
            gpus=int(gpus),
            requests_ok=len(ok),
            requests_failed=len(failed),
            requests_warmup=len(records) - len(measured),
            error_counts=errors,
            ttft_s=ttft[np.isfinite(ttft)],
            ttft_from_queue_s=queued[np.isfinite(queued)],
            e2e_s=e2e[np.isfinite(e2e)],
            tpot_s=tpot,
            output_tokens=out_tokens,
            prompt_tokens=prompt,
            failed_output_tokens=int(sum(sum(r.chunk_tokens) for r in failed)),
            gap_s=gap_s,
            gap_tokens=gap_tokens,
            request_tokens_per_step=per_request,
            queue_delay_s=np.array([r.queue_delay for r in measured], dtype=float),
            stream_span_s=np.array(
                [r.chunk_times[-1] - r.chunk_times[0] for r in ok if len(r.chunk_times) >= 3],
                dtype=float,
            ),
            counters=counters,
            request_spec=_request_spec(ok),
        )


def _request_spec(ok: Sequence[RequestRecord]) -> np.ndarray | None:
    """(steps, accepted, drafted) per request from its final usage chunk's metrics."""
    rows = [
        (
            sum(r.spec_acceptance_histogram),
            sum(j * n for j, n in enumerate(r.spec_acceptance_histogram)),
            sum(r.spec_per_step_drafted),
        )
        for r in ok
        if r.spec_acceptance_histogram
    ]
    return np.array(rows, dtype=float) if rows else None


def output_token_count(r: RequestRecord) -> int:
    """A request's output tokens: the server's usage, else the tokens its chunks carried."""
    return r.completion_tokens if r.completion_tokens is not None else sum(r.chunk_tokens)


def tpot_seconds(e2e: np.ndarray, ttft: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """TPOT = (E2E - TTFT) / (tokens - 1); NaN where a request has one token or no times."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tokens > 1, (e2e - ttft) / (tokens - 1.0), np.nan)


def _chunk_arrays(ok: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gaps and token counts of every non-first chunk, and each request's mean tokens/step."""
    lengths = np.array([len(r.chunk_times) for r in ok], dtype=np.int64)
    total = int(lengths.sum()) if lengths.size else 0
    if total == 0:
        return _empty(), _empty(), _empty()
    times = np.fromiter(chain.from_iterable(r.chunk_times for r in ok), float, total)
    tokens = np.fromiter(chain.from_iterable(r.chunk_tokens for r in ok), float, total)
    request = np.repeat(np.arange(lengths.size), lengths)
    later = np.ones(total, dtype=bool)
    later[(np.cumsum(lengths) - lengths)[lengths > 0]] = False  # first chunk of each request
    gaps = np.diff(times, prepend=0.0)[later]
    step_tokens = tokens[later]
    sums = np.bincount(request[later], weights=step_tokens, minlength=lengths.size)
    counts = np.bincount(request[later], minlength=lengths.size)
    has_steps = counts > 0
    return gaps, step_tokens, sums[has_steps] / counts[has_steps]


def request_latencies_ms(records: Sequence[RequestRecord]) -> dict[str, np.ndarray]:
    """Per successful measured request, in ms, keyed by the cell column that is their median:
    the samples behind ``ttft_ms_median`` and ``tpot_ms_median``."""
    data = CellData.from_records(records, window_s=1.0, gpus=1)
    return {"ttft_ms_median": data.ttft_s * 1000.0, "tpot_ms_median": data.tpot_s * 1000.0}
