from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPEED_DIR = FIXTURES / "speed_bench"
DATA = Path(__file__).resolve().parents[2] / "avbench" / "workloads" / "data"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    # The hub is unreachable here; tests that probe the online path unset this themselves.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


@pytest.fixture()
def jsonl():
    """Reads a JSON Lines file directly, independent of the loader under test."""
    return read_jsonl


@pytest.fixture()
def data_root() -> Path:
    """The vendored prompt files in the package."""
    return DATA


@pytest.fixture()
def speed_dir() -> Path:
    """The SPEED-Bench *schema* fixture (not SPEED-Bench; see its README)."""
    return SPEED_DIR


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> Path:
    """A real HF fast tokenizer (word level over the vendored GSM8K text) with a chat template.

    Built here so the tests need no model download; it stands in for a target's tokenizer dir.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(vocab_size=4000, special_tokens=["[UNK]", "<s>", "</s>"])
    texts = [r["question"] for r in read_jsonl(DATA / "gsm8k" / "test.jsonl")]
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = (
        "{% for m in messages %}<s> {{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
        "{% if add_generation_prompt %}<s> assistant : {% endif %}"
    )
    out = tmp_path_factory.mktemp("tok") / "tiny"
    fast.save_pretrained(out)
    return out
