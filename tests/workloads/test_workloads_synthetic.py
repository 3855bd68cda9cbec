"""The synthetic workload: exact token lengths in the target's own tokenizer, seeded."""

from avbench.inputs.suite import load_suite
from avbench.workloads.registry import builtin_workloads, load_workload
from avbench.workloads.synthetic import LocalTokenizer


def _tiny_tokenizer() -> str:
    pair = load_suite().pair("tiny-cpu")
    return pair.resolve(pair.target)


def test_prompts_have_exactly_the_asked_length_with_special_tokens():
    tok_dir = _tiny_tokenizer()
    spec = builtin_workloads()["synthetic"].model_copy(
        update={"input_len": 40, "output_len": 16, "len_range": 0.25, "seed": 3}
    )
    lw = load_workload(spec, tokenizer=tok_dir, count=24)
    tok = LocalTokenizer(tok_dir)
    counted = [len(tok.encode(c.turns[0], special=True)) for c in lw.conversations]
    assert counted == lw.input_tokens  # as the server will count each completion prompt
    assert all(30 <= n <= 50 for n in counted) and len(set(counted)) > 3  # drawn in 40 ± 25%
    assert all(12 <= c.max_tokens <= 20 for c in lw.conversations)
    assert lw.source.extra["inexact_prompts"] == 0
    assert len({c.turns[0] for c in lw.conversations}) == 24  # no repeated prompt
    again = load_workload(spec, tokenizer=tok_dir, count=24)
    assert [c.turns for c in again.conversations] == [c.turns for c in lw.conversations]
    other = load_workload(spec.model_copy(update={"seed": 4}), tokenizer=tok_dir, count=24)
    assert [c.turns for c in other.conversations] != [c.turns for c in lw.conversations]


def test_fixed_lengths():
    spec = builtin_workloads()["synthetic"].model_copy(update={"input_len": 7, "output_len": 5})
    lw = load_workload(spec, tokenizer=_tiny_tokenizer(), count=10)
    assert set(lw.input_tokens) == {7} and {c.max_tokens for c in lw.conversations} == {5}


def test_lengths_belong_to_synthetic_workloads_only():
    import pytest
    from pydantic import ValidationError

    from avbench.inputs.workload import WorkloadSpec

    with pytest.raises(ValidationError, match="needs input_len and output_len"):
        WorkloadSpec(name="s", dataset="synthetic", input_len=8)
    with pytest.raises(ValidationError, match="apply to dataset 'synthetic'"):
        WorkloadSpec(name="g", dataset="gsm8k", output_len=8)
