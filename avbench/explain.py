"""Why an output differed from the baseline's at temperature 0: the target's logit margin there.

Greedy decoding picks the target's top-1 token. Speculative decoding verifies drafts in a batch
of another shape than plain decoding, so the floating-point sums behind the logits run in
another order; where the target's two best tokens are nearly tied, that is enough to swap them,
and the output continues differently from there on. This is expected and not a loss of
losslessness. A flip at a large margin would be: it means the arm computed a different
distribution.

For each output that differs from its baseline (docs/fair-comparisons.md), the target model is
run offline (transformers) on the prompt plus the baseline's output, and the margin
(top-1 logit minus top-2 logit) is read at the first differing position, next to the margins at
every other position of the same outputs for reference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avbench.errors import AvbenchError
from avbench.inputs.suite import Pair
from avbench.loadgen.records import RequestRecord
from avbench.metrics.quality import Output, fill_identity, first_difference, identity_applies
from avbench.store.artefacts import SweepManifest
from avbench.store.run_store import RunStore


@dataclass(frozen=True)
class NearTie:
    cell_id: str
    conversation_id: str
    turn: int
    position: int  # first differing output token
    baseline_token: int
    arm_token: int | None  # None: the arm's output ended there
    margin: float  # target's top-1 minus top-2 logit at that position
    baseline_is_top1: bool  # the offline target agrees with the baseline's token


@dataclass(frozen=True)
class Explanation:
    ties: list[NearTie]
    reference_margins: np.ndarray  # margins at every non-differing position of the same outputs
    compared: tuple[str, ...] = ()  # temperature-0 speculative cells compared with a baseline
    not_compared: tuple[str, ...] = ()  # ... that had no baseline cell to compare with

    def summary(self) -> dict:
        m = np.array([t.margin for t in self.ties])
        ref = self.reference_margins
        return {
            "cells_compared": len(self.compared),
            "cells_not_compared": list(self.not_compared),
            "differing_outputs": len(self.ties),
            "margin_median_at_divergence": float(np.median(m)) if m.size else None,
            "margin_median_elsewhere": float(np.median(ref)) if ref.size else None,
            # Where the divergence margin ranks among the margins elsewhere (0 = the smallest).
            "divergence_margin_percentile": [
                float((ref < t.margin).mean() * 100) if ref.size else None for t in self.ties
            ],
            "baseline_is_top1": sum(t.baseline_is_top1 for t in self.ties),
        }


def _pairs(
    rows: list[dict], store: RunStore
) -> list[tuple[str, RequestRecord, RequestRecord, int]]:
    """(cell id, baseline record, arm record, first differing position) for every difference."""
    out = []
    for row in rows:
        cell_id, base_id = row["cell_id"], row.get("baseline_cell_id")
        if not base_id or not row.get("first_diff_positions"):
            continue
        base = {(r.conversation_id, r.turn): r for r in store.read_records(base_id) if r.ok}
        for r in store.read_records(cell_id):
            b = base.get((r.conversation_id, r.turn))
            if r.warmup or not r.ok or b is None:
                continue
            ob, oa = Output.of(b), Output.of(r)
            if ob.prompt != oa.prompt or not ob.token_ids:
                continue
            pos = first_difference(oa.token_ids, ob.token_ids)
            if pos is not None and pos < len(ob.token_ids):
                out.append((cell_id, b, r, pos))
    return out


def _prompt_ids(tokenizer, record: RequestRecord, templated: bool) -> list[int]:
    if not templated:
        return list(tokenizer.encode(record.prompt_text))
    ids = tokenizer.apply_chat_template(
        json.loads(record.prompt_messages), add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def explain_run(run_dir: Path, limit: int = 50) -> Explanation:
    """The target's margins at the first differing positions of a run's outputs."""
    import torch

    from avbench.estimator.trace import load_model
    from avbench.workloads.tokens import load_tokenizer

    store = RunStore.open(run_dir)
    m = store.read_manifest()
    pair = Pair.model_validate(m.pair)
    target = pair.resolve(pair.target)
    if not target or not Path(target).is_dir():
        raise AvbenchError(
            f"{run_dir}: the pair's target {pair.target!r} is not a local model directory; "
            "explaining a divergence needs the target's weights"
        )
    rows = fill_identity(list(store.finished_cells().values()), store.read_records)
    compared = tuple(r["cell_id"] for r in rows if r.get("identical_compared") is not None)
    missing = tuple(
        r["cell_id"] for r in rows if identity_applies(r) and r.get("identical_compared") is None
    )
    pairs = _pairs(rows, store)[:limit]
    if not pairs:
        return Explanation([], np.zeros(0), compared, missing)
    model, tok = load_model(Path(target)), load_tokenizer(target)
    workloads = m.workloads if isinstance(m, SweepManifest) else {}
    ties, reference = [], []
    for cell_id, base, arm, pos in pairs:
        spec = workloads.get(cell_id.split("__")[1], {})
        templated = spec.get("api", "chat") == "chat" or spec.get("prompt_template") == "chat"
        prompt = _prompt_ids(tok, base, templated)
        out = list(base.output_token_ids)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]
        top2 = torch.topk(logits.double(), 2, dim=-1)
        margins = (top2.values[:, 0] - top2.values[:, 1]).numpy()
        ties.append(
            NearTie(
                cell_id,
                base.conversation_id,
                base.turn,
                pos,
                out[pos],
                arm.output_token_ids[pos] if pos < len(arm.output_token_ids) else None,
                float(margins[pos]),
                int(top2.indices[pos, 0]) == out[pos],
            )
        )
        reference.append(np.delete(margins, pos))
    return Explanation(ties, np.concatenate(reference), compared, missing)
