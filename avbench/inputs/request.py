"""What a suite (or the command line) states about requests: where to send them, how to sample,
how long to wait, and the bounds past which a number is a typo."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

# Bounds of what a user can ask for: past them a number is a typo, and it would otherwise fail
# deep inside a cell (an islice bound above sys.maxsize, a JSON integer the server rejects).
MAX_TOKENS = 1 << 24  # 16,777,216 tokens: longer than any model's context
MAX_SECONDS = 7 * 86400.0  # a week
MAX_SEED = (1 << 63) - 1  # vLLM keeps seeds in a signed 64-bit integer


class Timeouts(BaseModel):
    """How long the load driver waits, in seconds (a sweep's ``timeouts``, ``--*-timeout``).

    ``read_s`` and ``stall_s`` count progress: the response head, or bytes of SSE data lines.
    SSE comments (``: ping`` keep-alives) are not progress, so a server that only pings fails
    like a silent one."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    request_s: float = Field(600.0, gt=0, le=MAX_SECONDS)  # one request, send to last byte
    read_s: float = Field(120.0, gt=0, le=MAX_SECONDS)  # one request without progress
    # No progress on any in-flight request of a cell for this long: /health is asked, the
    # cell fails as "server stalled" and so do the arm's remaining cells (resume reruns them).
    stall_s: float = Field(30.0, gt=0, le=MAX_SECONDS)
    cell_s: float = Field(3600.0, gt=0, le=MAX_SECONDS)  # a whole cell, warmup included


class EndpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str  # e.g. "http://127.0.0.1:8000" (no /v1)
    model: str  # served model name
    api: Literal["chat", "completions"] = "chat"
    api_key: SecretStr | None = None  # never serialised in clear (SecretStr)
    timeouts: Timeouts = Timeouts()
    # Ask for each chunk's token ids (vLLM >= 0.32 honours it when streaming): exact tokens/chunk.
    return_token_ids: bool = True


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_tokens: int = Field(2048, gt=0, le=MAX_TOKENS)
    ignore_eos: bool = False
    seed: int | None = Field(None, ge=-MAX_SEED - 1, le=MAX_SEED)
    chat_template_kwargs: dict | None = None  # e.g. {"enable_thinking": false}
