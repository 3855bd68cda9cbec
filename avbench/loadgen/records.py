"""Per-request records: what the load driver measured for one request (one turn).

All times are seconds from ``time.perf_counter()`` (monotonic). ``chunk_times`` are offsets
from ``sent_at`` taken at arrival, before parsing. The record is the only thing metrics read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Why a request failed (``RequestRecord.error_kind``): every kind the load driver records, with
# its definition (the metrics page lists them; each cell counts them as errors_<kind>).
ERROR_KINDS: dict[str, str] = {
    "http_4xx": "the server answered with an HTTP 4xx status (the request was refused).",
    "http_5xx": "the server answered with an HTTP 5xx status before streaming.",
    "server_error": "the server sent an error object after its 200 (in the stream, or as the "
    "body), or a finish_reason 'error': generation failed after it began, as when vLLM's "
    "engine dies behind its API server.",
    "incomplete": "the stream reached [DONE] without any finish_reason: the server ended the "
    "response without saying why it stopped generating.",
    "timeout": "no byte for read_s, or the whole request past request_s.",
    "stream_cut": "the connection ended before [DONE] and before any finish_reason.",
    "malformed": "bytes that are not valid HTTP framing or an SSE event that is not valid JSON.",
    "connect": "no connection could be made (refused, or no pool slot in time).",
    "stalled": "ended by the drive: no in-flight request made progress for stall_s.",
    "deadline": "ended by the drive: the cell ran past cell_s.",
}


@dataclass
class RequestRecord:
    conversation_id: str
    turn: int  # 0-based turn index within the conversation
    warmup: bool = False
    queued_at: float = 0.0  # when the scheduler released it (client-side queue start)
    sent_at: float = 0.0  # when the request was actually written to the connection
    ttft: float | None = None  # sent -> first content token (s)
    e2e: float | None = None  # sent -> last byte (s)
    chunk_times: list[float] = field(
        default_factory=list
    )  # arrival offsets of token-bearing chunks
    chunk_tokens: list[int] = field(default_factory=list)  # tokens carried by each such chunk
    prompt_tokens: int | None = None  # from the server's usage
    completion_tokens: int | None = None  # from the server's usage
    status: int | None = None  # HTTP status
    finish_reason: str | None = None
    response_id: str | None = None  # the server's id for the response ("cmpl-...")
    error: str | None = None  # None when the request succeeded
    error_kind: str | None = None  # a key of ERROR_KINDS
    prompt_text: str = ""  # last user message sent
    # The whole conversation sent as JSON messages (MT-Bench turn 2 carries turn 1's answer).
    prompt_messages: str = ""
    output_text: str = ""
    # Generated token ids, in order (vLLM's ``return_token_ids``); empty when the server sent none.
    output_token_ids: list[int] = field(default_factory=list)
    # vLLM's --per-request-spec-decode-metrics detailed, from the final usage chunk: accepted
    # and proposed drafts per verify step, in order, and the count of steps that accepted j
    # drafts (j = 0..K). Empty when the server sent none.
    spec_per_step_accepted: list[int] = field(default_factory=list)
    spec_per_step_drafted: list[int] = field(default_factory=list)
    spec_acceptance_histogram: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def queue_delay(self) -> float:
        return self.sent_at - self.queued_at

    def to_row(self) -> dict:
        return asdict(self)
