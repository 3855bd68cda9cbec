"""The wide pair's step costs outside vLLM: why speculation pays at small batch and not at large.

    python bench/wide_step_times.py [--batches 1,4,16,64] [--repeats 40]

Times, in transformers (float32, one thread, a 64-token context already in the KV cache),
a forward of 1 token per row (a decode step) and of 4 tokens per row (a K = 3 verification) of
tiny-cpu-wide's target, and a 1-token forward of its drafter (the shipped tiny target), at each
batch size: the median of ``--repeats`` calls after 5 warm-up calls, in ms. This is the
arithmetic of the models alone; vLLM adds its own per-step costs on top (a sweep measures those).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from avbench.inputs.suite import load_suite

CONTEXT = 64


def _step_ms(model, batch: int, tokens: int, repeats: int) -> float:
    ids = torch.randint(0, model.config.vocab_size, (batch, CONTEXT))
    nxt = torch.randint(0, model.config.vocab_size, (batch, tokens))
    with torch.inference_mode():
        cache = model(ids, use_cache=True).past_key_values
        times = []
        for i in range(repeats + 5):
            t0 = time.perf_counter()
            model(nxt, past_key_values=cache, use_cache=True)
            if i >= 5:
                times.append((time.perf_counter() - t0) * 1000)
            cache.crop(-tokens)  # back to the context alone for the next call
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = load_suite().pair("tiny-cpu-wide")
    target, drafter = (
        AutoModelForCausalLM.from_pretrained(pair.resolve(ref), dtype=torch.float32).eval()
        for ref in (pair.target, pair.drafter)
    )
    batches = [int(b) for b in args.batches.split(",")]
    rows = {
        "wide target, 1 token per row (ms)": [
            _step_ms(target, b, 1, args.repeats) for b in batches
        ],
        "wide target, 4 tokens per row, a K = 3 verification (ms)": [
            _step_ms(target, b, 4, args.repeats) for b in batches
        ],
        "shipped target (the drafter), 1 token per row (ms)": [
            _step_ms(drafter, b, 1, args.repeats) for b in batches
        ],
    }
    print("| batch | " + " | ".join(str(b) for b in batches) + " |")
    print("|---" * (len(batches) + 1) + "|")
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + " |")


if __name__ == "__main__":
    main()
