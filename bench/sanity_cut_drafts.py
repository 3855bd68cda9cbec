"""How vLLM counts drafts the scheduler cuts short, measured: what `avbench sanity` relies on.

One server of the tiny target drafting for itself (exactly `avbench sanity`'s, with avbench's
CPU sampler fix where the build needs it), T = 1 / top-p 1.0, three kinds of request:

- ``far``: max_tokens a multiple of K + 1 and far from max_model_len (no draft cut);
- ``max_tokens``: max_tokens not a multiple of K + 1, so the last verify step drafts past it;
- ``long``: the same 400-token prompts as ``model_len``, ending 32 tokens before max_model_len;
- ``model_len``: prompt + max_tokens = max_model_len, so the scheduler cuts the last drafts.

For each: drafts, K x drafts against the draft tokens vLLM counted, accepted tokens, and the
per-position rate taken naively (accepted_per_pos / drafts) against the exact check
(accepted == draft tokens). Run it under the vLLM lock on a shared machine:

    flock /tmp/avbench-vllm.lock python bench/sanity_cut_drafts.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx

from avbench.checks.sanity import PROMPTS, Profile, measure, sanity_sweep, self_drafting
from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm
from avbench.serving.server import Launch, arm_server, find_free_port
from avbench.serving.server_log import engine_choices

PAIR = "tiny-cpu"
T1 = Profile("T=1", 1.0)


def main() -> None:
    pair = self_drafting(load_suite().pair(PAIR), stock=False)
    arm = Arm("static", pair.max_k)
    model_len = int(pair.serve_flags[pair.serve_flags.index("--max-model-len") + 1])
    port = find_free_port()
    with tempfile.TemporaryDirectory() as tmp:
        launch = Launch(port, Path(tmp) / "server.log", sweep=sanity_sweep(64))
        server = arm_server(pair, arm, launch)
        with server:
            server.wait_ready()
            ids = httpx.post(
                f"{server.base_url}/tokenize",
                json={"model": pair.model_name, "prompt": PROMPTS[0]},
                timeout=60,
            ).json()["tokens"]
            long_prompt = (ids * (400 // len(ids) + 1))[:400]
            runs = {
                "far": measure(server.base_url, pair, arm.k, T1, list(PROMPTS), 64),
                "max_tokens": measure(server.base_url, pair, arm.k, T1, list(PROMPTS), 62),
                "long": measure(
                    server.base_url, pair, arm.k, T1, [long_prompt] * 4, model_len - 400 - 32
                ),
                "model_len": measure(
                    server.base_url, pair, arm.k, T1, [long_prompt] * 4, model_len - 400
                ),
            }
        patched = engine_choices(server.log_path.read_text())["server_patched"]
    print(f"pair {PAIR} self-drafting, K={arm.k}, max_model_len {model_len}, patched: {patched}")
    print("requests     drafts  Kxdrafts  draft_tok  accepted  naive accepted_pos/drafts  exact")
    for name, c in runs.items():
        naive = " ".join(f"{a / c.drafts:.3f}" for a in c.accepted_per_pos)
        print(f"{name:<11} {c.drafts:>7} {c.k * c.drafts:>9} {c.draft_tokens:>10} "
              f"{c.accepted:>9}  {naive:<25}  {c.exact}")  # fmt: skip


if __name__ == "__main__":
    main()
