"""A live sweep run against an offline trace of the same cells (`avbench trace --against RUN`):
read the run's static speculative cells, trace the same prompts with the same sampling and K,
and compare per draft position (the comparison itself: ``avbench.estimator.live_vs_trace``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from avbench.estimator.live_vs_trace import (
    SELF_CHECK_SE,
    LiveCheckError,
    PositionCheck,
    captured_acceptance,
    compare,
    trace_acceptance,
)
from avbench.inputs.suite import Pair
from avbench.inputs.workload import WorkloadSpec
from avbench.run.cell_run import select_conversations
from avbench.store.artefacts import SweepManifest
from avbench.store.run_store import RunStore
from avbench.workloads.registry import LoadedWorkload, load_workload
from avbench.workloads.tokens import messages_for

MAX_TRACE_BATCH = 64  # a cell's requests traced as one batch, at most


@dataclass(frozen=True)
class LiveRun:
    """What a sweep run measured on its speculative cells, and how to trace the same."""

    run_dir: Path
    pair_id: str
    target: Path
    drafter: Path
    k: int
    temperature: float
    top_p: float
    max_tokens: int
    ignore_eos: bool
    drafts: int  # Δ num_drafts summed over the cells
    accepted: np.ndarray  # accepted at each position, summed over the cells
    cells: list[dict]
    patched: tuple[str, ...]  # server_patched values of the cells


def _same(cells: list[dict], field: str):
    values = {c.get(field) for c in cells}
    if len(values) != 1:
        raise LiveCheckError(
            f"{field}: the run's speculative cells differ ({sorted(map(str, values))}); "
            "compare one setting at a time (one run per setting)"
        )
    return values.pop()


def load_live_run(run_dir: Path) -> LiveRun:
    store = RunStore.open(run_dir)
    manifest = store.read_manifest()
    cells = [c for c in store.finished_cells().values() if c.get("arm_kind") == "static"]
    if not cells:
        raise LiveCheckError(
            f"{run_dir}: no finished static speculative cells (AV trims drafts, so its "
            "counters are not plain rejection sampling)"
        )
    k = int(_same(cells, "k"))
    for c in cells:
        if not c.get("num_drafts") or any(c.get(f"accept_pos_{i}") is None for i in range(k)):
            raise LiveCheckError(
                f"cell {c['cell_id']}: no per-position acceptance (accept_pos_0..{k - 1})"
            )
    if _same(cells, "api") != "chat":
        raise LiveCheckError("api: only chat workloads are traced (the server renders them)")
    if _same(cells, "chat_template_kwargs"):
        raise LiveCheckError("chat_template_kwargs: traced prompts use the plain template")
    pair = Pair.model_validate(manifest.pair)
    target, drafter = pair.resolve(pair.target), pair.resolve(pair.drafter)
    if target is None or drafter is None:
        raise LiveCheckError(
            f"pair {pair.name}: no separate drafter model (the method drafts inside the "
            "target); the trace runs a drafter beside the target"
        )
    drafts = sum(int(c["num_drafts"]) for c in cells)
    accepted = np.array(
        [sum(c[f"accept_pos_{i}"] * c["num_drafts"] for c in cells) for i in range(k)]
    )
    return LiveRun(
        run_dir=run_dir,
        pair_id=pair.name,
        target=Path(target),
        drafter=Path(drafter),
        k=k,
        temperature=float(_same(cells, "temperature")),
        top_p=float(_same(cells, "top_p")),
        max_tokens=int(_same(cells, "max_tokens")),
        ignore_eos=bool(_same(cells, "ignore_eos")),
        drafts=drafts,
        accepted=np.rint(accepted),
        cells=cells,
        patched=tuple(sorted({str(c.get("server_patched") or "") for c in cells})),
    )


def cell_messages(run: LiveRun) -> dict[str, list[list[dict[str, str]]]]:
    """Each cell's measured conversations as the sweep sent them (same loader, spec, order and
    warmup split as the runner), as chat messages."""
    manifest = RunStore.open(run.run_dir).read_manifest()
    specs = manifest.workloads if isinstance(manifest, SweepManifest) else {}
    loaded: dict[str, LoadedWorkload] = {}
    out = {}
    for c in run.cells:
        w = c["workload"]
        if w not in loaded:
            loaded[w] = load_workload(WorkloadSpec.model_validate(specs[w]), run.target)
        _, measured = select_conversations(loaded[w].conversations, c["warmup"], c["num_requests"])
        for conv in measured:
            if len(conv.turns) != 1 or conv.max_tokens is not None:
                raise LiveCheckError(
                    f"workload {w}: conversation {conv.id} has several turns or its own "
                    "output cap; only single-turn workloads at the sweep's max_tokens are traced"
                )
        out[c["cell_id"]] = [messages_for(conv.turns, conv.system) for conv in measured]
    return out


def live_captured(run: LiveRun) -> np.ndarray | None:
    """Per-position acceptance from the run's captured drafts of these cells (None: none)."""
    from avbench.estimator.drafts import drafts_path, read_drafts

    paths = [drafts_path(run.run_dir, c["cell_id"]) for c in run.cells]
    frames = [read_drafts(p) for p in paths if p.is_file()]
    if not frames:
        return None
    return captured_acceptance(pd.concat(frames, ignore_index=True), run.k)


@dataclass(frozen=True)
class LiveCheck:
    run: LiveRun
    positions: list[PositionCheck]
    captured_present: bool
    trace_rows: int
    trace_seconds: float

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.positions)


@dataclass(frozen=True)
class TraceRunOptions:
    """How :func:`check_live_run` traces: each cell's prompts ``passes`` times, on ``device``,
    seeded; ``tolerance``: a fixed pass band per position (None: from the standard errors)."""

    passes: int = 1
    tolerance: float | None = None
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.passes < 1:
            raise LiveCheckError(f"--passes: expected an integer >= 1, got {self.passes}")
        if self.tolerance is not None and not self.tolerance > 0:
            raise LiveCheckError(f"--tolerance: expected a positive number, got {self.tolerance}")


def check_live_run(
    run_dir: Path,
    out_dir: Path,
    opts: TraceRunOptions = TraceRunOptions(),
    progress: Callable[[str], None] | None = None,
) -> LiveCheck:
    """Trace the run's pair on its cells' prompts with its sampling and K, vLLM's drafter
    semantics, and compare per position."""
    from avbench.estimator.drafts import write_drafts
    from avbench.estimator.trace import (
        Models,
        TraceConfig,
        encode_prompts,
        load_model,
        load_tokenizer,
        trace_pair,
    )

    passes, seed, device = opts.passes, opts.seed, opts.device
    t0 = time.monotonic()
    run = load_live_run(run_dir)
    cfg = TraceConfig(
        num_draft=run.k,
        temperature=run.temperature,
        top_p=run.top_p,
        max_new_tokens=run.max_tokens,
        # vLLM takes the whole prompt; the workloads' input caps keep it inside the model.
        max_prompt_tokens=1 << 30,
        seed=seed,
        device=device,
    )
    tok = load_tokenizer(run.target)
    target = load_model(run.target, device)
    drafter = load_model(run.drafter, device)
    eos = tok.eos_token_id
    eos_ids = [] if run.ignore_eos else ([eos] if isinstance(eos, int) else list(eos or []))
    frames = []
    for n, (cell_id, messages) in enumerate(cell_messages(run).items()):
        ids = {"run_id": f"trace-of-{run_dir.name}", "pair_id": run.pair_id, "workload_id": cell_id}
        prompts = encode_prompts(tok, messages) * passes
        # Cells often repeat the same prompts: one seed each keeps their traces independent.
        # Acceptance does not depend on which requests share a step, so the batch is a speed
        # choice: a cell's prompts go as one batch (capped, as --passes multiplies them).
        cell_cfg = replace(cfg, seed=seed + n, concurrency=min(len(prompts), MAX_TRACE_BATCH))
        frames.append(
            trace_pair(Models(target, drafter), prompts, cell_cfg, ids, eos_ids, progress)
        )
        if progress:
            progress(f"{cell_id}: traced {len(prompts)} prompts")
    df = pd.concat(frames, ignore_index=True)
    write_drafts(df, out_dir / f"trace-of-{run_dir.name}.drafts.parquet")
    trace = trace_acceptance(df["position"], df["label"], df["expected_accept"], run.k)
    captured = live_captured(run)
    positions = compare(run.drafts, run.accepted, trace, opts.tolerance, captured)
    return LiveCheck(run, positions, captured is not None, len(df), time.monotonic() - t0)


def render_live_check(res: LiveCheck) -> str:
    r = res.run
    lines = [
        f"Live {r.run_dir.name} ({len(r.cells)} static-k{r.k} cells, T = {r.temperature}, "
        f"top-p {r.top_p}, max_tokens {r.max_tokens}; server patched: "
        f"{', '.join(p or 'no' for p in r.patched)}) vs an offline trace of the same prompts "
        f"({res.trace_rows} labeled drafts, {res.trace_seconds:.0f}s).",
        "Acceptance per draft position as vLLM counts it: accepted at position i / drafts "
        "(unconditional on earlier positions).",
        "",
        "| position | live drafts | live | live captured | offline drafts | offline sampled "
        "| offline sum min(p,q) | live - offline | tolerance | trace self-check (z) | result |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in res.positions:
        cap = "-" if p.captured is None else f"{p.captured:.4f}"
        verdict = "pass" if p.passed else ("FAIL" if not p.live_ok else "FAIL (self-check)")
        lines.append(
            f"| {p.position} | {p.live_drafts} | {p.live:.4f} | {cap} | {p.offline_steps} | "
            f"{p.offline_sampled:.4f} | {p.offline_expected:.4f} | {p.diff:+.4f} | "
            f"{p.tolerance:.4f} | {p.self_z:+.2f} | {verdict} |"
        )
    lines += [
        "",
        f"- self-check: the trace's sampled acceptance within {SELF_CHECK_SE:g} standard errors "
        "of its own sum min(p, q).",
        "- result: " + ("PASS" if res.passed else "FAIL") + " at every position.",
    ]
    return "\n".join(lines)
