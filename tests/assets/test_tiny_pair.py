"""The shipped tiny pair loads offline and is a real (imperfect) speculative pair."""

from __future__ import annotations

import json
import os

import pytest

from avbench.assets import tiny_pair_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DATA = tiny_pair_dir().parent.parent / "workloads" / "data"
# The shipped pair measures about 0.73 (make reproduce-tables); this small trace has ~900 labels.
AUC_FLOOR = 0.65


@pytest.fixture(scope="module")
def pair():
    root = tiny_pair_dir()
    target = transformers.AutoModelForCausalLM.from_pretrained(
        root / "target", dtype=torch.float32, local_files_only=True
    ).eval()
    drafter = transformers.AutoModelForCausalLM.from_pretrained(
        root / "drafter", dtype=torch.float32, local_files_only=True
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(root / "target", local_files_only=True)
    return target, drafter, tok


def test_dirs_are_complete_hf_model_dirs():
    root = tiny_pair_dir()
    for part in ("target", "drafter"):
        names = {p.name for p in (root / part).iterdir()}
        assert {
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        } <= names
        assert "chat_template" in json.loads((root / part / "tokenizer_config.json").read_text())
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert size < 8 * 1024 * 1024


def test_shapes_fit_the_cpu_attention(pair):
    target, drafter, _ = pair
    for model in (target, drafter):
        cfg = model.config
        assert cfg.architectures == ["LlamaForCausalLM"]
        assert cfg.head_dim == 64  # the vLLM CPU attention rejects 16
        assert cfg.hidden_size == cfg.num_attention_heads * cfg.head_dim
        assert cfg.max_position_embeddings >= 1024
    assert drafter.config.num_hidden_layers < target.config.num_hidden_layers
    assert drafter.config.vocab_size == target.config.vocab_size


def test_drafter_shares_the_tokenizer():
    root = tiny_pair_dir()
    assert (root / "target" / "tokenizer.json").read_bytes() == (
        root / "drafter" / "tokenizer.json"
    ).read_bytes()
    tok_t = transformers.AutoTokenizer.from_pretrained(root / "target", local_files_only=True)
    tok_d = transformers.AutoTokenizer.from_pretrained(root / "drafter", local_files_only=True)
    text = "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\ndef f(x):\n    return x"
    assert tok_t(text).input_ids == tok_d(text).input_ids
    assert tok_t.eos_token_id == tok_d.eos_token_id


def test_chat_template_renders_a_generation_prompt(pair):
    _, _, tok = pair
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith(tok.bos_token)
    assert "What is 2 + 3?" in text
    assert text.endswith("<|assistant|>\n")
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids.count(tok.bos_token_id) == 1
    assert tok.eos_token_id is not None and tok.pad_token_id is not None
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3


def _held_out_prompts(tok, per_split: int = 6) -> list[str]:
    # scripts/train_tiny_pair.py holds out items whose index % 10 == 9 of these two sets.
    sources = (
        (DATA / "gsm8k" / "test.jsonl", "question"),
        (DATA / "humaneval" / "HumanEval.jsonl", "prompt"),
    )
    prompts = []
    for path, field in sources:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        for row in rows[9::10][:per_split]:
            prompts.append(
                tok.apply_chat_template(
                    [{"role": "user", "content": row[field]}],
                    tokenize=False,
                    add_generation_prompt=True,
                )
            )
    return prompts


def test_drafter_agrees_often_but_not_always(pair):
    """Greedy next-token agreement on the target's own greedy continuations of held-out prompts.

    This is what position-0 acceptance measures under greedy speculative decoding.
    """
    target, drafter, tok = pair
    agree = total = 0
    answered = 0
    with torch.no_grad():
        for prompt in _held_out_prompts(tok):
            ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
            out = target.generate(
                ids, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id
            )
            n = out.shape[1] - ids.shape[1]
            answered += n > 0
            t_pred = target(out).logits[0, ids.shape[1] - 1 : -1].argmax(-1)
            d_pred = drafter(out).logits[0, ids.shape[1] - 1 : -1].argmax(-1)
            agree += int((t_pred == d_pred).sum())
            total += n
    assert answered == len(_held_out_prompts(tok))  # the target answers after the assistant tag
    rate = agree / total
    print(f"held-out greedy agreement {rate:.3f} over {total} tokens")
    assert 0.2 <= rate <= 0.95, f"agreement {rate:.3f} over {total} tokens"


@pytest.mark.slow
def test_drafter_confidence_ranks_its_own_acceptance(pair):
    """The shipped drafter is informative at temperature 1 / top-p 0.95: its logit(q_max)
    ranks which drafts the target accepts (AUC well above chance), with acceptance neither
    near 0 nor near 1. Offline trace (exact rejection sampling) of gsm8k and HumanEval prompts.
    """
    from sklearn.metrics import roc_auc_score

    from avbench.estimator.prompts import load_prompts
    from avbench.estimator.trace import Models, TraceConfig, encode_prompts, trace_pair

    target, drafter, tok = pair
    cfg = TraceConfig(num_draft=4, temperature=1.0, top_p=0.95, max_new_tokens=64, seed=0)
    frames = []
    for workload in ("gsm8k", "humaneval"):
        prompts = encode_prompts(tok, load_prompts(workload, 8, tiny_pair_dir() / "target"))
        ids = {"run_id": "t", "pair_id": "tiny-cpu", "workload_id": workload}
        frames.append(trace_pair(Models(target, drafter), prompts, cfg, ids, [tok.eos_token_id]))
    labels = [int(v) for f in frames for v in f["label"]]
    feature = [float(v) for f in frames for v in f["logit_q_max"]]
    auc, accept = roc_auc_score(labels, feature), sum(labels) / len(labels)
    print(f"{len(labels)} labeled drafts: AUC of logit(q_max) {auc:.3f}, acceptance {accept:.3f}")
    assert auc >= AUC_FLOOR, (auc, len(labels))
    assert 0.3 <= accept <= 0.9, accept
