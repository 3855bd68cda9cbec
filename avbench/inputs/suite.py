"""Suite files: model pairs, workloads and sweeps, read from TOML into typed models.

Every validation problem becomes one line naming the file, the field and what was expected.
"""

from __future__ import annotations

import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from avbench.assets import derived
from avbench.errors import AvbenchError, SuiteError
from avbench.inputs import checkpoints
from avbench.inputs.request import MAX_SECONDS, SamplingParams, Timeouts
from avbench.inputs.schedule import validate_schedule
from avbench.inputs.workload import WorkloadSpec

# Prefix in pair files that resolves to the package's embedded assets (the tiny pair).
ASSET_PREFIX = "@assets/"
ASSETS_DIR = Path(__file__).parents[1] / "assets"
# Bounds past which a number is a typo (it would otherwise fail inside a cell, after the
# server started): K per draft, GPUs per parallel dimension, concurrency, conversations per
# cell (their records are held in memory; an open-loop cell sends about rate x 1 s), repeats.
MAX_K = 128
MAX_PARALLEL = 4096
MAX_CONCURRENCY = 65_536  # one client reaches one server port from at most ~64k ports
MAX_CELL_REQUESTS = 1_000_000
MAX_REPEATS = 1000


class Pair(BaseModel):
    """A target model and its drafter, with everything needed to serve them."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    description: str = ""
    target: str  # HF id or local dir; "@assets/..." = shipped, "@derived/..." = derived from one
    drafter: str | None = None  # None: the method drafts from inside the target (MTP, DSpark)
    method: str  # vLLM speculative method: draft_model, eagle, mtp, dflash, dspark, ...
    max_k: int = Field(gt=0, le=MAX_K)
    k_values: list[int] | None = None  # static-K arms; default: the sweep's list capped at max_k
    served_model_name: str | None = None
    serve_flags: list[str] = []
    env: dict[str, str] = {}
    av_env: dict[str, str] = {}  # extra env for the AV arm only (e.g. VLLM_USE_V2_MODEL_RUNNER)
    speculative_extra: dict = {}  # merged into --speculative-config for every speculative arm
    tensor_parallel: int = Field(1, gt=0, le=MAX_PARALLEL)
    pipeline_parallel: int = Field(1, gt=0, le=MAX_PARALLEL)
    data_parallel: int = Field(1, gt=0, le=MAX_PARALLEL)
    confidence_head: Literal["auto", "off", "none"] = "none"
    reasoning: bool = False  # model streams thinking; chat_template_kwargs recorded per cell
    chat_template_kwargs: dict | None = None
    default_sweep: str = "default"
    ready_timeout_s: float = Field(900.0, gt=0, le=MAX_SECONDS)
    # Live captures by the avbench vLLM plugin; None: the sweep's settings (avbench/serving/capture.py).
    capture: list[Literal["drafts", "refits", "steps"]] | None = None
    draft_fraction: float | None = Field(None, gt=0, le=1)
    # On vLLM's CPU build, speculative arms sampling at temperature > 0 get avbench's fix of its
    # expand kernel where the build has the bug (docs/cpu-sampler.md); false: the stock sampler.
    cpu_sampler_fix: bool = True
    # CPUs for vLLM's engine core and model worker, its API server and avbench's load driver on
    # the rest (avbench/serving/cpu_layout.py); None: the OS places them.
    engine_cpus: list[Annotated[int, Field(ge=0)]] | None = Field(None, min_length=1)

    @property
    def gpus_per_server(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.name

    def resolve(self, ref: str | None) -> str | None:
        """What vLLM is given for a target or drafter: "@assets/x" becomes the installed
        package's asset directory, "@derived/x" the cached model dir derived from one (derived
        on first use, checked against its recorded hash: ``avbench.assets.derived``), a
        repository sub-folder id its folder in the local Hugging Face snapshot
        (``avbench.inputs.checkpoints``); anything else is left as is."""
        if ref is not None and ref.startswith(derived.PREFIX):
            return str(derived.ensure(ref[len(derived.PREFIX) :]))
        if ref is None or not ref.startswith(ASSET_PREFIX):
            return checkpoints.resolve(ref)
        return str(ASSETS_DIR / ref[len(ASSET_PREFIX) :])

    @field_validator("target", "drafter")
    @classmethod
    def _asset_inside_the_package(cls, v: str | None) -> str | None:
        if v is not None and v.startswith(derived.PREFIX):
            try:  # a known recipe; the model is derived only when resolved
                derived.recipe(v[len(derived.PREFIX) :])
            except AvbenchError as exc:
                raise ValueError(str(exc)) from None
            return v
        if v is None or not v.startswith(ASSET_PREFIX):
            return v
        path = (ASSETS_DIR / v[len(ASSET_PREFIX) :]).resolve()
        if not path.is_relative_to(ASSETS_DIR.resolve()):
            raise ValueError(f"{v!r} points outside avbench's assets directory")
        if not path.is_dir():
            shipped = sorted(
                str(p.parent.relative_to(ASSETS_DIR)) for p in ASSETS_DIR.rglob("config.json")
            )
            raise ValueError(f"{v!r}: no such asset (shipped: {', '.join(shipped)})")
        return v

    @field_validator("k_values")
    @classmethod
    def _positive_ks(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(not 0 < k <= MAX_K for k in v)):
            raise ValueError(f"must be a non-empty list of positive integers up to {MAX_K}")
        return v


SequentialMetric = Literal["output_tok_s", "tpot_ms_median"]


class StoppingRule(BaseModel):
    """A sequential cell (docs/measurement.md): it runs until the 95% interval of each metric is
    within ± ``target`` of its estimate, or a ceiling; the floors come before the first look."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: float = Field(gt=0, lt=1)  # relative half-width, e.g. 0.03
    metrics: tuple[SequentialMetric, ...] = ("output_tok_s", "tpot_ms_median")
    min_requests: int = Field(32, gt=0)  # measured requests
    max_requests: int = Field(4096, gt=0)
    min_time_s: float = Field(0.0, ge=0)  # measured seconds
    max_time_s: float = Field(600.0, gt=0)

    @model_validator(mode="after")
    def _floors_below_ceilings(self) -> StoppingRule:
        if not self.metrics:
            raise ValueError("metrics: name output_tok_s, tpot_ms_median or both")
        if self.min_requests > self.max_requests:
            raise ValueError(
                f"min_requests {self.min_requests} is above max_requests {self.max_requests}"
            )
        if self.min_time_s >= self.max_time_s:
            raise ValueError(
                f"min_time_s {self.min_time_s} is not below max_time_s {self.max_time_s}"
            )
        return self


class Sweep(BaseModel):
    """What to run against each arm: workloads × concurrencies × repeats."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    description: str = ""
    workloads: list[str] = Field(min_length=1)
    concurrencies: list[int] = [1, 2, 4, 8, 16, 32, 64]
    rates: list[float] | None = None  # open-loop req/s instead of concurrencies
    k_values: list[int] = [1, 3, 5, 8]
    arms: list[Literal["baseline", "static", "av", "dyn"]] = ["baseline", "static", "av"]
    # "all": a static arm per K; "max": only at the largest K, where the AV arm runs (its OFF
    # twin): the fair AV comparison at a fraction of the server starts (nightly runs).
    static_k: Literal["all", "max"] = "all"
    # Shared by every speculative arm so static-kK and av-kK differ only in AV (docs/fair-comparisons.md).
    # None: "probabilistic" when the sweep has an AV arm, else vLLM's default.
    draft_sample_method: Literal["greedy", "probabilistic"] | None = None
    # Pinned for the target (--attention-backend) and the drafter, in every arm; None: vLLM picks.
    # A table {pair = backend} pins it per pair (a pair not named: vLLM picks).
    attention_backend: str | dict[str, str] | None = None
    # The dyn arm's num_speculative_tokens_per_batch_size: [[first, last, K], ...] batch sizes.
    schedule: list[tuple[int, int, int]] | None = None
    requests_per_concurrency: int = Field(8, gt=0, le=MAX_CELL_REQUESTS)  # max(rpc × c, min)
    min_requests: int = Field(32, gt=0, le=MAX_CELL_REQUESTS)
    max_requests: int | None = Field(None, gt=0, le=MAX_CELL_REQUESTS)
    warmup: int = Field(4, ge=0, le=MAX_CELL_REQUESTS)  # warmup conversations, outside the window
    repeats: int = Field(1, gt=0, le=MAX_REPEATS)
    # Repeat r runs the workloads rotated by r (the estimator outlives cells: docs/fair-comparisons.md).
    rotate_workloads: bool = False
    # Pairs this sweep is run for by CI (the nightly workflow's matrix reads them).
    pairs: list[str] = []
    # Live captures on every speculative arm (avbench vLLM plugin): labeled drafts of a
    # draft_fraction of the requests, the online estimator's refits, and (every arm, the
    # baseline too) step timings.
    capture: list[Literal["drafts", "refits", "steps"]] = []
    draft_fraction: float = Field(1.0, gt=0, le=1)
    # A cell with a larger share of failed measured requests is a failed cell, not a result.
    max_failed_share: float = Field(0.1, ge=0, lt=1)
    # Sequential cells: each runs until its own numbers are known (None: a fixed request count).
    sequential: StoppingRule | None = None
    sampling: SamplingParams = SamplingParams()
    timeouts: Timeouts = Timeouts()

    @field_validator("concurrencies")
    @classmethod
    def _concurrencies(cls, v: list[int]) -> list[int]:
        if not v or any(not 0 < x <= MAX_CONCURRENCY for x in v):
            raise ValueError(
                f"must be a non-empty list of positive integers up to {MAX_CONCURRENCY}"
            )
        return v

    @field_validator("k_values")
    @classmethod
    def _ks(cls, v: list[int]) -> list[int]:
        if not v or any(not 0 < x <= MAX_K for x in v):
            raise ValueError(f"must be a non-empty list of positive integers up to {MAX_K}")
        return v

    @field_validator("schedule")
    @classmethod
    def _valid_schedule(cls, v: list[tuple[int, int, int]] | None):
        if v is not None:
            validate_schedule(v)
        return v

    @model_validator(mode="after")
    def _consistent_arms(self) -> Sweep:
        if ("dyn" in self.arms) != (self.schedule is not None):
            raise ValueError(
                "a dyn arm needs a schedule and a schedule needs 'dyn' in arms "
                f"(arms {self.arms}, schedule {self.schedule})"
            )
        if self.draft_sample_method == "greedy" and "av" in self.arms:
            raise ValueError(
                "draft_sample_method 'greedy' with an av arm: AV ranks drafts by the drafter's "
                "distribution and needs 'probabilistic'"
            )
        if self.sequential is not None and self.rates is not None:
            raise ValueError(
                "sequential cells need a closed loop (concurrencies): their intervals assume "
                f"a fixed number of requests in flight, and rates {self.rates} were given"
            )
        loads = [max(1, round(r)) for r in self.rates or []] or self.concurrencies
        biggest = self.num_requests(max(loads)) + self.warmup
        if biggest > MAX_CELL_REQUESTS:
            raise ValueError(
                f"a cell would send {biggest} conversations (requests and warmup at the largest "
                f"load), more than {MAX_CELL_REQUESTS}"
            )
        return self

    def attention_backend_for(self, pair: str) -> str | None:
        """The backend pinned for ``pair``'s arms, None when vLLM picks."""
        if isinstance(self.attention_backend, dict):
            return self.attention_backend.get(pair)
        return self.attention_backend

    @property
    def draft_method(self) -> str | None:
        """The draft_sample_method every speculative arm runs with (None: vLLM's default)."""
        if self.draft_sample_method is None and "av" in self.arms:
            return "probabilistic"
        return self.draft_sample_method

    def num_requests(self, concurrency: int) -> int:
        """Measured conversations a cell sends (a sequential cell: at most)."""
        if self.sequential is not None:
            return self.sequential.max_requests
        n = max(self.requests_per_concurrency * concurrency, self.min_requests)
        return min(n, self.max_requests) if self.max_requests else n


class SweepUpdate(BaseModel):
    """What a command line sets over a sweep (`avbench sweep`, `avbench plan`): a field left None
    keeps the sweep's value, and a nested table's given fields replace the sweep's one by one.
    Checked once merged, as one sweep, so an error names the field as the suite file's would."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workloads: list[str] | None = None
    concurrencies: list[int] | None = None  # given: a closed loop, the sweep's rates step aside
    rates: list[float] | None = None
    k_values: list[int] | None = None
    arms: list[str] | None = None
    warmup: int | None = None
    min_requests: int | None = None
    requests_per_concurrency: int | None = None
    capture: list[str] | None = None
    draft_fraction: float | None = None
    # --schedule-from: the dyn arm's schedule and the drafting the static arms it comes from ran
    schedule: list[tuple[int, int, int]] | None = None
    draft_sample_method: str | None = None
    attention_backend: str | dict[str, str] | None = None
    sequential: dict[str, float | int] = {}
    sampling: dict[str, float | int | bool] = {}
    timeouts: dict[str, float] = {}

    def over(self, data: dict[str, Any]) -> dict[str, Any]:
        """A sweep's fields (a suite's sweep dumped, or a new one's) with this update over them."""
        out = dict(data)
        for nested in ("sampling", "timeouts"):
            out[nested] = (out.get(nested) or {}) | getattr(self, nested)
        out["sequential"] = merge_sequential(out.get("sequential"), self.sequential)
        if self.concurrencies:
            out["rates"] = None
        nested_fields = ("sampling", "timeouts", "sequential")
        return out | {k: v for k, v in self if k not in nested_fields and v is not None}


def merge_sequential(stored: dict | None, given: dict | None) -> dict | None:
    """The sweep file's sequential setting with the command line's fields over it."""
    if not given:
        return stored
    if stored is None and "target" not in given:
        raise AvbenchError(
            "--cell-min-requests/--cell-max-requests/--cell-min-time/--cell-max-time bound "
            "sequential cells: give --target-half-width too (or a sweep with a `sequential` table)"
        )
    return (stored or {}) | given


class Suite(BaseModel):
    """Everything defined in one suites directory."""

    pairs: dict[str, Pair]
    workloads: dict[str, WorkloadSpec]
    sweeps: dict[str, Sweep]
    root: Path

    def pair(self, name: str) -> Pair:
        return _lookup(self.pairs, name, "pair", self.root / "pairs.toml")

    def workload(self, name: str) -> WorkloadSpec:
        return _lookup(self.workloads, name, "workload", self.root / "workloads.toml")

    def sweep(self, name: str) -> Sweep:
        sweep = _lookup(self.sweeps, name, "sweep", self.root / "sweeps.toml")
        for w in sweep.workloads:
            if w not in self.workloads:
                raise SuiteError(
                    f"{self.root / 'sweeps.toml'}: sweeps.{name}.workloads: unknown workload "
                    f"{w!r} (defined: {', '.join(sorted(self.workloads))})"
                )
        return sweep


def _lookup(table: dict, name: str, kind: str, path: Path):
    if name not in table:
        known = ", ".join(sorted(table)) or "none"
        raise SuiteError(f"unknown {kind} {name!r} (defined in {path}: {known})")
    return table[name]


def default_suites_dir() -> Path:
    """Where suite files are read from without ``--suites``: ``$AVBENCH_SUITES``, else
    ``./suites`` when it holds a pairs.toml, else the suites shipped inside the package."""
    env = os.environ.get("AVBENCH_SUITES")
    if env:
        return Path(env)
    cwd = Path.cwd() / "suites"
    if (cwd / "pairs.toml").exists():
        return cwd
    # A wheel installs avbench as plain files, so the package's resources are a directory.
    return Path(str(resources.files("avbench") / "suites"))


def _read_toml(path: Path) -> dict:
    if not path.exists():
        raise SuiteError(f"{path}: suite file not found")
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise SuiteError(
            f"{path}: not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); "
            "suite files are TOML, which is UTF-8"
        ) from None
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read ({exc.strerror})") from None


def _format_validation(path: Path, prefix: str, exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in (prefix, *err["loc"]))
    got = err.get("input")
    got_s = "" if isinstance(got, dict) else f" (got {got!r})"
    more = f" [+{len(exc.errors()) - 1} more]" if len(exc.errors()) > 1 else ""
    return f"{path}: {loc}: {err['msg'].removeprefix('Value error, ')}{got_s}{more}"


def _parse_table(path: Path, data: dict, key: str, model: type[BaseModel]) -> dict:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise SuiteError(f"{path}: {key}: expected a table of named entries")
    out = {}
    for name, body in table.items():
        if not isinstance(body, dict):
            raise SuiteError(f"{path}: {key}.{name}: expected a table, got {type(body).__name__}")
        try:
            out[name] = model.model_validate({"name": name, **body})
        except ValidationError as exc:
            raise SuiteError(_format_validation(path, f"{key}.{name}", exc)) from None
    unknown = set(data) - {key}
    if unknown:
        raise SuiteError(
            f"{path}: unknown top-level key(s) {sorted(unknown)}; expected [{key}.<name>]"
        )
    return out


def load_suite(root: Path | None = None) -> Suite:
    root = Path(root) if root else default_suites_dir()
    pairs = _parse_table(root / "pairs.toml", _read_toml(root / "pairs.toml"), "pairs", Pair)
    workloads = _parse_table(
        root / "workloads.toml", _read_toml(root / "workloads.toml"), "workloads", WorkloadSpec
    )
    sweeps = _parse_table(root / "sweeps.toml", _read_toml(root / "sweeps.toml"), "sweeps", Sweep)
    for p in pairs.values():
        if p.default_sweep not in sweeps:
            raise SuiteError(
                f"{root / 'pairs.toml'}: pairs.{p.name}.default_sweep: unknown sweep "
                f"{p.default_sweep!r} (defined: {', '.join(sorted(sweeps))})"
            )
    for s in sweeps.values():
        pinned = s.attention_backend if isinstance(s.attention_backend, dict) else {}
        for field, names in (("pairs", s.pairs), ("attention_backend", pinned)):
            for name in names:
                if name not in pairs:
                    raise SuiteError(
                        f"{root / 'sweeps.toml'}: sweeps.{s.name}.{field}: unknown pair "
                        f"{name!r} (defined: {', '.join(sorted(pairs))})"
                    )
    return Suite(pairs=pairs, workloads=workloads, sweeps=sweeps, root=root)
