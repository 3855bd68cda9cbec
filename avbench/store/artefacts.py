"""The run manifest (``results/<run>/manifest.json``) as models: what a run is, read back by
resume, report, compare, merge, the nightly and the estimators.

``RunManifest`` is one of two halves, told apart by ``mode``: a sweep (``managed``: avbench
launched the servers; ``attach``: it measured someone else's) or a merged run (``merged``, made
by ``avbench merge`` from several runs). ``schema_version`` is 1 for manifests written since
these models; a manifest without it was written before them (version 0, the same keys) and
reads the same way.

Unknown keys are kept (``extra="allow"``) and written back unchanged: a manifest from a newer
avbench still opens, and updating it mid-run loses nothing. The pair, sweep and workloads stay
the JSON the suite models wrote (a merged run of several pairs has only a pair name); resume
validates them into ``Pair``/``Sweep``/``WorkloadSpec`` (``SweepInputs``), the rest read keys.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from avbench.inputs.suite import Pair, Sweep
from avbench.inputs.workload import WorkloadSpec
from avbench.plan.cells import Arm, Cell

SCHEMA_VERSION = 1

RunStatus = Literal[
    "running", "interrupted", "failed", "finished", "finished_with_failures", "merged"
]
_CELL_FIELDS = frozenset(f.name for f in dataclasses.fields(Cell))


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


def _cell_fields(value: object) -> object:
    """A stored plan entry is a cell plus its id; a key a cell does not have is refused
    because --resume would rerun a different cell than the one planned."""
    if not isinstance(value, dict):
        return value
    fields = {k: v for k, v in value.items() if k != "cell_id"}
    unknown = sorted(set(fields) - _CELL_FIELDS)
    if unknown:
        raise ValueError(f"a plan cell has no key(s) {', '.join(map(repr, unknown))}")
    return fields


def _cell_dict(cell: Cell) -> dict[str, Any]:
    return cell.to_dict()


PlanCell = Annotated[Cell, BeforeValidator(_cell_fields), PlainSerializer(_cell_dict)]


class ArmCapture(_Open):
    kinds: list[str] = []
    draft_fraction: float | None = None


class CpuLayoutEntry(_Open):
    """The CPUs an arm's server processes were pinned to (pair setting ``engine_cpus``,
    avbench/serving/cpu_layout.py): the engine core and model worker(s), and the rest (the API
    server and avbench's load driver)."""

    engine_cpus: list[int]
    rest_cpus: list[int]
    engine_processes: int  # how many engine processes were pinned


class ArmEntry(_Open):
    """One arm of the run: how its server was started (launched) or where it was (attached)."""

    name: str
    kind: str
    k: int = 0
    command: list[str] | None = None  # repeat r's server adds --seed r (seed_flags)
    env: dict[str, str] | None = None
    capture: ArmCapture | None = None
    supported: bool | None = None
    unsupported_reason: str | None = None
    endpoint: str | None = None
    engine: dict[str, str | None] | None = None  # what its server chose (serving/server_log.py)
    cpu_layout: CpuLayoutEntry | None = None  # None: its processes were left to the OS


class PlacementEntry(_Open):
    """Where and when one arm session (an arm's cells of one repeat) ran: its host, its GPUs
    and its span, so the arms sharing a host at the same time can be told
    (``SweepManifest.co_tenants``). The GPUs are the ids its server's CUDA_VISIBLE_DEVICES
    named (on a Ray node, the ids Ray assigned there)."""

    arm: str = Field(description="the arm whose server ran")
    repeat: int = Field(description="the repeat of the plan the session ran")
    cells: list[str] = Field(description="ids of the cells the session was to run")
    host: str = Field(description="hostname of the machine its server ran on")
    gpus: list[int] = Field(
        default=[], description="GPU ids given to its server; empty: not pinned (all visible)"
    )
    started_at: str = Field(description="UTC time the session started (microseconds)")
    ended_at: str | None = Field(
        default=None, description="UTC time it ended; None: still running, or its process lost"
    )
    backend: Literal["local", "process", "ray"] = Field(
        default="local",
        description="local: in avbench's process; process: its own process beside others "
        "(--gpus); ray: a Ray task",
    )

    def overlaps(self, other: PlacementEntry) -> bool:
        """Both on one host at one time (a session with no end overlaps all that follow)."""
        never = "9999"
        return (
            self.host == other.host
            and self.started_at < (other.ended_at or never)
            and other.started_at < (self.ended_at or never)
        )


class MergedArmEntry(ArmEntry):
    pair: str | None = None  # the source run's pair


class Versions(_Open):
    avbench: str | None = None
    vllm: str | None = None
    python: str | None = None


class Host(_Open):
    hostname: str | None = None
    platform: str | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    gpus: list[str] = []
    python: str | None = None


class Provenance(_Open):
    """How the run's numbers were timed (docs/measurement.md)."""

    transport: str | None = None
    event_loop: str | None = None
    timestamp_source: str | None = None
    avbench_version: str | None = None
    avbench_commit: str | None = None


class Counts(_Open):
    measured: int = 0
    failed: int = 0
    unsupported: int = 0
    already_done: int = 0


class DataSource(_Open):
    name: str | None = None
    origin: str | None = None
    rows: int | None = None
    sha256: str | None = None
    extra: dict[str, Any] = {}


class WorkloadSource(_Open):
    """What a workload's prompts were (workloads/registry.py LoadedWorkload.manifest)."""

    spec: dict[str, Any] = {}
    source: DataSource = DataSource()
    conversations: int | None = None
    dropped_over_input_cap: int | None = None
    token_counter: str | None = None
    order: str | None = None
    prompts_sha256: str | None = None


class _Common(_Open):
    schema_version: int = 0
    run_id: str | None = None
    status: RunStatus | None = None
    pair: dict[str, Any] = {}
    sweep: dict[str, Any] = {}
    versions: Versions | None = None
    started_at: str | None = None
    ended_at: str | None = None

    @property
    def pair_name(self) -> str:
        return str(self.pair.get("name", "?"))

    @property
    def wall_s(self) -> float | None:
        """Seconds from the run's start to its end; None unless both were recorded."""
        if not self.started_at or not self.ended_at:
            return None
        start, end = datetime.fromisoformat(self.started_at), datetime.fromisoformat(self.ended_at)
        return (end - start).total_seconds()


class SweepManifest(_Common):
    """A sweep: its inputs, its plan, its arms, and where and how it ran."""

    mode: Literal["managed", "attach"] = "managed"
    endpoint: str | None = None
    served_model: str | None = None  # attach: the model checked on /v1/models
    workloads: dict[str, dict[str, Any]] = {}
    arms: list[ArmEntry] = []
    plan: list[PlanCell] = []
    gpus_per_server: int | None = None
    host: Host | None = None
    git_commit: str | None = None
    provenance: Provenance | None = None
    command: str | None = None
    resumed_at: str | None = None
    error: str | None = None
    counts: Counts | None = None
    workload_sources: dict[str, WorkloadSource] = {}
    placements: list[PlacementEntry] = []  # each arm session, as it started (--gpus, --ray)

    def arm(self, name: str) -> ArmEntry | None:
        return next((a for a in self.arms if a.name == name), None)

    def co_tenants(self) -> dict[str, list[str]]:
        """Cell id -> the other arms whose servers ran on its host while its session ran
        (none for a cell measured alone). A cell run again (--resume) is judged by its last
        session."""
        out: dict[str, list[str]] = {}
        for p in self.placements:
            others = sorted({o.arm for o in self.placements if o is not p and o.overlaps(p)})
            for cell in p.cells:
                out[cell] = others
        return out


class MergedManifest(_Common):
    """Several runs as one: their arms (each with its pair) and each source's manifest."""

    mode: Literal["merged"]
    merged_from: list[str] = []
    merged_at: str | None = None
    pairs: list[str] = []
    arms: list[MergedArmEntry] = []
    sources: dict[str, RunManifest] = {}


def _mode(value: Any) -> str:
    """The tag of a manifest; one without ``mode`` (hand-written, or older than the key)
    describes a sweep."""
    raw = value.get("mode", "managed") if isinstance(value, dict) else value.mode
    return _MERGED if raw == "merged" else _SWEEP


_SWEEP, _MERGED = "sweep-run", "merged-run"  # never a field name: dropped from error paths
RunManifest = Annotated[
    Annotated[SweepManifest, Tag(_SWEEP)] | Annotated[MergedManifest, Tag(_MERGED)],
    Discriminator(_mode),
]
MergedManifest.model_rebuild()
MANIFEST = TypeAdapter[SweepManifest | MergedManifest](RunManifest)

ADAPTIVE = "adaptive.json"  # an adaptive sweep's rounds (avbench/run/adaptive.py)


class AdaptiveStandingEntry(_Open):
    """One concurrency's standing after a round (analysis/adaptive.py's Standing, described)."""

    concurrency: int
    verdict: str
    state: str
    winner: str | None = None
    margin: float | None = None
    contenders: list[str] = []
    predicted: list[str] = []  # which of the winner and contenders are predictions
    rests_on_prediction: bool = False
    cell_noise: float | None = None  # one measured cell's half-width the standing used


class AdaptiveRound(_Open):
    round: int
    cells: list[str] = []  # the cells it measured (round 0: the first plan)
    seconds: float = 0.0  # server-seconds it took
    standings: list[AdaptiveStandingEntry] = []  # as the round found them (none for round 0)


class AdaptiveCompletion(_Open):
    """The requested sweep's cells the rounds left out, measured on request (``--complete``):
    with them every cell of the fixed protocol is measured, and its verdicts stand beside the
    rounds' on shared measurements."""

    cells: list[str] = []
    seconds: float = 0.0
    standings: list[AdaptiveStandingEntry] = []  # every cell measured (none until it ends)


class AdaptiveRecord(_Open):
    """``adaptive.json``: the policy, the full sweep the rounds draw cells from, the rounds."""

    policy: dict[str, Any]
    sweep: dict[str, Any]
    rounds: list[AdaptiveRound] = []
    status: Literal["running", "decided", "inside noise", "budget", "failed"] = "running"
    server_seconds: float = 0.0  # the rounds' (a completion's are its own)
    completion: AdaptiveCompletion | None = None


def source_manifest(manifest: RunManifest, run_id: str | None) -> RunManifest:
    """The manifest a row of this run came from: its source's in a merged run, else the run's."""
    if run_id and isinstance(manifest, MergedManifest):
        return manifest.sources.get(run_id, manifest)
    return manifest


def dump_manifest(manifest: RunManifest) -> dict[str, Any]:
    """The manifest as stored: the keys it was given (an old run keeps its shape)."""
    dumped: dict[str, Any] = MANIFEST.dump_python(manifest, mode="json", exclude_unset=True)
    return dumped


class SweepInputs(BaseModel):
    """What --resume needs from a sweep's manifest, validated into the suite's models."""

    model_config = ConfigDict(extra="ignore")

    pair: Pair
    sweep: Sweep
    workloads: dict[str, WorkloadSpec]
    plan: list[PlanCell]
    arms: list[ArmEntry]
    run_id: str
    endpoint: str | None = None
    gpus_per_server: int | None = None
    attach_arm: Arm | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _attached_arm(self) -> SweepInputs:
        """Attached, the run's one arm is the arm the server runs."""
        if self.endpoint and self.arms:
            self.attach_arm = Arm(self.arms[0].kind, self.arms[0].k)  # type: ignore[arg-type]
        return self


def manifest_problem(exc: ValidationError) -> str:
    """The first bad field of a manifest, in one line."""
    err = exc.errors()[0]
    loc = [str(x) for x in err["loc"]]
    what = "a merged-run manifest" if loc[:1] == [_MERGED] else "a sweep manifest"
    field = ".".join(x for x in loc if x not in (_SWEEP, _MERGED))
    if err["type"] == "missing":
        return f"not {what} (no {field!r} key)"
    return f"not {what} ({field or 'manifest'}: {err['msg']})"
