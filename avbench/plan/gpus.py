"""The GPUs of one host shared by a sweep's arms: which arms' servers run at once, and on which
GPUs.

A server of a pair takes TP × PP × DP GPUs (``Pair.gpus_per_server``). Given the host's GPUs
(``--gpus``, default every visible one), the arm sessions (one arm's cells of one repeat, in
plan order) are grouped into waves: the sessions of a wave run at the same time, each on its
own disjoint GPUs; a wave starts when the one before it has finished. An arm to be measured in
isolation gets a wave of its own, and one arm never runs twice at once (its server log and
captures live in one directory). With fewer GPUs than two servers need, every wave holds one
session: the sequential sweep.

Pure: the inventory is given (``visible_gpus`` reads this host's), nothing is started here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from avbench.errors import AvbenchError

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
MAX_GPU_ID = 4095  # past it an id is a typo


class GpuError(AvbenchError):
    """A GPU list that cannot be read, or too few GPUs for one server."""


@dataclass(frozen=True)
class GpuSet:
    """GPU ids of one host, as CUDA_VISIBLE_DEVICES numbers them (in the given order)."""

    ids: tuple[int, ...] = ()

    @staticmethod
    def parse(text: str, option: str = "--gpus") -> GpuSet:
        """``"0-7"``, ``"0,2,5"``, ``"0-3,6"``; each id once."""
        ids: list[int] = []
        for part in text.split(","):
            m = _RANGE.fullmatch(part.strip())
            if m is None:
                raise GpuError(f"{option} {text!r}: expected GPU ids and ranges, e.g. 0-7 or 0,2,5")
            lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
            if hi < lo or hi > MAX_GPU_ID:
                raise GpuError(
                    f"{option} {text!r}: range {part.strip()} is not low-high up to {MAX_GPU_ID}"
                )
            ids += range(lo, hi + 1)
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise GpuError(f"{option} {text!r}: GPU {', '.join(map(str, twice))} given twice")
        return GpuSet(tuple(ids))

    def __len__(self) -> int:
        return len(self.ids)

    def cuda_visible_devices(self) -> str:
        return ",".join(map(str, self.ids))


def visible_gpus(env: Mapping[str, str] | None = None) -> GpuSet:
    """This host's GPUs a server started from here may use: CUDA_VISIBLE_DEVICES when set (as
    ids), else every GPU nvidia-smi lists (none on a machine without it)."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        if not visible.strip():
            return GpuSet()
        return GpuSet.parse(visible, "CUDA_VISIBLE_DEVICES (pass --gpus with GPU ids)")
    if shutil.which("nvidia-smi") is None:
        return GpuSet()
    try:
        res = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return GpuSet()
    listed = [line for line in res.stdout.splitlines() if line.startswith("GPU ")]
    return GpuSet(tuple(range(len(listed)))) if res.returncode == 0 else GpuSet()


@dataclass(frozen=True)
class Session:
    """One arm's cells of one repeat, as the planner sees them."""

    arm: str
    repeat: int
    gpus: int  # per server: TP × PP × DP
    isolate: bool = False  # measured with no other arm on the host


@dataclass(frozen=True)
class Placement:
    """A session and the GPUs its server gets; empty ``gpus``: the server sees what avbench
    sees (no GPU list to split: a CPU host, or fewer GPUs than one server takes)."""

    session: Session
    gpus: GpuSet


@dataclass(frozen=True)
class Wave:
    """Sessions that run at the same time, on disjoint GPUs."""

    placements: tuple[Placement, ...]

    def co_tenants(self, placement: Placement) -> list[str]:
        return [p.session.arm for p in self.placements if p is not placement]


def plan_waves(sessions: Sequence[Session], inventory: GpuSet) -> list[Wave]:
    """The sessions in plan order, grouped into waves that fit ``inventory``. A session fills
    the current wave when its GPUs are free there, its arm is not in it and neither it nor the
    wave is isolated; else it opens the next wave. Each server gets the lowest free GPUs."""
    waves: list[list[Placement]] = []
    free: list[int] = []
    for s in sessions:
        if len(inventory) < s.gpus:  # nothing to split: one at a time, unpinned (as before)
            waves.append([Placement(s, GpuSet())])
            free = []
            continue
        current = waves[-1] if waves else []
        fits = (
            bool(current)
            and len(free) >= s.gpus
            and not s.isolate
            and not any(p.session.isolate or p.session.arm == s.arm for p in current)
        )
        if not fits:
            current, free = [], list(inventory.ids)
            waves.append(current)
        current.append(Placement(s, GpuSet(tuple(free[: s.gpus]))))
        free = free[s.gpus :]
    return [Wave(tuple(w)) for w in waves]


def check_inventory(inventory: GpuSet, need: int, why: str) -> None:
    """A --gpus given by hand holds at least one server (``why``: whose, e.g. the pair's shape)."""
    if len(inventory) < need:
        raise GpuError(
            f"--gpus {inventory.cuda_visible_devices() or '(none)'}: {why} needs {need} GPUs per "
            f"server, got {len(inventory)}"
        )
