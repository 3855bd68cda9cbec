"""The common shape of every workload: a list of conversations.

A conversation is one or more *user* turns. The load driver sends turn 1, appends the model's
actual answer as an assistant message, then sends turn 2, and so on (MT-Bench style).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Conversation:
    id: str  # stable id within the workload, e.g. "gsm8k/17" or "mt-bench/81"
    turns: tuple[str, ...]  # user messages, in order
    category: str = ""
    system: str | None = None
    reference: str | None = None
    max_tokens: int | None = None  # output cap of this conversation (synthetic); None: sweep's


@dataclass(frozen=True)
class WorkloadSource:
    """Where the prompts came from; goes into the run manifest."""

    name: str
    origin: str  # "local:<relative path>" or "hf:<repo>@<revision>"
    sha256: str | None = None
    rows: int = 0
    extra: dict = field(default_factory=dict)
