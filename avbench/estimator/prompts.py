"""First-turn prompts of a workload for offline tracing.

Uses the workload registry when it exists; otherwise reads the jsonl files vendored in
avbench/workloads/data directly (first turn of each conversation, file order).
"""

from __future__ import annotations

import json
from importlib.resources import files

from avbench.errors import WorkloadError

# workload id -> (vendored file, field holding the first user turn)
_VENDORED = {
    "gsm8k": ("gsm8k/test.jsonl", "question"),
    "humaneval": ("humaneval/HumanEval.jsonl", "prompt"),
    "mt-bench": ("mt_bench/question.jsonl", "turns"),
    "spec-bench": ("spec_bench/question.jsonl", "turns"),
}


def _from_registry(workload: str, limit: int) -> list[str] | None:
    try:
        from avbench.workloads.registry import load_workload  # written in parallel (issue 3)
    except ImportError:
        return None
    try:
        loaded = load_workload(workload)
    except TypeError:  # an interface we do not know; fall back to the vendored files
        return None
    convs = getattr(loaded, "conversations", loaded)
    try:
        texts = [c.turns[0] for c in convs if getattr(c, "turns", None)]
    except TypeError:
        return None
    return texts[:limit] if texts else None


def load_prompts(workload: str, limit: int) -> list[str]:
    if workload in _VENDORED:
        return _vendored(workload, limit)
    texts = _from_registry(workload, limit)
    if texts is None:
        known = ", ".join(sorted(_VENDORED))
        raise WorkloadError(f"--workload {workload!r}: unknown workload for tracing (known: {known})")
    return texts


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
                raise WorkloadError(f"{rel}:{lineno}: expected a JSON object with field '{key}'") from None
            text = val[0] if isinstance(val, list) else val
            if not isinstance(text, str) or not text:
                raise WorkloadError(f"{rel}:{lineno}: field '{key}' holds no prompt text")
            texts.append(text)
            if len(texts) >= limit:
                break
    return texts
