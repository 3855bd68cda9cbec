"""Attach mode without suite files: the pair and sweep of ``avbench sweep --endpoint URL``.

Everything a suite file would say comes from the command line: the model (checked against the
server's ``/v1/models`` before any request), the arm label, the workloads (built-in ones, or a
suite's when ``--suites`` is given), loads, request counts and sampling. The objects built are
the same typed ``Pair`` and ``Sweep`` a suite file produces, validated the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from avbench.errors import AvbenchError
from avbench.inputs.checks import validation_error
from avbench.inputs.suite import Pair, Sweep, SweepUpdate
from avbench.inputs.workload import WorkloadSpec
from avbench.plan.cells import Arm

ATTACHED_PAIR = "attached"


@dataclass(frozen=True)
class Lengths:
    """--input-len / --output-len / --len-range for the selected synthetic workloads."""

    input_len: int | None = None
    output_len: int | None = None
    len_range: float | None = None

    def given(self) -> dict:
        return {k: v for k, v in vars(self).items() if v is not None}


def apply_lengths(
    workloads: dict[str, WorkloadSpec], selected: list[str], lengths: Lengths
) -> dict[str, WorkloadSpec]:
    """The synthetic workloads among ``selected`` with the given lengths; an error when lengths
    are given but no selected workload is synthetic."""
    given = lengths.given()
    if not given:
        return workloads
    synthetic = [w for w in selected if w in workloads and workloads[w].dataset == "synthetic"]
    if not synthetic:
        raise AvbenchError(
            "--input-len/--output-len/--len-range: set the lengths of a synthetic workload; "
            f"none selected (--workload {','.join(selected)}); try --workload synthetic"
        )
    out = dict(workloads)
    for name in synthetic:
        try:
            out[name] = WorkloadSpec.model_validate(workloads[name].model_dump() | given)
        except ValidationError as exc:
            raise validation_error(exc, "command-line override") from None
    return out


@dataclass(frozen=True)
class AttachedServer:
    """The running server an attached sweep measures, as the command line names it.

    ``model``: the served model to ask for (None: the one /v1/models lists). ``arm``: the label
    of what the server runs (None: baseline). ``tokenizer``: a local tokenizer directory for
    synthetic prompts (None: the server's /tokenize).
    """

    endpoint: str
    model: str | None = None
    arm: str | None = None
    tokenizer: Path | None = None


def attached_setup(
    server: AttachedServer,
    *,
    update: SweepUpdate,
    workloads: dict[str, WorkloadSpec],
    lengths: Lengths,
) -> tuple[Pair, Sweep, dict[str, WorkloadSpec]]:
    """An in-memory pair and sweep for one attached arm (no suite file)."""
    try:
        parsed = Arm.parse(server.arm or "baseline")
    except ValueError as exc:
        raise AvbenchError(f"--arm: {exc}") from None
    tokenizer, model = server.tokenizer, server.model
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise AvbenchError(f"--tokenizer {tokenizer}: not a directory (a local tokenizer dir)")
    pair = Pair(
        name=ATTACHED_PAIR,
        description=f"server at {server.endpoint}",
        target=str(tokenizer) if tokenizer is not None else (model or "served model"),
        method="unknown",
        max_k=max(parsed.k, 1),
        served_model_name=model,
    )
    data = update.over({"name": "attached", "workloads": ["synthetic"], "arms": [parsed.kind]})
    try:
        sweep = Sweep.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, "command-line option") from None
    unknown = [w for w in sweep.workloads if w not in workloads]
    if unknown:
        raise AvbenchError(
            f"--workload: unknown workload {', '.join(unknown)} (known: "
            f"{', '.join(sorted(workloads))})"
        )
    return pair, sweep, apply_lengths(workloads, sweep.workloads, lengths)
