"""Per-batch-size K schedules: vLLM's ``num_speculative_tokens_per_batch_size``.

vLLM reads ``[[first, last, K], ...]``: inclusive batch-size ranges, sorted, not overlapping,
the first starting at 1. A batch size in a gap or past the last range keeps the K of the range
before it; K = 0 means no drafts at that batch size. ``num_speculative_tokens`` must be at least
the largest K, since vLLM caps every entry at it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Schedule = list[tuple[int, int, int]]


def validate_schedule(schedule: Sequence[Sequence[int]]) -> Schedule:
    """The schedule as typed tuples; ValueError naming the first problem."""
    out: Schedule = []
    for entry in schedule:
        if len(entry) != 3:
            raise ValueError(f"entry {list(entry)}: expected [first_batch, last_batch, K]")
        first, last, k = (int(v) for v in entry)
        if first < 1 or last < first or k < 0:
            raise ValueError(
                f"entry {[first, last, k]}: expected 1 <= first_batch <= last_batch and K >= 0"
            )
        out.append((first, last, k))
    if not out:
        raise ValueError("expected at least one [first_batch, last_batch, K] entry")
    if out[0][0] != 1:
        raise ValueError(f"the first range must start at batch size 1 (got {out[0][0]})")
    for (_, prev_last, _), (first, _, _) in zip(out, out[1:], strict=False):
        if first <= prev_last:
            raise ValueError(
                f"ranges must be sorted and not overlap (a range starts at {first} "
                f"after one ending at {prev_last})"
            )
    if max_k(out) == 0:
        raise ValueError("every K is 0: that is no speculation, not a schedule")
    return out


def max_k(schedule: Schedule) -> int:
    return max(k for _, _, k in schedule)


def k_at(schedule: Schedule, batch_size: int) -> int:
    """The K vLLM runs at this batch size (gaps and the tail keep the previous range's K)."""
    k = schedule[0][2]
    for first, _, range_k in schedule:
        if first > batch_size:
            break
        k = range_k
    return k


def schedule_from_best_k(best_k: Mapping[int, int]) -> Schedule | None:
    """Ranges of batch sizes from the best K measured at each concurrency.

    Concurrency grids are geometric (1, 2, 4, ...), so the boundary between two measured
    concurrencies sits at their geometric mean. The last range ends at the largest concurrency
    measured; vLLM keeps its K for larger batches. None when every best K is 0.
    """
    cs = sorted(best_k)
    if not cs or all(best_k[c] == 0 for c in cs):
        return None
    ranges: Schedule = []
    first = 1
    for c, nxt in zip(cs, [*cs[1:], None], strict=True):
        last = c if nxt is None else max(c, min(nxt - 1, math.isqrt(c * nxt)))
        k = best_k[c]
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], last, k)
        else:
            ranges.append((first, last, k))
        first = last + 1
    return ranges


# A single-K schedule must measure its K: every drafting step uses it.
DYN_TOLERANCE_TOKENS = 0.25


@dataclass(frozen=True)
class DynCheck:
    """Draft tokens per draft a dyn arm measured (server counters) against its schedule.

    Closed-loop batches dip below the concurrency while a finished request's successor is being
    sent, and each cell ends with a drain through every smaller batch, so the mean is pulled
    toward the K of smaller batches. The check is therefore that the measured mean is nearer
    the scheduled K than any other K the schedule uses (within 0.25 tokens for a single-K
    schedule); a K of 0 must show no drafts at all.
    """

    concurrency: int
    scheduled_k: int
    draft_tokens_per_draft: float | None  # None: the server counted no drafts
    other_ks: tuple[int, ...] = ()  # the schedule's other nonzero Ks

    @property
    def matches(self) -> bool:
        measured = self.draft_tokens_per_draft
        if self.scheduled_k == 0 or measured is None:
            return self.scheduled_k == 0 and measured is None
        gap = abs(measured - self.scheduled_k)
        if not self.other_ks:
            return gap <= DYN_TOLERANCE_TOKENS
        return all(gap < abs(measured - k) for k in self.other_ks)


def check_dyn(schedule: Schedule, measured: Mapping[int, float | None]) -> list[DynCheck]:
    """One check per concurrency measured (concurrency -> draft tokens per draft)."""
    ks = {k for _, _, k in schedule if k > 0}
    out = []
    for c in sorted(measured):
        k = k_at(schedule, c)
        out.append(DynCheck(c, k, measured[c], tuple(sorted(ks - {k}))))
    return out
