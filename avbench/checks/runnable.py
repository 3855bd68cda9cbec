"""Which arms this vLLM can run, asked before anything starts (`avbench plan`): each arm's
server command and, for an arm it cannot run, why: its support checks and, for AV, vLLM's own
start-up checks (none loads a model: ``avbench.checks.av_start``)."""

from __future__ import annotations

from dataclasses import dataclass

from avbench.checks.av_start import av_start_checks
from avbench.errors import AvbenchError, UnsupportedArm
from avbench.inputs.suite import Pair, Sweep
from avbench.plan.cells import Arm
from avbench.serving.server import build_command, check_arm_supported, probe_vllm


@dataclass(frozen=True)
class ArmCommands:
    commands: dict[str, list[str] | None]  # arm -> its server's argv (port 8000 stands in)
    unsupported: dict[str, str]  # arm -> why this vLLM cannot run it


def arm_commands(pair: Pair, sweep: Sweep, arms: list[str], python: str) -> ArmCommands:
    """Each arm's command; where no vLLM answers at ``python``, every arm counts as runnable."""
    try:
        install = probe_vllm(python)
    except AvbenchError:
        install = None
    commands: dict[str, list[str] | None] = {}
    unsupported: dict[str, str] = {}
    av: list[Arm] = []
    for name in arms:
        arm = Arm.parse(name)
        commands[name] = build_command(pair, arm, port=8000, python=python, sweep=sweep)
        if install is not None and install.distribution is not None:
            try:
                check_arm_supported(pair, arm, install)
                av += [arm] if arm.kind == "av" else []
            except UnsupportedArm as exc:
                unsupported[name] = str(exc)
    if av and install is not None:
        vllm = f"{install.distribution} {install.version}"
        unsupported |= _refused_at_start(pair, sweep, av, python, vllm)
    return ArmCommands(commands, unsupported)


def _refused_at_start(
    pair: Pair, sweep: Sweep, av: list[Arm], python: str, vllm: str
) -> dict[str, str]:
    """AV arms this vLLM would refuse at start: arm -> reason. Checks that cannot run say
    nothing."""
    try:
        found = av_start_checks([(pair, arm, sweep) for arm in av], python)
    except AvbenchError:
        return {}
    return {r.arm: reason for r in found if (reason := r.reason(vllm)) is not None}
