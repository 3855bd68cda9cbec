"""The plan: which arms a sweep launches and which cells each arm runs, in order.

Cells are ordered repeat-major, then arm, then workload, then concurrency, so repeats
interleave arms (A/B/A/B within one session), as DESIGN.md §7 asks for noise estimates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from avbench.suite import Pair, Sweep

ArmKind = Literal["baseline", "static", "av"]


@dataclass(frozen=True)
class Arm:
    """One server configuration: no speculation, static K, or AV at K."""

    kind: ArmKind
    k: int = 0

    @property
    def name(self) -> str:
        return {"baseline": "baseline", "static": f"static-k{self.k}", "av": f"av-k{self.k}"}[
            self.kind
        ]

    @staticmethod
    def parse(name: str) -> Arm:
        if name == "baseline":
            return Arm("baseline")
        for kind in ("static", "av"):
            if name.startswith(f"{kind}-k") and name[len(kind) + 2 :].isdigit():
                return Arm(kind, int(name[len(kind) + 2 :]))  # type: ignore[arg-type]
        raise ValueError(f"arm name {name!r}: expected baseline, static-k<K> or av-k<K>")


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
    ks = sorted(set(pair.k_values or sweep.k_values))
    ks = [k for k in ks if k <= pair.max_k] or [pair.max_k]
    arms: list[Arm] = []
    if "baseline" in sweep.arms:
        arms.append(Arm("baseline"))
    if "static" in sweep.arms:
        arms += [Arm("static", k) for k in ks]
    if "av" in sweep.arms:
        arms.append(Arm("av", max(ks)))
    return arms


def build_plan(pair: Pair, sweep: Sweep, arms: list[Arm] | None = None) -> list[Cell]:
    arms = arms if arms is not None else arms_for(pair, sweep)
    loads: list[tuple[int | None, float | None]] = (
        [(None, r) for r in sweep.rates]
        if sweep.rates
        else [(c, None) for c in sweep.concurrencies]
    )
    cells = []
    for repeat in range(sweep.repeats):
        for arm in arms:
            for workload in sweep.workloads:
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
    return cells
