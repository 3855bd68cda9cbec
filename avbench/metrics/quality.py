"""Output-quality guard: did speculation leave the output unchanged? (docs/fair-comparisons.md)

Speculative decoding is lossless in distribution, so two checks apply per cell:

- at temperature 0, the strict check: a speculative arm's output for a prompt must equal the
  baseline arm's output for the same prompt, token for token. Batch shape changes the order of
  floating-point sums, so a near-tie between the target's two best tokens can flip; such flips
  are counted (share identical, first differing position), never hidden;
- on GSM8K, exact-match accuracy of the final answer with its binomial standard error, which
  must agree across arms within noise at any temperature.

Pure functions over records; the runner supplies the baseline arm's stored records.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from avbench.loadgen.records import RequestRecord

# Column -> (unit, definition): the cell-row schema takes them from here.
QUALITY_COLUMNS: dict[str, tuple[str, str]] = {
    "baseline_cell_id": (
        "id",
        "the baseline arm's cell (same workload, load and repeat) this cell's outputs were "
        "compared with; None when there was none or the cell is the baseline.",
    ),
    "identical_compared": (
        "requests",
        "successful requests whose prompt the baseline cell also sent and answered "
        "(temperature 0 only).",
    ),
    "identical_to_baseline_share": (
        "fraction",
        "share of the compared requests whose generated tokens equal the baseline arm's for "
        "the same prompt (token ids when the server returned them, else text); temperature 0 "
        "only, where speculation must not change the output.",
    ),
    "first_diff_positions": (
        "token positions",
        "for each compared request whose output differs from the baseline's, the 0-based "
        "index of the first differing output token (character index when no token ids), "
        "sorted.",
    ),
    "gsm8k_exact_match": (
        "fraction",
        "GSM8K: share of successful requests whose final answer (the number after '####', "
        "else the last number in the output) equals the reference answer.",
    ),
    "gsm8k_exact_match_se": (
        "fraction",
        "binomial standard error of gsm8k_exact_match: sqrt(p (1 - p) / n).",
    ),
    "gsm8k_graded": ("requests", "successful GSM8K requests graded for exact match."),
}


@dataclass(frozen=True)
class Output:
    """One answered request, as the guard sees it."""

    conversation_id: str
    turn: int
    prompt: str  # the whole conversation sent (a changed earlier turn changes it)
    token_ids: tuple[int, ...]
    text: str

    @classmethod
    def of(cls, r: RequestRecord) -> Output:
        return cls(
            r.conversation_id,
            r.turn,
            r.prompt_messages or r.prompt_text,
            tuple(r.output_token_ids),
            r.output_text,
        )


@dataclass(frozen=True)
class Identity:
    compared: int
    identical: int
    first_diff_positions: tuple[int, ...]  # one per differing request, sorted
    differing: tuple[tuple[str, int, int], ...]  # (conversation id, turn, first position)

    @property
    def share(self) -> float | None:
        return self.identical / self.compared if self.compared else None


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """Index of the first element where ``a`` and ``b`` differ (a prefix differs at its end)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _sequence(o: Output, other: Output) -> tuple[Sequence, Sequence]:
    if o.token_ids and other.token_ids:
        return o.token_ids, other.token_ids
    return o.text, other.text


def compare_to_baseline(baseline: Iterable[Output], arm: Iterable[Output]) -> Identity:
    """Token-for-token comparison of each arm output with the baseline's for the same prompt.

    A request is compared only when the baseline sent the same conversation turn with the same
    prompt (a multi-turn conversation whose first answer differed sends a different second
    prompt: that turn is not comparable, the first one already counts the difference).
    """
    base = {(o.conversation_id, o.turn): o for o in baseline}
    compared = identical = 0
    differing: list[tuple[str, int, int]] = []
    for o in arm:
        b = base.get((o.conversation_id, o.turn))
        if b is None or b.prompt != o.prompt:
            continue
        compared += 1
        pos = first_difference(*_sequence(o, b))
        if pos is None:
            identical += 1
        else:
            differing.append((o.conversation_id, o.turn, pos))
    return Identity(
        compared, identical, tuple(sorted(p for _, _, p in differing)), tuple(differing)
    )


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def gsm8k_answer(text: str | None) -> str | None:
    """The final numeric answer of a GSM8K solution: after '####' if present, else the last
    number; commas and a trailing '.0' dropped so that 1,000 == 1000 == 1000.0."""
    if not text:
        return None
    tail = text.rsplit("####", 1)[1] if "####" in text else text
    found = _NUMBER.findall(tail)
    if not found:
        return None
    n = found[0] if "####" in text else found[-1]
    n = n.replace(",", "")
    if "." in n:
        n = n.rstrip("0").rstrip(".")
    return n or None


@dataclass(frozen=True)
class ExactMatch:
    graded: int
    correct: int

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.graded if self.graded else None

    @property
    def standard_error(self) -> float | None:
        p = self.accuracy
        return None if p is None else math.sqrt(p * (1 - p) / self.graded)


def exact_match(outputs: Iterable[Output], references: Mapping[str, str | None]) -> ExactMatch:
    """GSM8K exact match of first-turn answers against ``references`` (conversation id ->
    reference solution); outputs without a reference are not graded."""
    graded = correct = 0
    for o in outputs:
        ref = gsm8k_answer(references.get(o.conversation_id))
        if o.turn != 0 or ref is None:
            continue
        graded += 1
        correct += gsm8k_answer(o.text) == ref
    return ExactMatch(graded, correct)


def differs_beyond_noise(a: ExactMatch, b: ExactMatch, z: float = 2.0) -> bool:
    """Two accuracies differ by more than ``z`` standard errors of their difference."""
    if not a.graded or not b.graded:
        return False
    se = math.hypot(a.standard_error or 0.0, b.standard_error or 0.0)
    gap = abs((a.accuracy or 0.0) - (b.accuracy or 0.0))
    # With both accuracies at 0 or 1 the binomial SE is 0: any gap is then beyond noise.
    return gap > z * se if se > 0 else gap > 0


# Below this share of identical outputs at temperature 0 an arm is flagged: a few near-tie
# flips under another batch shape are expected, a systematic change is not.
IDENTICAL_FLOOR = 0.99


def _identity_columns(
    records: Sequence[RequestRecord],
    baseline: Sequence[RequestRecord],
    baseline_cell_id: str | None,
) -> dict:
    """The temperature-0 identity check of a cell's measured records against its baseline's."""
    ident = compare_to_baseline(
        [Output.of(r) for r in baseline if r.ok],
        [Output.of(r) for r in records if r.ok and not r.warmup],
    )
    return {
        "baseline_cell_id": baseline_cell_id,
        "identical_compared": ident.compared,
        "identical_to_baseline_share": ident.share,
        "first_diff_positions": list(ident.first_diff_positions),
    }


def quality_columns(
    records: Sequence[RequestRecord],
    *,
    baseline: Sequence[RequestRecord] | None,
    baseline_cell_id: str | None,
    temperature: float,
    references: Mapping[str, str | None] | None,
) -> dict:
    """The guard's columns for one cell (None where a check does not apply)."""
    ok = [Output.of(r) for r in records if r.ok and not r.warmup]
    row: dict = dict.fromkeys(QUALITY_COLUMNS)
    if baseline is not None:
        row["baseline_cell_id"] = baseline_cell_id
    if baseline is not None and temperature == 0:
        row |= _identity_columns(records, baseline, baseline_cell_id)
    if references:
        em = exact_match(ok, references)
        if em.graded:
            row |= {
                "gsm8k_exact_match": em.accuracy,
                "gsm8k_exact_match_se": em.standard_error,
                "gsm8k_graded": em.graded,
            }
    return row


def _arm_kind(row: Mapping) -> str:
    return row.get("arm_kind") or str(row.get("arm", "")).split("-")[0]


def identity_applies(row: Mapping) -> bool:
    """The identity check is defined for a speculative cell sampled at temperature 0."""
    return _arm_kind(row) != "baseline" and row.get("temperature") == 0


def _load_key(row: Mapping) -> tuple:
    # A merged run holds several sources: a baseline counts only within its own run.
    keys = ("source_run", "pair", "workload", "concurrency", "rate", "repeat")
    return tuple(row.get(k) for k in keys)


def fill_identity(
    rows: Sequence[dict], read_records: Callable[[str], Sequence[RequestRecord]]
) -> list[dict]:
    """``rows`` with the identity check computed now, from the stored records, for each cell
    measured before its baseline cell existed (a baseline arm that failed, then measured by
    --resume): rows are never rewritten, so readers complete them. Other rows are unchanged."""
    baselines = {_load_key(r): r for r in rows if _arm_kind(r) == "baseline"}
    out = []
    for row in rows:
        base = baselines.get(_load_key(row))
        if base is None or row.get("baseline_cell_id") or not identity_applies(row):
            out.append(row)
            continue
        try:
            columns = _identity_columns(
                read_records(row["cell_id"]), read_records(base["cell_id"]), base["cell_id"]
            )
        except OSError:  # a records file missing (e.g. deleted): the cell stays not compared
            columns = {}
        out.append(row | columns)
    return out


NOT_COMPARED = "not compared (no baseline cell of this workload, load and repeat)"


def identity_text(row: Mapping, short: bool = False) -> str:
    """How a cell's identity check reads: the share identical, or why there is none; "-"
    where the check does not apply (the baseline itself, temperature > 0)."""
    share, compared = row.get("identical_to_baseline_share"), row.get("identical_compared")
    if share is not None and compared is not None:
        return f"{share:.0%}" if short else f"{share:.1%} of {int(compared)}"
    if not identity_applies(row):
        return "-"
    if compared == 0:
        return "none comparable" if short else "none comparable (no prompt in common)"
    return "not compared" if short else NOT_COMPARED


def quality_flags(rows: Iterable[Mapping]) -> list[str]:
    """One sentence per cell whose output quality differs from its baseline beyond noise."""
    rows = list(rows)
    by_id = {r.get("cell_id"): r for r in rows}
    out = []
    for r in rows:
        share = r.get("identical_to_baseline_share")
        if share is not None and share < IDENTICAL_FLOOR:
            pos = r.get("first_diff_positions") or []
            out.append(
                f"{r['cell_id']}: {share:.1%} of {int(r['identical_compared'])} outputs identical "
                f"to the baseline at temperature 0 (first differing positions {pos[:8]}); a "
                "near-tie between the target's two best tokens flipping under another batch "
                "shape is the expected cause (`avbench quality explain RUN` measures the margin)"
            )
        base = by_id.get(r.get("baseline_cell_id"))
        if base is None or r.get("gsm8k_graded") is None or base.get("gsm8k_graded") is None:
            continue
        a = ExactMatch(r["gsm8k_graded"], round(r["gsm8k_exact_match"] * r["gsm8k_graded"]))
        b = ExactMatch(
            base["gsm8k_graded"], round(base["gsm8k_exact_match"] * base["gsm8k_graded"])
        )
        if differs_beyond_noise(a, b):
            out.append(
                f"{r['cell_id']}: GSM8K exact match {a.accuracy:.3f} ± {a.standard_error:.3f} vs "
                f"baseline {b.accuracy:.3f} ± {b.standard_error:.3f}: beyond two standard errors"
            )
    return out
