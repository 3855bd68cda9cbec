"""Typed settings for the load driver: where to send, and how to sample."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class EndpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str  # e.g. "http://127.0.0.1:8000" (no /v1)
    model: str  # served model name
    api: Literal["chat", "completions"] = "chat"
    api_key: SecretStr | None = None  # never serialised in clear (SecretStr)
    request_timeout_s: float = Field(600.0, gt=0)  # whole request
    read_timeout_s: float = Field(120.0, gt=0)  # longest silence between bytes (stall guard)
    # Ask for each chunk's token ids (vLLM >= 0.32 honours it when streaming): exact tokens/chunk.
    return_token_ids: bool = True


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_tokens: int = Field(2048, gt=0)
    ignore_eos: bool = False
    seed: int | None = None
    chat_template_kwargs: dict | None = None  # e.g. {"enable_thinking": false}
