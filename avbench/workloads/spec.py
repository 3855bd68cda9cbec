"""WorkloadSpec: how a suite file names a workload (dataset, subset, caps, endpoint)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Dataset = Literal["gsm8k", "humaneval", "mt-bench", "spec-bench", "speed-bench"]


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

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
    max_input_tokens: int = Field(2048, gt=0)
    system_prompt: str | None = None
    limit: int | None = Field(None, gt=0)  # keep at most this many conversations
    seed: int = 0  # deterministic shuffle of the conversation order
