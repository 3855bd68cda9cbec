"""From the request id inside the engine to the id the client sees, and which ids are sampled.

vLLM 0.32/0.33 derive the engine's id from the response id (``cmpl-…`` / ``chatcmpl-…``):
the completions endpoint appends the prompt index (``-0``), the chat endpoint ``_i`` when one
request holds several prompts, parallel sampling (n > 1) prefixes the child index (``2_``), and
the input processor appends ``-`` and 8 random hex digits unless
VLLM_DISABLE_REQUEST_ID_RANDOMIZATION is set.
"""

from __future__ import annotations

import os
import re
import zlib

_CHILD = re.compile(r"^\d+_(?=(?:chat)?cmpl-)")
_RANDOM = re.compile(r"-[0-9a-f]{8}$")
_PROMPT_INDEX = {"cmpl-": re.compile(r"-\d+$"), "chatcmpl-": re.compile(r"_\d+$")}


def client_request_id(engine_id: str, randomized: bool | None = None) -> str:
    """The ``id`` field of the OpenAI response that carried this engine request."""
    if randomized is None:
        randomized = not randomization_disabled()
    rid = _CHILD.sub("", engine_id)
    if randomized:
        rid = _RANDOM.sub("", rid)
    for prefix, index in _PROMPT_INDEX.items():
        if rid.startswith(prefix):
            return index.sub("", rid)
    return rid


def randomization_disabled() -> bool:
    """VLLM_DISABLE_REQUEST_ID_RANDOMIZATION read as vLLM reads it: ``bool(int(value))``, so
    "0" leaves randomisation on. A value vLLM cannot parse stops vLLM itself at its first
    request; here it counts as unset."""
    try:
        return bool(int(os.environ.get("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "0")))
    except ValueError:
        return False


def is_sampled(client_id: str, fraction: float) -> bool:
    """Deterministic per request: the same id is in or out in every process and run."""
    if fraction >= 1.0:
        return True
    if fraction <= 0.0:
        return False
    return zlib.crc32(client_id.encode()) < fraction * 2**32
