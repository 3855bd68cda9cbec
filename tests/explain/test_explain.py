"""`avbench quality explain`: the target's logit margin where an output left the baseline's.

The baseline output is the tiny target's own greedy continuation (transformers, offline); the
arm's output is the same with the token at one position replaced by the runner-up, as a
near-tie flip would do.
"""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from avbench.estimator.trace import load_model  # noqa: E402
from avbench.explain import explain_run  # noqa: E402
from avbench.inputs.suite import load_suite  # noqa: E402
from avbench.loadgen.records import RequestRecord  # noqa: E402
from avbench.metrics.quality import quality_columns  # noqa: E402
from avbench.plan.cells import Cell  # noqa: E402
from avbench.store.run_store import RunStore  # noqa: E402
from avbench.workloads.tokens import load_tokenizer  # noqa: E402


def _flip(tmp_path):
    """The target's greedy output (baseline), the same with position 6 flipped to the
    runner-up (arm), an empty run of the tiny pair, and the expected margin there."""
    pair = load_suite().pair("tiny-cpu")
    target = pair.resolve(pair.target)
    tok, model = load_tokenizer(target), load_model(target)
    messages = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
        ids = out[0, len(prompt) :].tolist()
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 + 6]
    top2 = torch.topk(logits.double(), 2)
    expected = float(top2.values[0] - top2.values[1])

    base = RequestRecord("q/0", 0, prompt_messages=json.dumps(messages), output_token_ids=ids)
    flipped = ids[:6] + [int(top2.indices[1])] + ids[7:]
    arm = replace(base, output_token_ids=flipped)
    store = RunStore.create(
        tmp_path,
        "r",
        {"run_id": "r", "pair": pair.model_dump(mode="json"), "workloads": {"w": {"api": "chat"}}},
    )
    return store, base, arm, expected


def _explain_cli(store: RunStore, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "avbench.cli", "quality", "explain", str(store.root), *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_margin_at_the_first_differing_position(tmp_path):
    store, base, arm, expected = _flip(tmp_path)
    ids = base.output_token_ids
    b = Cell("baseline", "w", 1, None, 0, 1, 0)
    a = Cell("static-k3", "w", 1, None, 0, 1, 0)
    store.write_cell(b.to_dict(), [base], {})
    cols = quality_columns([arm], baseline=[base], baseline_cell_id=b.id, temperature=0,
                           references=None)  # fmt: skip
    assert cols["first_diff_positions"] == [6]
    store.write_cell(a.to_dict() | cols, [arm], {})

    ex = explain_run(store.root)
    (tie,) = ex.ties
    assert (tie.cell_id, tie.position, tie.arm_token) == (a.id, 6, arm.output_token_ids[6])
    assert tie.baseline_is_top1 and tie.baseline_token == ids[6]
    assert tie.margin == pytest.approx(expected, abs=1e-5)
    assert ex.reference_margins.size == len(ids) - 1

    res = _explain_cli(store, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["ties"][0]["position"] == 6
    assert (store.root / "near_ties.json").is_file()  # for the report's quality section


@pytest.mark.slow
def test_nothing_compared_is_said_and_a_later_baseline_is_compared(tmp_path):
    """A static cell stored while its baseline arm had failed (identity columns empty, as the
    runner stores them); --resume measures the baseline afterwards."""
    store, base, arm, expected = _flip(tmp_path)
    a = Cell("static-k3", "w", 1, None, 0, 1, 0)
    alone = quality_columns([arm], baseline=None, baseline_cell_id=None, temperature=0,
                            references=None)  # fmt: skip
    store.write_cell(a.to_dict() | alone | {"arm_kind": "static", "temperature": 0.0}, [arm], {})
    res = _explain_cli(store)
    assert res.returncode == 0, res.stderr
    assert "no output differs" not in res.stdout
    assert res.stdout.strip() == (
        f"{store.root}: nothing compared: 1 temperature-0 cell(s) not compared (no baseline "
        f"cell of the same workload, load and repeat): {a.id}"
    )

    b = Cell("baseline", "w", 1, None, 0, 1, 0)
    store.write_cell(b.to_dict() | {"arm_kind": "baseline", "temperature": 0.0}, [base], {})
    ex = explain_run(store.root)
    (tie,) = ex.ties
    assert (tie.cell_id, tie.position) == (a.id, 6)
    assert tie.margin == pytest.approx(expected, abs=1e-5)
    assert ex.summary()["cells_compared"] == 1 and ex.summary()["cells_not_compared"] == []
