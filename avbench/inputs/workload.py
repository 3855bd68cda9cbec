"""WorkloadSpec: how a suite file names a workload (dataset, subset, caps, endpoint)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from avbench.inputs.request import MAX_SEED, MAX_TOKENS

Dataset = Literal["gsm8k", "humaneval", "mt-bench", "spec-bench", "speed-bench", "synthetic"]

# SPEED-Bench's subsets and the categories each one holds (nvidia/SPEED-Bench, split test).
DEFAULT_SUBSET = "qualitative"  # vLLM's --speed-bench-dataset-subset default
THROUGHPUT_CATEGORIES = ("low_entropy", "mixed", "high_entropy")
QUALITATIVE_CATEGORIES = (
    "coding",
    "humanities",
    "math",
    "multilingual",
    "qa",
    "rag",
    "reasoning",
    "roleplay",
    "stem",
    "summarization",
    "writing",
)
SUBSETS: dict[str, tuple[str, ...]] = {
    "qualitative": QUALITATIVE_CATEGORIES,
    **{f"throughput_{n}": THROUGHPUT_CATEGORIES for n in ("1k", "2k", "8k", "16k", "32k")},
}


def speed_bench_problem(subset: str, category: str | None) -> str | None:
    """What is wrong with a SPEED-Bench subset / category choice, or None."""
    if subset not in SUBSETS:
        return (
            f"subset '{subset}' is not a SPEED-Bench subset (expected one of {', '.join(SUBSETS)})"
        )
    if category is not None and category not in SUBSETS[subset]:
        return (
            f"category '{category}' is not in SPEED-Bench {subset} (expected one of "
            f"{', '.join(SUBSETS[subset])})"
        )
    return None


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str  # id used on the command line and in results, e.g. "gsm8k"
    dataset: Dataset
    description: str = ""
    # SPEED-Bench: subset ("throughput_2k", "qualitative", ...) and category filter.
    subset: str | None = None
    category: str | None = None
    # Where to read prepared data from; None = the copy shipped in the package / the hub.
    data_dir: Path | None = None
    hf_revision: str | None = None
    # How prompts reach the server: "chat" lets vLLM apply the model's own chat template;
    # "completions" renders the template client-side from the tokenizer.
    api: Literal["chat", "completions"] = "chat"
    max_input_tokens: int = Field(2048, gt=0, le=MAX_TOKENS)
    system_prompt: str | None = None
    limit: int | None = Field(None, gt=0)  # keep at most this many conversations
    seed: int = Field(0, ge=0, le=MAX_SEED)  # deterministic shuffle of the conversation order
    # api="completions": "chat" renders the target's chat template client-side, "none" sends
    # the user text as it is (synthetic prompts, whose length is counted without a template).
    prompt_template: Literal["chat", "none"] = "chat"
    # dataset="synthetic": prompt and output lengths in tokens of the served tokenizer, each
    # drawn uniformly from [len x (1 - len_range), len x (1 + len_range)] (vLLM's random dataset).
    input_len: int | None = Field(None, gt=0, le=MAX_TOKENS)
    output_len: int | None = Field(None, gt=0, le=MAX_TOKENS)
    len_range: float = Field(0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _fields_of_the_dataset(self) -> WorkloadSpec:
        synthetic = self.dataset == "synthetic"
        if synthetic and (self.input_len is None or self.output_len is None):
            raise ValueError("a synthetic workload needs input_len and output_len (tokens)")
        if not synthetic and (self.input_len or self.output_len or self.len_range):
            raise ValueError("input_len, output_len and len_range apply to dataset 'synthetic'")
        if self.dataset == "speed-bench":
            problem = speed_bench_problem(self.subset or DEFAULT_SUBSET, self.category)
            if problem:
                raise ValueError(problem)
        elif self.subset is not None or self.category is not None:
            raise ValueError("subset and category apply to dataset 'speed-bench'")
        return self
