"""Counting prompt length and rendering chat templates client-side.

Input length is counted with the target's own tokenizer when one is given (a local directory,
read offline), because that is what the server counts against ``max_model_len``. Without one we
fall back to ``ceil(chars / 4)``: OpenAI's rule of thumb for English text with BPE vocabularies.
It over-counts code and under-counts some non-Latin scripts, so treat it as a rough filter; the
counter used is recorded with every loaded workload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from avbench.errors import WorkloadError

APPROX_COUNTER = "approx:ceil(chars/4)"


@lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> Any:
    p = Path(path)
    if not p.is_dir():
        raise WorkloadError(f"tokenizer: {path} is not a directory (expected a local HF model dir)")
    # Imported here: transformers takes seconds to import and most commands never need it.
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:  # transformers raises many types; one line is what the user needs
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WorkloadError(f"tokenizer: cannot load {path}: {msg}") from exc


def load_tokenizer(tokenizer_dir: str | Path) -> Any:
    """The tokenizer in ``tokenizer_dir`` (cached; never touches the network)."""
    return _load_tokenizer(str(tokenizer_dir))


def messages_for(turns: Sequence[str], system: str | None = None) -> list[dict[str, str]]:
    """User turns (and an optional system prompt) as OpenAI-style messages."""
    msgs = [{"role": "system", "content": system}] if system else []
    msgs.extend({"role": "user", "content": t} for t in turns)
    return msgs


def render_chat_prompt(messages: list[dict], tokenizer_dir: str | Path) -> str:
    """The prompt text a ``/v1/completions`` request should carry for ``messages``.

    Uses the tokenizer's own chat template with the generation prompt appended, exactly what
    the server would do for ``/v1/chat/completions``. A tokenizer without a template is an
    error: sending raw text instead would silently change what the model sees.
    """
    tok = load_tokenizer(tokenizer_dir)
    if not getattr(tok, "chat_template", None):
        raise WorkloadError(
            f"tokenizer: {tokenizer_dir} has no chat_template; "
            "api='completions' needs one to render prompts client-side"
        )
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class TokenCounter:
    """Counts the input length of a conversation's user side.

    A multi-turn conversation is counted as all of its user turns sent together (plus the
    system prompt and chat template when a tokenizer is given). The model's own answers, which
    later turns also carry, are bounded by the output cap, not by this one.
    """

    def __init__(self, tokenizer_dir: str | Path | None = None) -> None:
        self.tokenizer_dir = tokenizer_dir
        self._tok = load_tokenizer(tokenizer_dir) if tokenizer_dir is not None else None

    @property
    def name(self) -> str:
        return APPROX_COUNTER if self._tok is None else f"tokenizer:{self.tokenizer_dir}"

    def count(self, turns: Sequence[str], system: str | None = None) -> int:
        if self._tok is None:
            chars = sum(len(t) for t in turns) + (len(system) if system else 0)
            return math.ceil(chars / 4)
        if getattr(self._tok, "chat_template", None):
            ids = self._tok.apply_chat_template(
                messages_for(turns, system), tokenize=True, add_generation_prompt=True
            )
            # transformers 5 returns a BatchEncoding here; older versions a plain list.
            if hasattr(ids, "keys") and "input_ids" in ids:
                ids = ids["input_ids"]
            return len(ids)
        text = "\n".join(([system] if system else []) + list(turns))
        return len(self._tok.encode(text))
