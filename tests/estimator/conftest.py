"""Small randomly initialised Llama pairs for trace tests (stand-ins for the shipped tiny pair)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_llama(vocab: int, seed: int, layers: int = 2, init: float = 0.1):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        initializer_range=init,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval()


def perturbed(model, scale: float, seed: int):
    """A drafter that agrees with the target only partly: the target plus weight noise."""
    d = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return d


def byte_tokenizer():
    """Byte-level tokenizer with no merges: 256 byte tokens, no download needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk)
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture(scope="session")
def torch_one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: thread hand-offs cost more than the math
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def small_pair():
    """(target, drafter) with a 64-token vocabulary, in memory."""
    t = make_llama(64, seed=0)
    return t, perturbed(t, 0.03, seed=1)


@pytest.fixture(scope="session")
def pair_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """A saved random pair with a byte-level tokenizer and chat template."""
    root = tmp_path_factory.mktemp("pair")
    tok = byte_tokenizer()
    t = make_llama(len(tok), seed=0)
    d = perturbed(t, 0.03, seed=1)
    for name, m in (("target", t), ("drafter", d)):
        m.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root / "target", root / "drafter"
