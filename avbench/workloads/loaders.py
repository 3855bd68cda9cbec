"""Loaders for the four prompt sets shipped inside the package (GSM8K, HumanEval, MT-Bench,
Spec-Bench).

Every loader has the same small interface: ``load(spec) -> RawWorkload``, the conversations in
source order plus where they came from. Shuffling, the input cap and ``limit`` are applied once,
for every dataset alike, in :mod:`avbench.workloads.registry`.

Where prompts come from, in order:
1. ``spec.data_dir`` — a directory holding the same file name as the vendored copy;
2. the hub, only when the spec pins ``hf_revision`` (falls back to the vendored copy, recorded
   in the source, when offline or unreachable);
3. the vendored copy under ``avbench/workloads/data/`` (the default: offline, byte-identical to
   upstream, see each SOURCE.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from avbench.errors import WorkloadError
from avbench.inputs.workload import WorkloadSpec
from avbench.workloads.base import Conversation, WorkloadSource
from avbench.workloads.hub import HubUnavailable, load_hub_rows

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).parent / "data"

# HumanEval prompts are a function signature and docstring meant for raw completion. Sent to a
# chat endpoint they are wrapped in one instruction; this is the exact user message (the prompt
# is inserted with its trailing newline removed).
HUMANEVAL_TEMPLATE = "Complete the following Python function.\n\n```python\n{prompt}\n```"


@dataclass(frozen=True)
class RawWorkload:
    """Conversations in source order (before shuffle, cap and limit) and their provenance."""

    conversations: list[Conversation]
    source: WorkloadSource


class Loader(Protocol):
    @property
    def dataset(self) -> str: ...  # read-only: the loaders are frozen dataclasses

    def load(self, spec: WorkloadSpec) -> RawWorkload: ...


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise WorkloadError(f"{path}:{lineno}: expected a JSON object per line")
            rows.append(row)
    return rows


def field_of(row: dict, key: str, where: str, kind: type | tuple[type, ...] = str) -> Any:
    """``row[key]``, or a one-line error naming the row and the expected field."""
    if key not in row or row[key] is None:
        raise WorkloadError(f"{where}: missing field '{key}'")
    value = row[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise WorkloadError(f"{where}: field '{key}' should be {names}, got {type(value).__name__}")
    return value


def turns_of(row: dict, where: str, keys: tuple[str, ...] = ("turns", "prompt")) -> tuple[str, ...]:
    """The list of user turns under the first present key (FastChat: turns; some hub copies:
    prompt)."""
    key = next((k for k in keys if row.get(k) is not None), keys[0])
    turns = field_of(row, key, where, (list, tuple))
    if not turns or not all(isinstance(t, str) for t in turns):
        raise WorkloadError(f"{where}: field '{key}' should be a non-empty list of strings")
    return tuple(turns)


def _reference(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list | tuple):
        parts = [str(v) for v in value if v]
        return "\n\n".join(parts) if parts else None
    return str(value) or None


# --- row → conversation, one function per dataset ------------------------------------------


def gsm8k_rows(rows: list[dict], where: str) -> list[Conversation]:
    return [
        Conversation(
            id=f"gsm8k/{i}",
            turns=(field_of(row, "question", f"{where} row {i}"),),
            reference=_reference(row.get("answer")),
        )
        for i, row in enumerate(rows)
    ]


def humaneval_rows(rows: list[dict], where: str) -> list[Conversation]:
    out = []
    for i, row in enumerate(rows):
        w = f"{where} row {i}"
        task = field_of(row, "task_id", w)
        prompt = field_of(row, "prompt", w)
        out.append(
            Conversation(
                id=f"humaneval/{task.rsplit('/', 1)[-1]}",
                turns=(HUMANEVAL_TEMPLATE.format(prompt=prompt.rstrip("\n")),),
                reference=_reference(row.get("canonical_solution")),
            )
        )
    return out


def _question_rows(dataset: str) -> Callable[[list[dict], str], list[Conversation]]:
    """MT-Bench and Spec-Bench share FastChat's schema: question_id, category, turns."""

    def convert(rows: list[dict], where: str) -> list[Conversation]:
        out = []
        for i, row in enumerate(rows):
            w = f"{where} row {i}"
            qid = field_of(row, "question_id", w, (int, str))
            out.append(
                Conversation(
                    id=f"{dataset}/{qid}",
                    turns=turns_of(row, w),
                    category=str(row.get("category") or ""),
                    reference=_reference(row.get("reference")),
                )
            )
        return out

    return convert


@dataclass(frozen=True)
class VendoredLoader:
    dataset: str
    dirname: str  # under avbench/workloads/data/
    filename: str
    convert: Callable[[list[dict], str], list[Conversation]]
    upstream: str  # where the vendored file was copied from (see its SOURCE.md)
    license: str
    hub_repo: str | None = None
    hub_config: str | None = None
    hub_split: str = "test"
    extra: dict = field(default_factory=dict)

    @property
    def vendored_path(self) -> Path:
        return DATA_DIR / self.dirname / self.filename

    def load(self, spec: WorkloadSpec) -> RawWorkload:
        if spec.data_dir is not None:
            path = Path(spec.data_dir) / self.filename
            if not path.is_file():
                raise WorkloadError(
                    f"workload {spec.name}: data_dir {spec.data_dir} has no {self.filename} "
                    f"(expected the {self.dataset} file; omit data_dir to use the copy shipped "
                    "with avbench)"
                )
            return self._from_file(path, f"local:{path}", vendored=False)
        fallback = None
        if spec.hf_revision is not None:
            if self.hub_repo is None:
                raise WorkloadError(
                    f"workload {spec.name}: hf_revision is set but {self.dataset} has no hub "
                    "copy; drop hf_revision (the upstream file ships with avbench) or use data_dir"
                )
            try:
                return self._from_hub(spec.hf_revision)
            except HubUnavailable as exc:
                fallback = str(exc)
                log.warning(
                    "%s: %s; using the copy shipped with avbench instead", spec.name, fallback
                )
        raw = self._from_file(
            self.vendored_path,
            f"local:avbench/workloads/data/{self.dirname}/{self.filename}",
            vendored=True,
        )
        if fallback is not None:
            raw.source.extra["hub_requested"] = f"hf:{self.hub_repo}@{spec.hf_revision}"
            raw.source.extra["hub_fallback_reason"] = fallback
        return raw

    def _from_file(self, path: Path, origin: str, vendored: bool) -> RawWorkload:
        rows = read_jsonl(path)
        convs = self.convert(rows, str(path.name if vendored else path))
        extra: dict = {"format": "jsonl", **self.extra}
        if vendored:
            extra.update(vendored=True, upstream=self.upstream, license=self.license)
        source = WorkloadSource(
            name=self.dataset, origin=origin, sha256=sha256_file(path), rows=len(rows), extra=extra
        )
        return RawWorkload(convs, source)

    def _from_hub(self, revision: str) -> RawWorkload:
        hub = load_hub_rows(self.hub_repo or "", self.hub_config, self.hub_split, revision)
        convs = self.convert(hub.rows, f"hf:{hub.repo}")
        source = WorkloadSource(
            name=self.dataset,
            origin=f"hf:{hub.repo}@{hub.revision}",
            sha256=hub.sha256,
            rows=len(hub.rows),
            extra={"sha256_of": "rows as canonical JSON lines", "split": self.hub_split},
        )
        return RawWorkload(convs, source)


GSM8K = VendoredLoader(
    dataset="gsm8k",
    dirname="gsm8k",
    filename="test.jsonl",
    convert=gsm8k_rows,
    upstream="github:openai/grade-school-math@3101c7d5072418e28b9008a6636bde82a006892c"
    ":grade_school_math/data/test.jsonl",
    license="MIT",
    hub_repo="openai/gsm8k",
    hub_config="main",
)
HUMANEVAL = VendoredLoader(
    dataset="humaneval",
    dirname="humaneval",
    filename="HumanEval.jsonl",
    convert=humaneval_rows,
    upstream="github:openai/human-eval@6d43fb980f9fee3c892a914eda09951f772ad10d"
    ":data/HumanEval.jsonl.gz (decompressed)",
    license="MIT",
    hub_repo="openai/openai_humaneval",
    extra={"prompt_template": HUMANEVAL_TEMPLATE},
)
MT_BENCH = VendoredLoader(
    dataset="mt-bench",
    dirname="mt_bench",
    filename="question.jsonl",
    convert=_question_rows("mt-bench"),
    upstream="github:lm-sys/FastChat@0e6d3e4beaab66f4d3f93db72541a4abab8af28d"
    ":fastchat/llm_judge/data/mt_bench/question.jsonl",
    license="Apache-2.0",
    # Same schema and question ids (81-160) as FastChat's file.
    hub_repo="lighteval/mt-bench",
    hub_split="train",
)
SPEC_BENCH = VendoredLoader(
    dataset="spec-bench",
    dirname="spec_bench",
    filename="question.jsonl",
    convert=_question_rows("spec-bench"),
    upstream="github:hemingkx/Spec-Bench@fd2c1cd7d2201ef71db4c5f4e455008f017967bf"
    ":data/spec_bench/question.jsonl",
    license="Apache-2.0",
    # Rows 81-160 are MT-Bench verbatim; Spec-Bench has no hub copy of its own.
    extra={"note": "first 80 rows (ids 81-160) are MT-Bench"},
)
