"""First-turn prompts of a workload for offline tracing, exactly as a sweep would send them
(same loader, order, input cap and system prompt)."""

from __future__ import annotations

from pathlib import Path

from avbench.errors import WorkloadError

Messages = list[dict[str, str]]


def load_prompts(workload: str, limit: int, tokenizer: str | Path | None = None) -> list[Messages]:
    """Chat messages (optional system + first user turn) of the first ``limit`` conversations.

    ``workload`` is a built-in or suite-defined workload id; ``tokenizer`` is the target's
    directory, used for the input cap.
    """
    from avbench.workloads.registry import all_workloads, load_workload

    specs = all_workloads()
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
