"""First-turn prompts of a workload for offline tracing.

Uses the workload registry (same order and caps as a sweep); if it is missing, reads the
jsonl files vendored in avbench/workloads/data directly (first turn, file order).
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from avbench.errors import WorkloadError

# workload id -> (vendored file, field holding the first user turn)
_VENDORED = {
    "gsm8k": ("gsm8k/test.jsonl", "question"),
    "humaneval": ("humaneval/HumanEval.jsonl", "prompt"),
    "mt-bench": ("mt_bench/question.jsonl", "turns"),
    "spec-bench": ("spec_bench/question.jsonl", "turns"),
}


Messages = list[dict[str, str]]


def load_prompts(workload: str, limit: int, tokenizer: str | Path | None = None) -> list[Messages]:
    """Chat messages (optional system + first user turn) of the first ``limit`` conversations.

    With the workload registry (issue 3) the order, input cap and system prompt are exactly
    what a sweep sends; ``tokenizer`` is the target's directory, used for the input cap.
    """
    try:
        from avbench.workloads.registry import builtin_workloads, load_workload
    except ImportError:  # registry not installed: read the vendored files in file order
        if workload not in _VENDORED:
            known = ", ".join(sorted(_VENDORED))
            raise WorkloadError(
                f"--workload {workload!r}: unknown workload for tracing (known: {known})"
            ) from None
        return [[{"role": "user", "content": t}] for t in _vendored(workload, limit)]
    specs = builtin_workloads()
    if workload not in specs:
        known = ", ".join(sorted(specs))
        raise WorkloadError(
            f"--workload {workload!r}: unknown workload for tracing (known: {known})"
        )
    loaded = load_workload(specs[workload].model_copy(update={"limit": limit}), tokenizer)
    out: list[Messages] = []
    for conv in loaded.conversations:
        msgs = [{"role": "system", "content": conv.system}] if conv.system else []
        out.append(msgs + [{"role": "user", "content": conv.turns[0]}])
    return out


def _vendored(workload: str, limit: int) -> list[str]:
    rel, key = _VENDORED[workload]
    path = files("avbench.workloads").joinpath("data", *rel.split("/"))
    texts: list[str] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                val = row[key]
            except (json.JSONDecodeError, KeyError):
                raise WorkloadError(
                    f"{rel}:{lineno}: expected a JSON object with field '{key}'"
                ) from None
            text = val[0] if isinstance(val, list) else val
            if not isinstance(text, str) or not text:
                raise WorkloadError(f"{rel}:{lineno}: field '{key}' holds no prompt text")
            texts.append(text)
            if len(texts) >= limit:
                break
    return texts
