"""Input cap: prompts over max_input_tokens are dropped (and counted), never cut."""

from __future__ import annotations

import math

import pytest

from avbench.errors import WorkloadError
from avbench.workloads.registry import builtin_workloads, load_workload
from avbench.workloads.tokens import APPROX_COUNTER, render_chat_prompt


def test_approximate_cap_drops_exactly_the_long_prompts(jsonl, data_root):
    rows = jsonl(data_root / "gsm8k" / "test.jsonl")
    cap = 60
    long_ids = {f"gsm8k/{i}" for i, r in enumerate(rows) if math.ceil(len(r["question"]) / 4) > cap}
    assert 0 < len(long_ids) < len(rows)  # the cap must bite, but not everywhere
    spec = builtin_workloads()["gsm8k"].model_copy(update={"max_input_tokens": cap})
    loaded = load_workload(spec)
    assert loaded.token_counter == APPROX_COUNTER
    assert loaded.truncated == len(long_ids)
    assert len(loaded.conversations) == len(rows) - len(long_ids)
    assert not long_ids & {c.id for c in loaded.conversations}
    assert max(loaded.input_tokens) <= cap
    # Kept prompts are verbatim, and a cap never reorders what survives it.
    full = [c for c in load_workload(builtin_workloads()["gsm8k"]).conversations]
    assert loaded.conversations == [c for c in full if c.id not in long_ids]


def test_cap_below_every_prompt_is_an_error():
    spec = builtin_workloads()["mt-bench"].model_copy(update={"max_input_tokens": 1})
    with pytest.raises(WorkloadError, match="all 80 prompts exceed max_input_tokens=1"):
        load_workload(spec)


def test_tokenizer_counts_the_templated_prompt(tiny_tokenizer):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer, local_files_only=True)
    spec = builtin_workloads()["gsm8k"].model_copy(update={"max_input_tokens": 40})
    loaded = load_workload(spec, tokenizer=tiny_tokenizer)
    assert loaded.token_counter == f"tokenizer:{tiny_tokenizer}"
    for conv, n in list(zip(loaded.conversations, loaded.input_tokens, strict=True))[:5]:
        text = tok.apply_chat_template(
            [{"role": "user", "content": conv.turns[0]}], tokenize=False, add_generation_prompt=True
        )
        assert n == len(tok(text, add_special_tokens=False)["input_ids"]) <= 40
    assert loaded.truncated > 0
    assert loaded.truncated + len(loaded.conversations) == 1319


def test_render_chat_prompt_uses_the_template(tiny_tokenizer):
    msgs = [{"role": "user", "content": "How many eggs ?"}]
    out = render_chat_prompt(msgs, tiny_tokenizer)
    assert out == "<s> user : How many eggs ? </s> <s> assistant : "


def test_render_chat_prompt_without_template_refuses(tiny_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer, local_files_only=True)
    tok.chat_template = None
    tok.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(WorkloadError, match="no chat_template"):
        render_chat_prompt([{"role": "user", "content": "hi"}], tmp_path)


def test_missing_tokenizer_dir_is_one_line_error(tmp_path):
    with pytest.raises(WorkloadError, match="not a directory"):
        load_workload(builtin_workloads()["gsm8k"], tokenizer=tmp_path / "nope")
