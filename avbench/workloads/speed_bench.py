"""SPEED-Bench (``nvidia/SPEED-Bench``, split ``test``).

Not shipped with avbench: its licence forbids it, and the public hub copy masks the rows whose
sources forbid redistribution with a placeholder text. Real prompts come from a directory
prepared by NVIDIA's script (``<dir>/<subset>.jsonl`` with a ``messages`` column, as vLLM's
``SpeedBench`` reads it; or Model-Optimizer's ``<dir>/<subset>/test.parquet`` with ``turns``),
or from the hub for rows that are not masked. A selected placeholder row is an error, never a
prompt: it would measure acceptance on a template instead of the benchmark.

Multi-turn rows hold several consecutive user messages; they become conversations whose turns
the load driver plays one after another with the model's answers in between, as for MT-Bench.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from avbench.errors import WorkloadError
from avbench.inputs.workload import DEFAULT_SUBSET, WorkloadSpec, speed_bench_problem
from avbench.workloads.base import Conversation, WorkloadSource
from avbench.workloads.hub import HubUnavailable, load_hub_rows
from avbench.workloads.loaders import RawWorkload, field_of, read_jsonl, sha256_file

HUB_REPO = "nvidia/SPEED-Bench"
HUB_SPLIT = "test"
PLACEHOLDER_PREFIX = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE"
LICENSE = "NVIDIA Evaluation Dataset License Agreement"


def how_to_prepare(subset: str) -> str:
    return (
        f"get {HUB_REPO} on a machine with HF access and prepare it with NVIDIA's script "
        f"(NeMo-Skills nemo_skills/dataset/speed-bench/prepare.py --config {subset} "
        "--output_dir DIR), then pass DIR as --data-dir or the suite's data_dir"
    )


def _turns(row: dict, where: str) -> tuple[str, ...]:
    """User turns from ``messages`` (prepared jsonl) or ``turns`` (raw hub / parquet)."""
    if row.get("messages") is not None:
        msgs = field_of(row, "messages", where, list)
        turns = []
        for m in msgs:
            if isinstance(m, str):
                turns.append(m)
            elif isinstance(m, dict) and isinstance(m.get("content"), str):
                # Only user turns: the driver produces the assistant side itself.
                if m.get("role", "user") == "user":
                    turns.append(m["content"])
            else:
                raise WorkloadError(
                    f"{where}: field 'messages' should hold {{role, content}} objects or strings"
                )
    else:
        turns = field_of(row, "turns", where, list)
        if not all(isinstance(t, str) for t in turns):
            raise WorkloadError(f"{where}: field 'turns' should be a list of strings")
    if not turns:
        raise WorkloadError(f"{where}: no user message (fields 'messages' / 'turns')")
    return tuple(turns)


def _is_placeholder(turns: tuple[str, ...]) -> bool:
    return any(t.lstrip().startswith(PLACEHOLDER_PREFIX) for t in turns)


@dataclass(frozen=True)
class SpeedBenchLoader:
    dataset: str = "speed-bench"

    def load(self, spec: WorkloadSpec) -> RawWorkload:
        subset = spec.subset or DEFAULT_SUBSET
        problem = speed_bench_problem(subset, spec.category)  # a spec built without validation
        if problem:
            raise WorkloadError(f"workload {spec.name}: {problem}")
        if spec.data_dir is not None:
            rows, source, where = self._from_dir(Path(spec.data_dir), subset)
        else:
            rows, source, where = self._from_hub(spec, subset)

        convs = []
        placeholders = 0
        for i, row in enumerate(rows):
            w = f"{where} row {i}"
            category = field_of(row, "category", w)
            if spec.category is not None and category != spec.category:
                continue
            turns = _turns(row, w)
            placeholders += _is_placeholder(turns)
            qid = field_of(row, "question_id", w, (str, int))
            convs.append(
                Conversation(id=f"speed-bench/{subset}/{qid}", turns=turns, category=category)
            )
        what = f"category '{spec.category}'" if spec.category else "all categories"
        if placeholders:
            raise WorkloadError(
                f"{where}: {placeholders} of {len(convs)} rows ({what}) are placeholders "
                f"('{PLACEHOLDER_PREFIX}...'), not prompts; {how_to_prepare(subset)}"
            )
        if not convs:
            raise WorkloadError(f"{where}: no rows for {what} in SPEED-Bench {subset}")
        source.extra.update(subset=subset, category=spec.category, selected=len(convs))
        return RawWorkload(convs, source)

    def _from_dir(self, data_dir: Path, subset: str) -> tuple[list[dict], WorkloadSource, str]:
        if not data_dir.is_dir():
            raise WorkloadError(
                f"SPEED-Bench data_dir {data_dir} does not exist; {how_to_prepare(subset)}"
            )
        jsonl = data_dir / f"{subset}.jsonl"
        parquet = data_dir / subset / "test.parquet"
        if jsonl.is_file():
            try:
                rows = read_jsonl(jsonl)
            except UnicodeDecodeError as exc:
                raise WorkloadError(
                    f"{jsonl}: not a text JSON Lines file (byte {exc.start} is not UTF-8); "
                    f"{how_to_prepare(subset)}"
                ) from None
            path, fmt = jsonl, "jsonl (messages)"
        elif parquet.is_file():
            import pyarrow.parquet as pq

            try:
                rows = pq.read_table(parquet).to_pylist()
            except Exception as exc:  # pyarrow's errors are varied; the file is what matters
                raise WorkloadError(f"{parquet}: not a readable parquet file ({exc})") from exc
            path, fmt = parquet, "parquet (turns)"
        else:
            raise WorkloadError(
                f"SPEED-Bench data_dir {data_dir} has neither {subset}.jsonl nor "
                f"{subset}/test.parquet; {how_to_prepare(subset)}"
            )
        source = WorkloadSource(
            name=self.dataset,
            origin=f"local:{path}",
            sha256=sha256_file(path),
            rows=len(rows),
            extra={"format": fmt, "license": LICENSE},
        )
        return rows, source, str(path)

    def _from_hub(self, spec: WorkloadSpec, subset: str) -> tuple[list[dict], WorkloadSource, str]:
        try:
            hub = load_hub_rows(HUB_REPO, subset, HUB_SPLIT, spec.hf_revision)
        except HubUnavailable as exc:
            raise WorkloadError(
                f"SPEED-Bench ({HUB_REPO}, subset {subset}) is not available: {exc}; it cannot "
                f"ship with avbench (licence), so either allow hub access or "
                f"{how_to_prepare(subset)}"
            ) from exc
        source = WorkloadSource(
            name=self.dataset,
            origin=f"hf:{hub.repo}@{hub.revision}",
            sha256=hub.sha256,
            rows=len(hub.rows),
            extra={
                "format": "hub (turns)",
                "split": HUB_SPLIT,
                "sha256_of": "rows as canonical JSON lines",
                "license": LICENSE,
            },
        )
        return hub.rows, source, f"hf:{HUB_REPO}/{subset}"


SPEED_BENCH = SpeedBenchLoader()
