"""The plan: which arms a sweep launches and which cells each arm runs, in order.

Cells are ordered repeat-major, then arm, then workload, then concurrency, so repeats
interleave arms (A/B/A/B within one session), as noise estimates need (docs/fair-comparisons.md).
With ``rotate_workloads`` repeat r starts at the r-th workload, so no workload always meets a
cold online estimator first (docs/fair-comparisons.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from avbench.errors import SuiteError
from avbench.inputs.schedule import max_k
from avbench.inputs.suite import MAX_K, Pair, Sweep

ArmKind = Literal["baseline", "static", "av", "dyn"]
SPECULATIVE_KINDS = ("static", "av", "dyn")


@dataclass(frozen=True)
class Arm:
    """One server configuration: no speculation, static K, AV at K, or a per-batch-size K
    schedule whose largest K is k (dyn; the schedule is the sweep's)."""

    kind: ArmKind
    k: int = 0

    def __post_init__(self) -> None:
        if self.kind == "baseline" and self.k != 0:
            raise ValueError(f"arm baseline: no K (got {self.k})")
        if self.kind != "baseline" and not 1 <= self.k <= MAX_K:
            raise ValueError(
                f"arm {self.name}: K must be 1-{MAX_K} (a speculative arm drafts at least one "
                "token)"
            )

    @property
    def name(self) -> str:
        return "baseline" if self.kind == "baseline" else f"{self.kind}-k{self.k}"

    @staticmethod
    def parse(name: str) -> Arm:
        if name == "baseline":
            return Arm("baseline")
        for kind in SPECULATIVE_KINDS:
            if name.startswith(f"{kind}-k") and name[len(kind) + 2 :].isdigit():
                return Arm(kind, int(name[len(kind) + 2 :]))  # type: ignore[arg-type]
        raise ValueError(f"arm name {name!r}: expected baseline, static-k<K>, av-k<K> or dyn-k<K>")


@dataclass(frozen=True)
class Cell:
    arm: str
    workload: str
    concurrency: int | None  # closed loop: exactly this many in flight
    rate: float | None  # open loop: requests per second
    repeat: int
    num_requests: int
    warmup: int

    @property
    def id(self) -> str:
        load = f"c{self.concurrency}" if self.rate is None else f"r{self.rate:g}"
        return f"{self.arm}__{self.workload}__{load}__rep{self.repeat}"

    def to_dict(self) -> dict:
        return asdict(self) | {"cell_id": self.id}


def arms_for(pair: Pair, sweep: Sweep) -> list[Arm]:
    too_big = [k for k in pair.k_values or [] if k > pair.max_k]
    if too_big:
        raise SuiteError(
            f"pair {pair.name}: k_values {too_big} above its max_k {pair.max_k} (the drafter "
            "cannot propose that many tokens)"
        )
    ks = sorted(set(pair.k_values or sweep.k_values))
    ks = [k for k in ks if k <= pair.max_k] or [pair.max_k]
    arms: list[Arm] = []
    if "baseline" in sweep.arms:
        arms.append(Arm("baseline"))
    if "static" in sweep.arms:
        arms += [Arm("static", k) for k in (ks if sweep.static_k == "all" else ks[-1:])]
    if "av" in sweep.arms:
        arms.append(Arm("av", max(ks)))
    if "dyn" in sweep.arms and sweep.schedule:
        top = max_k(sweep.schedule)
        if top > pair.max_k:
            raise SuiteError(
                f"sweep {sweep.name}: schedule {sweep.schedule} asks for K {top} but pair "
                f"{pair.name} drafts at most {pair.max_k}"
            )
        arms.append(Arm("dyn", top))
    return arms


def build_plan(pair: Pair, sweep: Sweep, arms: list[Arm] | None = None) -> list[Cell]:
    arms = arms if arms is not None else arms_for(pair, sweep)
    _check_loads(sweep, arms)
    loads: list[tuple[int | None, float | None]] = (
        [(None, r) for r in sweep.rates]
        if sweep.rates
        else [(c, None) for c in sweep.concurrencies]
    )
    cells = []
    for repeat in range(sweep.repeats):
        shift = repeat % len(sweep.workloads) if sweep.rotate_workloads else 0
        workloads = sweep.workloads[shift:] + sweep.workloads[:shift]
        for arm in arms:
            for workload in workloads:
                for conc, rate in loads:
                    # Open loop sizes the cell as if the rate were a concurrency (~rate x 1 s).
                    scale = conc if conc is not None else max(1, round(rate or 1))
                    cells.append(
                        Cell(
                            arm=arm.name,
                            workload=workload,
                            concurrency=conc,
                            rate=rate,
                            repeat=repeat,
                            num_requests=sweep.num_requests(scale),
                            warmup=sweep.warmup,
                        )
                    )
    _check_unique(cells)
    return cells


def _check_loads(sweep: Sweep, arms: list[Arm]) -> None:
    if not arms:
        raise SuiteError(f"sweep {sweep.name}: arms is empty: nothing to run")
    if sweep.rates is not None and (not sweep.rates or any(r <= 0 for r in sweep.rates)):
        raise SuiteError(
            f"sweep {sweep.name}: rates must be a non-empty list of positive req/s (got "
            f"{sweep.rates})"
        )
    for field in ("workloads", "concurrencies", "rates"):
        values = getattr(sweep, field) or []
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            raise SuiteError(
                f"sweep {sweep.name}: {field} lists {', '.join(twice)} more than once (each "
                "cell would be measured twice under one id)"
            )


def _check_unique(cells: list[Cell]) -> None:
    """Two cells with one id would overwrite each other's records and hide a row."""
    seen: set[str] = set()
    for c in cells:
        if c.id in seen:
            raise SuiteError(f"plan: duplicate cell id {c.id} (a load or workload listed twice?)")
        seen.add(c.id)
