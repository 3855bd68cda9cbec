"""The output-quality guard: identical-to-baseline share and GSM8K exact match."""

import math
from dataclasses import replace

import pytest

from avbench.loadgen.records import RequestRecord
from avbench.metrics.quality import (
    ExactMatch,
    Output,
    compare_to_baseline,
    differs_beyond_noise,
    exact_match,
    first_difference,
    gsm8k_answer,
    quality_columns,
    quality_flags,
)
from avbench.plan.cells import Cell
from avbench.store.run_store import RunStore


def rec(
    cid: str, ids: list[int], turn: int = 0, text: str = "", prompt: str = "p"
) -> RequestRecord:
    return RequestRecord(
        conversation_id=cid,
        turn=turn,
        prompt_messages=prompt + cid,
        output_token_ids=ids,
        output_text=text or " ".join(map(str, ids)),
    )


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a shorter output differs at its end


def test_guard_catches_a_deliberately_altered_output(tmp_path):
    """Baseline records go through the real store; one arm output has one token changed."""
    base = [rec(f"c{i}", list(range(i, i + 40))) for i in range(20)]
    store = RunStore.create(tmp_path, "run", {"run_id": "run"})
    cell = Cell("baseline", "w", 4, None, 0, 20, 0)
    store.write_cell(cell.to_dict(), base, {})
    stored = store.read_records(cell.id)
    assert [r.output_token_ids for r in stored] == [r.output_token_ids for r in base]

    arm = [replace(r) for r in base]
    altered = list(arm[7].output_token_ids)
    altered[23] += 1
    arm[7] = replace(arm[7], output_token_ids=altered)
    cols = quality_columns(
        arm, baseline=stored, baseline_cell_id=cell.id, temperature=0.0, references=None
    )
    assert cols["identical_compared"] == 20
    assert cols["identical_to_baseline_share"] == pytest.approx(19 / 20)
    assert cols["first_diff_positions"] == [23]
    flags = quality_flags([cell.to_dict(), {"cell_id": "static-k3__w__c4__rep0", **cols}])
    assert len(flags) == 1 and "95.0%" in flags[0] and "near-tie" in flags[0]

    same = quality_columns(
        base, baseline=stored, baseline_cell_id=cell.id, temperature=0.0, references=None
    )
    assert same["identical_to_baseline_share"] == 1.0 and same["first_diff_positions"] == []
    assert quality_flags([{"cell_id": "x", **same}]) == []


def test_identity_skipped_above_temperature_zero_and_for_changed_prompts():
    base = [rec("a", [1, 2]), rec("a", [3, 4], turn=1, prompt="first answer A ")]
    arm = [rec("a", [1, 2]), rec("a", [9, 9], turn=1, prompt="first answer B ")]
    ident = compare_to_baseline(
        [Output.of(r) for r in base],
        [Output.of(r) for r in arm],
    )
    assert (ident.compared, ident.identical) == (1, 1)  # turn 1 had another prompt
    hot = quality_columns(
        arm, baseline=base, baseline_cell_id="b", temperature=1.0, references=None
    )
    assert hot["identical_to_baseline_share"] is None and hot["baseline_cell_id"] == "b"


def test_text_comparison_when_no_token_ids():
    base = [rec("a", [], text="The answer is 12")]
    arm = [rec("a", [], text="The answer is 13")]
    cols = quality_columns(arm, baseline=base, baseline_cell_id="b", temperature=0, references=None)
    assert cols["identical_to_baseline_share"] == 0.0
    assert cols["first_diff_positions"] == [len("The answer is 1")]


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so 3 + 4 = 7\n#### 7", "7"),
        ("#### 1,000", "1000"),
        ("she pays $18.00 in total", "18"),
        ("first 5, then 12", "12"),
        ("no number here", None),
        ("-3 degrees", "-3"),
    ],
)
def test_gsm8k_answer(text, answer):
    assert gsm8k_answer(text) == answer


def test_exact_match_and_standard_error():
    refs = {f"g{i}": f"work\n#### {i}" for i in range(10)}
    outs = [rec(f"g{i}", [], text=f"... {i if i < 6 else i + 1}") for i in range(10)]

    em = exact_match([Output.of(r) for r in outs], refs)
    assert (em.graded, em.correct) == (10, 6)
    assert em.standard_error == pytest.approx(math.sqrt(0.6 * 0.4 / 10))
    cols = quality_columns(
        outs, baseline=None, baseline_cell_id=None, temperature=1, references=refs
    )
    assert cols["gsm8k_exact_match"] == pytest.approx(0.6)
    assert cols["identical_to_baseline_share"] is None


def test_differs_beyond_noise():
    assert not differs_beyond_noise(ExactMatch(100, 60), ExactMatch(100, 62))
    assert differs_beyond_noise(ExactMatch(400, 300), ExactMatch(400, 200))
    assert not differs_beyond_noise(ExactMatch(50, 0), ExactMatch(50, 3))
    assert differs_beyond_noise(ExactMatch(50, 0), ExactMatch(50, 10))
