"""Train the embedded tiny speculative pair (`tiny-cpu`) from the vendored workload text.

Writes two complete Hugging Face model directories under avbench/assets/tiny/:
  target/   LlamaForCausalLM, 4 layers, hidden 128, 2 heads / 1 KV head (head_dim 64)
  drafter/  the same shape with 2 layers, distilled from the target, same tokenizer

Both share one byte-level BPE tokenizer (2048 tokens) with a chat template, so vLLM's
/v1/chat/completions works. The target is trained long enough to be sure of much of its text
(it nearly memorises the small corpus), so its next-token distribution is sharp in places and
broad in others. The drafter starts as the target truncated to its first two layers and is then
distilled on the target's next-token distribution: it agrees where the text is predictable and
is unsure where the target is, which is what makes its confidence informative (logit(q_max)
ranks its acceptance: AUC ~0.73 at temperature 1, offline trace).

Everything is seeded and the step counts are fixed (not time-based), so a rerun on the same
torch version reproduces the shipped weights (up to float rounding across CPU kernels).
Cost: 2400 target + 2000 drafter steps of 16 x 256 tokens, about 25 minutes on 2 idle cores
(0.31 s per target step, 0.36 s per drafter step).

    .venv/bin/python scripts/train_tiny_pair.py [--out DIR] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "avbench" / "workloads" / "data"
DEFAULT_OUT = REPO / "avbench" / "assets" / "tiny"

SEED = 1234
VOCAB_SIZE = 2048
SEQ_LEN = 256
BATCH = 16
TARGET_STEPS = 2400
DRAFTER_STEPS = 2000
TARGET_LAYERS = 4
DRAFTER_LAYERS = 2
HIDDEN = 128
INTERMEDIATE = 384
MAX_POS = 2048

# spec_bench rows whose turns are whole articles (about 180k of 500k tokens): too much for a
# model this small to learn in minutes; without them it learns the math and code answers better.
LONG_CONTEXT = {"summarization", "rag"}

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]

# One line per turn: role tag, newline, content; assistant turns end with EOS so the model learns
# to stop. The generation prompt is the assistant tag and a newline.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def _jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def held_out(split: str, index: int) -> bool:
    """Items kept out of training, for the offline agreement check (tests/assets)."""
    return split in ("gsm8k", "humaneval") and index % 10 == 9


def chat_samples() -> list[list[dict]]:
    """Conversations (lists of chat messages) built from the vendored workload data."""
    convs: list[list[dict]] = []
    for i, row in enumerate(_jsonl(DATA / "gsm8k" / "test.jsonl")):
        if not held_out("gsm8k", i):
            convs.append(
                [
                    {"role": "user", "content": row["question"]},
                    {"role": "assistant", "content": row["answer"]},
                ]
            )
    for i, row in enumerate(_jsonl(DATA / "humaneval" / "HumanEval.jsonl")):
        if not held_out("humaneval", i):
            convs.append(
                [
                    {"role": "user", "content": row["prompt"]},
                    {"role": "assistant", "content": row["canonical_solution"]},
                ]
            )
    # mt_bench is a subset of spec_bench: keep each distinct conversation once.
    seen: set[str] = set()
    for path in (DATA / "spec_bench" / "question.jsonl", DATA / "mt_bench" / "question.jsonl"):
        for row in _jsonl(path):
            if row.get("category") in LONG_CONTEXT:
                continue
            key = json.dumps(row["turns"])
            if key in seen:
                continue
            seen.add(key)
            refs = row.get("reference") or []
            conv: list[dict] = []
            for j, turn in enumerate(row["turns"]):
                conv.append({"role": "user", "content": turn})
                ref = refs[j] if j < len(refs) else None
                if isinstance(ref, list):  # QA rows list several accepted answers
                    ref = ref[0] if ref else None
                if ref:
                    conv.append({"role": "assistant", "content": ref})
            convs.append(conv)
    return convs


def build_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[PAD, BOS, EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # Plain completions (add_special_tokens=True) start with BOS like chat prompts do.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POS,
        clean_up_tokenization_spaces=False,
    )


def model_config(tokenizer: PreTrainedTokenizerFast, layers: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # vLLM's CPU attention rejects head_dim 16; 64 works
        max_position_embeddings=MAX_POS,
        rope_theta=10000.0,
        tie_word_embeddings=True,  # halves the shipped size
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def pack(token_lists: list[list[int]], seed: int) -> torch.Tensor:
    """Shuffle the samples and cut their concatenation into SEQ_LEN + 1 windows."""
    order = list(range(len(token_lists)))
    random.Random(seed).shuffle(order)
    flat = [t for i in order for t in token_lists[i]]
    n = len(flat) // (SEQ_LEN + 1)
    return torch.tensor(flat[: n * (SEQ_LEN + 1)]).view(n, SEQ_LEN + 1)


def lr_at(step: int, total: int, peak: float) -> float:
    warmup = max(1, total // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def batches(token_lists: list[list[int]], steps: int, seed: int):
    """Yield `steps` batches, reshuffling (and repacking) each epoch."""
    epoch, done = 0, 0
    while True:
        windows = pack(token_lists, seed + epoch)
        perm = torch.randperm(len(windows), generator=torch.Generator().manual_seed(seed + epoch))
        for start in range(0, len(perm) - BATCH + 1, BATCH):
            yield windows[perm[start : start + BATCH]]
            done += 1
            if done == steps:
                return
        epoch += 1


def train_target(model: LlamaForCausalLM, token_lists: list[list[int]], steps: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=0.01, betas=(0.9, 0.95))
    model.train()
    t0 = time.monotonic()
    for step, batch in enumerate(batches(token_lists, steps, SEED)):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, 4e-3)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 40 == 0 or step == steps - 1:
            print(f"target  step {step:4d} loss {loss.item():.3f} ({time.monotonic() - t0:.0f}s)")
    model.eval()


def drafter_from_target(target: LlamaForCausalLM, config: LlamaConfig) -> LlamaForCausalLM:
    """A shallower model holding the target's embeddings, first layers and final norm."""
    drafter = LlamaForCausalLM(config)
    own = drafter.state_dict()
    drafter.load_state_dict({k: v.clone() for k, v in target.state_dict().items() if k in own})
    return drafter


def distill_drafter(
    drafter: LlamaForCausalLM,
    target: LlamaForCausalLM,
    token_lists: list[list[int]],
    steps: int,
) -> None:
    opt = torch.optim.AdamW(drafter.parameters(), lr=2e-3, weight_decay=0.01, betas=(0.9, 0.95))
    drafter.train()
    t0 = time.monotonic()
    for step, batch in enumerate(batches(token_lists, steps, SEED + 1000)):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, 2e-3)
        inputs = batch[:, :-1]
        with torch.no_grad():
            t_logp = F.log_softmax(target(input_ids=inputs).logits, dim=-1)
        d_logp = F.log_softmax(drafter(input_ids=inputs).logits, dim=-1)
        # Forward KL to the target's distribution, plus a little CE on the data.
        kl = F.kl_div(
            d_logp.flatten(0, 1), t_logp.flatten(0, 1), log_target=True, reduction="batchmean"
        )
        ce = F.nll_loss(d_logp.flatten(0, 1), batch[:, 1:].reshape(-1))
        loss = kl + 0.1 * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % 40 == 0 or step == steps - 1:
            print(
                f"drafter step {step:4d} kl {kl.item():.3f} ce {ce.item():.3f} "
                f"({time.monotonic() - t0:.0f}s)"
            )
    drafter.eval()


def held_out_prompts(tokenizer: PreTrainedTokenizerFast, limit: int = 24) -> list[str]:
    """Chat-rendered prompts of held-out gsm8k and HumanEval items."""
    prompts: list[str] = []
    for split, path, field in (
        ("gsm8k", DATA / "gsm8k" / "test.jsonl", "question"),
        ("humaneval", DATA / "humaneval" / "HumanEval.jsonl", "prompt"),
    ):
        rows = [r for i, r in enumerate(_jsonl(path)) if held_out(split, i)]
        for row in rows[: limit // 2]:
            prompts.append(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": row[field]}],
                    tokenize=False,
                    add_generation_prompt=True,
                )
            )
    return prompts


@torch.no_grad()
def greedy_agreement(target, drafter, tokenizer, prompts: list[str], new_tokens: int = 32) -> float:
    """Share of the target's greedy tokens that the drafter also predicts, teacher-forced."""
    agree = total = 0
    for prompt in prompts:
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        out = target.generate(
            ids,
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
        n = out.shape[1] - ids.shape[1]
        if n == 0:
            continue
        t_pred = target(out).logits[0, ids.shape[1] - 1 : -1].argmax(-1)
        d_pred = drafter(out).logits[0, ids.shape[1] - 1 : -1].argmax(-1)
        agree += int((t_pred == d_pred).sum())
        total += n
    return agree / max(1, total)


def save(model: LlamaForCausalLM, tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # bf16 on disk keeps the pair at a few MB; vLLM is started with --dtype float32.
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    model.to(torch.float32)
    # The chat template goes into tokenizer_config.json (not a separate .jinja file), and the
    # generic class name keeps the dir loadable by transformers 4.x as well as 5.x.
    tokenizer.save_pretrained(out, save_jinja_files=False)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens", ROLE_TOKENS)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target-steps", type=int, default=TARGET_STEPS)
    parser.add_argument("--drafter-steps", type=int, default=DRAFTER_STEPS)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    random.seed(SEED)
    torch.manual_seed(SEED)
    t_start = time.monotonic()

    convs = chat_samples()
    # The tokenizer is trained on the raw text; the chat template is attached afterwards.
    raw = [m["content"] for conv in convs for m in conv]
    tokenizer = build_tokenizer(raw)
    texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in convs]
    encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    token_lists = [e.ids for e in encoded]
    n_tokens = sum(len(t) for t in token_lists)
    print(f"{len(convs)} conversations, {n_tokens} tokens, vocab {len(tokenizer)}")

    torch.manual_seed(SEED)
    target = LlamaForCausalLM(model_config(tokenizer, layers=TARGET_LAYERS))
    train_target(target, token_lists, args.target_steps)

    drafter = drafter_from_target(target, model_config(tokenizer, layers=DRAFTER_LAYERS))
    distill_drafter(drafter, target, token_lists, args.drafter_steps)

    # Measure on what is shipped: the bf16-rounded weights, read back as float32.
    save(target, tokenizer, args.out / "target")
    save(drafter, tokenizer, args.out / "drafter")
    target = LlamaForCausalLM.from_pretrained(args.out / "target", dtype=torch.float32).eval()
    drafter = LlamaForCausalLM.from_pretrained(args.out / "drafter", dtype=torch.float32).eval()
    rate = greedy_agreement(target, drafter, tokenizer, held_out_prompts(tokenizer))
    print(f"held-out greedy next-token agreement (drafter vs target): {rate:.3f}")
    print(f"done in {time.monotonic() - t_start:.0f}s -> {args.out}")


if __name__ == "__main__":
    main()
