"""The ``synthetic`` workload: prompts of an exact length in tokens of the served tokenizer.

Like vLLM's ``random`` dataset (and guidellm's / AIPerf's synthetic inputs), so that avbench can
send what another client sends. Each prompt i gets an input length and an output length, drawn
uniformly from ``[len x (1 - len_range), len x (1 + len_range)]`` with a seeded generator; its
text is a window of that many tokens cut at a random offset from a token stream (the vendored
GSM8K questions, tokenized once), decoded, and re-tokenized: where a decode/encode round trip
merges or splits tokens at the window's edges the window is widened or narrowed until the
prompt is exactly its length *including* the special tokens the server adds to a completion
prompt. The output length is sent as the conversation's ``max_tokens``; with ``--ignore-eos``
the server generates exactly that many tokens.

Tokenizers: the server's own (vLLM's ``POST /tokenize`` and ``/detokenize``), or a local
tokenizer directory (same counts, no server needed). Prompts go to ``/v1/completions`` as they
are, with no chat template, so the server counts exactly the tokens built here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx
import numpy as np

from avbench.errors import WorkloadError
from avbench.inputs.workload import WorkloadSpec
from avbench.workloads.base import Conversation, WorkloadSource

# How many widen/narrow steps a window gets before its prompt is given up as inexact.
_MAX_ADJUST = 12
_CORPUS_CHUNK = 4  # GSM8K questions per tokenize call: far below any max_model_len


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str, special: bool) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...


class LocalTokenizer:
    """A Hugging Face tokenizer directory, read offline."""

    def __init__(self, path: str | Path):
        from avbench.workloads.tokens import load_tokenizer

        self._tok = load_tokenizer(path)
        self.name = f"tokenizer:{path}"

    def encode(self, text: str, special: bool) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=special))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))


class ServerTokenizer:
    """The served model's tokenizer, through vLLM's ``/tokenize`` and ``/detokenize``."""

    def __init__(self, base_url: str, model: str, headers: dict[str, str] | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"server:/tokenize of {model}"
        self.headers = headers or {}

    def _post(self, path: str, body: dict) -> dict:
        url = f"{self.base_url}{path}"
        try:
            r = httpx.post(
                url, json={"model": self.model, **body}, headers=self.headers, timeout=60
            )
        except httpx.HTTPError as exc:
            raise WorkloadError(f"synthetic workload: POST {url} failed ({exc})") from None
        if r.status_code != 200:
            raise WorkloadError(
                f"synthetic workload: POST {url} answered HTTP {r.status_code} (the server "
                "needs vLLM's /tokenize and /detokenize, or give a local tokenizer directory)"
            )
        return r.json()

    def encode(self, text: str, special: bool) -> list[int]:
        return list(
            self._post("/tokenize", {"prompt": text, "add_special_tokens": special})["tokens"]
        )

    def decode(self, ids: Sequence[int]) -> str:
        return self._post("/detokenize", {"tokens": list(ids)})["prompt"]


def draw_lengths(n: int, mean: int, spread: float, rng: np.random.Generator) -> np.ndarray:
    """n integer lengths uniform in [mean (1 - spread), mean (1 + spread)], each at least 1."""
    low = max(1, round(mean * (1 - spread)))
    high = max(low, round(mean * (1 + spread)))
    return rng.integers(low, high + 1, size=n)


def _token_stream(tok: Tokenizer, need: int) -> list[int]:
    """At least ``need`` tokens of English text (the vendored GSM8K questions, in order)."""
    from avbench.workloads.loaders import GSM8K

    questions = [
        c.turns[0] for c in GSM8K.load(WorkloadSpec(name="g", dataset="gsm8k")).conversations
    ]
    stream: list[int] = []
    for i in range(0, len(questions), _CORPUS_CHUNK):
        stream += tok.encode(" ".join(questions[i : i + _CORPUS_CHUNK]) + " ", special=False)
        if len(stream) >= need:
            return stream
    # Long prompts: the questions repeated, each copy a different stretch of the stream.
    return (stream * (need // max(len(stream), 1) + 1))[: max(need, len(stream))]


@dataclass(frozen=True)
class _Prompt:
    text: str
    tokens: int  # as the server counts a completion prompt (special tokens included)


def exact_prompt(tok: Tokenizer, stream: Sequence[int], start: int, length: int) -> _Prompt:
    """Text of ``length`` tokens (with special tokens) cut from ``stream`` at ``start``."""
    overhead = len(tok.encode("", special=True))
    width = max(1, length - overhead)
    best: _Prompt | None = None
    for _ in range(_MAX_ADJUST):
        text = tok.decode(stream[start : start + width])
        n = len(tok.encode(text, special=True))
        if best is None or abs(n - length) < abs(best.tokens - length):
            best = _Prompt(text, n)
        if n == length:
            break
        width = max(1, width + length - n)
    assert best is not None
    return best


@dataclass(frozen=True)
class Synthetic:
    conversations: list[Conversation]
    source: WorkloadSource
    input_tokens: list[int]  # per conversation, as the server counts the prompt


def load_synthetic(spec: WorkloadSpec, tok: Tokenizer, count: int) -> Synthetic:
    """``count`` conversations of ``spec``'s lengths (the source counts inexact prompts)."""
    if spec.input_len is None or spec.output_len is None:
        raise WorkloadError(f"workload {spec.name}: synthetic needs input_len and output_len")
    rng = np.random.default_rng(spec.seed)
    inputs = draw_lengths(count, spec.input_len, spec.len_range, rng)
    outputs = draw_lengths(count, spec.output_len, spec.len_range, rng)
    longest = int(inputs.max()) * 2 + 64
    stream = _token_stream(tok, longest * max(count, 4))
    # Distinct windows while the stream has room for them: a repeated prompt would be served
    # from the prefix cache and flatter TTFT.
    room = max(1, len(stream) - longest)
    starts = rng.choice(room, size=count, replace=count > room)
    convs, counts = [], []
    for i in range(count):
        p = exact_prompt(tok, stream, int(starts[i]), int(inputs[i]))
        counts.append(p.tokens)
        convs.append(
            Conversation(
                id=f"{spec.name}/{i}",
                turns=(p.text,),
                category=f"in{p.tokens}-out{outputs[i]}",
                max_tokens=int(outputs[i]),
            )
        )
    source = WorkloadSource(
        name=spec.name,
        origin=f"synthetic:{tok.name}",
        rows=count,
        extra={
            "input_len": spec.input_len,
            "output_len": spec.output_len,
            "len_range": spec.len_range,
            "inexact_prompts": int(sum(n != int(w) for n, w in zip(counts, inputs, strict=True))),
            "text_from": "GSM8K test questions (vendored), tokenized",
        },
    )
    return Synthetic(convs, source, counts)
