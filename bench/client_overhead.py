"""How much the load client costs, and how well it keeps time: avbench vs vLLM's own client.

Both clients stream from the same local fake server (avbench/testing/fake_server.py, which
writes vLLM 0.32's exact chunk format), the client pinned to one CPU and the server to another.
Per concurrency, two phases:

- saturate: the server emits chunks as fast as its loop goes, so the client is the bottleneck;
  reports sustained output tokens/s and client CPU ms per 1000 tokens (process CPU time of the
  client around the run only, not imports or start-up);
- paced: the server emits on a fixed cadence well below capacity; reports the median |error| of
  the client's TTFT vs the server's (first chunk written - request received) and of each
  inter-chunk gap vs the server's write gaps (both clocks are CLOCK_MONOTONIC).

vLLM's client is ``vllm.benchmarks.serve`` (``add_cli_args`` + ``main``; the ``vllm`` console
script fails for the CPU build) with the ``random`` dataset and a throwaway word-level tokenizer.

Usage:  python bench/client_overhead.py [--concurrency 64,256,1024] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_PREFIX = re.compile(r"^<(\d+)>")


def _pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


# ---------------------------------------------------------------- children (one per client run)
def child_avbench(a: argparse.Namespace) -> dict:
    from avbench.inputs.request import EndpointConfig, SamplingParams
    from avbench.loadgen.client import Load, run_drive
    from avbench.workloads.base import Conversation

    ep = EndpointConfig(base_url=a.url, model="fake-model", api="completions")
    convs = [Conversation(id=str(i), turns=(f"w{i % 1000} w1 w2 w3",)) for i in range(a.n)]
    sp = SamplingParams(temperature=0.0, max_tokens=a.tokens, ignore_eos=True)
    # One request first so connection setup and lazy imports are not in the measurement.
    run_drive(ep, sp, convs[:1], Load(concurrency=1))
    cpu0 = time.process_time()
    res = run_drive(ep, sp, convs, Load(concurrency=a.conc))
    cpu = time.process_time() - cpu0
    recs = res.measured
    reqs = []
    for r in recs:
        m = _PREFIX.match(r.output_text)
        ct = r.chunk_times
        reqs.append(
            {
                "idx": int(m.group(1)) if m else None,
                "sent": r.sent_at,
                "ttft": r.ttft,
                "itl": [b - x for x, b in zip(ct, ct[1:], strict=False)],
            }
        )
    return {
        "tokens": sum(sum(r.chunk_tokens) for r in recs),
        "duration": res.window_s,
        "cpu_s": cpu,
        "failed": res.failed,
        "requests": reqs,
    }


def child_vllm(a: argparse.Namespace) -> dict:
    import vllm.benchmarks.serve as vs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    vs.add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend", "openai", "--endpoint", "/v1/completions", "--base-url", a.url,
            "--model", "fake-model", "--tokenizer", a.tokenizer, "--dataset-name", "random",
            "--random-input-len", "4", "--random-output-len", str(a.tokens), "--ignore-eos",
            "--num-prompts", str(a.n), "--max-concurrency", str(a.conc), "--disable-tqdm",
            "--temperature", "0",
        ]
    )  # fmt: skip
    box: dict = {}
    orig = vs.benchmark

    async def measured(*args_, **kw):
        cpu0 = time.process_time()
        out = await orig(*args_, **kw)
        box["cpu_s"] = time.process_time() - cpu0
        box["result"] = dict(out)  # main() deletes the per-request lists from its dict later
        return out

    vs.benchmark = measured
    with contextlib.redirect_stdout(sys.stderr):
        vs.main(args)
    r = box["result"]
    reqs = []
    rows = zip(r["generated_texts"], r["start_times"], r["ttfts"], r["itls"], strict=True)
    for text, st, ttft, itl in rows:
        m = _PREFIX.match(text or "")
        reqs.append({"idx": int(m.group(1)) if m else None, "sent": st, "ttft": ttft, "itl": itl})
    return {
        "tokens": r["total_output_tokens"],
        "duration": r["duration"],
        "cpu_s": box["cpu_s"],
        "failed": r.get("failed", 0),
        "requests": reqs,
    }


# ---------------------------------------------------------------- parent
def make_tokenizer(path: Path) -> None:
    """A word-level tokenizer for vLLM's client (the hub is unreachable; the fake server's
    words are w0..w999)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1} | {f"w{i}": i + 2 for i in range(1000)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]"
    ).save_pretrained(str(path))


def run_child(
    kind: str, url: str, conc: int, n: int, tokens: int, cpu: int | None, tok: str
) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".json") as f:
        cmd = [
            sys.executable, __file__, "--child", kind, "--url", url, "--conc", str(conc),
            "--n", str(n), "--tokens", str(tokens), "--out", f.name, "--tokenizer", tok,
        ]  # fmt: skip
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
        p = subprocess.run(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        if p.returncode != 0:
            raise RuntimeError(f"{kind} client failed:\n{p.stderr[-3000:]}")
        return json.load(f)


def timing_errors(out: dict, emissions: list[dict]) -> dict:
    """Median |error| in ms of the client's timings vs the server's, matched by <idx>.

    ttft_err: client TTFT - server TTFT (first chunk written - request received);
    itl_err: each client inter-chunk gap - the server's gap between the same two writes;
    lag: client's stamp of the first chunk - the server's write time (absolute, same clock).
    """
    import numpy as np

    by_idx = {e["index"]: e for e in emissions}
    t_err, i_err, lag, matched = [], [], [], 0
    for r in out["requests"]:
        e = by_idx.get(r["idx"])
        if e is None or r["ttft"] is None or not e["times"]:
            continue
        matched += 1
        t_err.append(r["ttft"] - (e["times"][0] - e["received_at"]))
        lag.append(r["sent"] + r["ttft"] - e["times"][0])
        gaps = np.diff(e["times"])
        if len(gaps) == len(r["itl"]):
            i_err.extend(np.asarray(r["itl"]) - gaps)

    def med(x):
        return float(np.median(np.abs(x)) * 1e3) if len(x) else float("nan")

    return {
        "ttft_err_ms": med(t_err),
        "itl_err_ms": med(i_err),
        "lag_ms": med(lag),
        "matched": matched,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--concurrency", default="64,256,1024")
    ap.add_argument("--tokens", type=int, default=512, help="output tokens per request (saturate)")
    ap.add_argument("--tokens-per-chunk", type=int, default=3)
    ap.add_argument(
        "--requests-per-conc", type=float, default=3.0, help="requests = this x concurrency"
    )
    ap.add_argument(
        "--paced-ms", default="64:10,256:20,1024:50", help="conc:inter-chunk ms (paced)"
    )
    ap.add_argument("--paced-tokens", type=int, default=90)
    ap.add_argument("--quick", action="store_true", help="fewer, shorter requests (smoke run)")
    ap.add_argument("--clients", default="avbench,vllm")
    # child mode (internal)
    ap.add_argument("--child", choices=["avbench", "vllm"])
    ap.add_argument("--url")
    ap.add_argument("--conc", type=int)
    ap.add_argument("--n", type=int)
    ap.add_argument("--out")
    ap.add_argument("--cpu", type=int)
    ap.add_argument("--tokenizer", default="")
    a = ap.parse_args(argv)

    if a.child:
        _pin(a.cpu)
        out = child_avbench(a) if a.child == "avbench" else child_vllm(a)
        Path(a.out).write_text(json.dumps(out))
        return

    from avbench.testing.fake_server import ServerConfig, serve_in_subprocess

    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    cpus = sorted(os.sched_getaffinity(0)) if ncpu > 1 else [None, None]
    client_cpu, server_cpu = cpus[0], cpus[1]
    concs = [int(x) for x in a.concurrency.split(",")]
    paced = dict(tuple(map(float, kv.split(":"))) for kv in a.paced_ms.split(","))
    clients = a.clients.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as td:
        tok = str(Path(td) / "tok")
        make_tokenizer(Path(tok))
        for c in concs:
            n = max(int(a.requests_per_conc * c), 64)
            tokens = a.tokens
            if a.quick:
                n, tokens = max(c, 32), min(tokens, 128)
            row: dict = {"conc": c}
            sat = ServerConfig(tokens_per_chunk=a.tokens_per_chunk, record=False)
            with serve_in_subprocess(
                sat, cpus=[server_cpu] if server_cpu is not None else None
            ) as srv:
                for cl in clients:
                    out = run_child(cl, srv.base_url, c, n, tokens, client_cpu, tok)
                    row[cl] = {
                        "tok_s": out["tokens"] / out["duration"],
                        "cpu_ms_per_1k": out["cpu_s"] / out["tokens"] * 1e6,
                        # < 1: the client was not the bottleneck (server or a busy machine was)
                        "cpu_util": out["cpu_s"] / out["duration"],
                        "failed": out["failed"],
                    }
            ms = paced.get(float(c), 20.0)
            pcfg = ServerConfig(
                tokens_per_chunk=a.tokens_per_chunk, inter_chunk_delay_s=ms / 1e3, record=True
            )
            with serve_in_subprocess(
                pcfg, cpus=[server_cpu] if server_cpu is not None else None
            ) as srv:
                for cl in clients:
                    srv.reset()
                    out = run_child(cl, srv.base_url, c, 3 * c, a.paced_tokens, client_cpu, tok)
                    row[cl].update(timing_errors(out, srv.emissions()), paced_ms=ms)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    _print_table(rows, clients, a)


def _print_table(rows: list[dict], clients: list[str], a) -> None:
    print(
        f"\nclient overhead: {a.tokens} tokens/request, {a.tokens_per_chunk} tokens/chunk, "
        "client and server each pinned to one CPU; timing errors: medians over a paced run"
    )
    hdr = (
        f"{'conc':>5} {'client':>8} {'tok/s':>9} {'cpu util':>8} {'1-core max':>10} "
        f"{'cpu ms/1k':>10} {'|TTFT err|':>11} "
        f"{'|ITL err|':>10} {'1st lag':>8} {'paced':>6}"
    )
    print(hdr + "\n" + "-" * len(hdr))
    for r in rows:
        for cl in clients:
            x = r[cl]
            print(
                f"{r['conc']:>5} {cl:>8} {x['tok_s']:>9.0f} {x['cpu_util']:>8.2f} "
                f"{1e6 / x['cpu_ms_per_1k']:>10.0f} {x['cpu_ms_per_1k']:>10.2f} "
                f"{x['ttft_err_ms']:>8.4f} ms {x['itl_err_ms']:>7.4f} ms {x['lag_ms']:>5.3f} ms "
                f"{x['paced_ms']:>4.0f}ms"
            )
        if "avbench" in r and "vllm" in r:
            av, vl = r["avbench"], r["vllm"]
            q = [
                av[k] / vl[k]
                for k in ("tok_s", "cpu_ms_per_1k", "ttft_err_ms", "itl_err_ms", "lag_ms")
            ]
            print(
                f"{r['conc']:>5} {'ratio':>8} {q[0]:>8.2f}x {'':>8} {1 / q[1]:>9.2f}x "
                f"{q[1]:>9.2f}x {q[2]:>10.2f}x "
                f"{q[3]:>9.2f}x {q[4]:>7.2f}x"
            )
    print("ratio = avbench / vLLM (tok/s: higher is better; the rest: lower is better)")
    print(
        "cpu util = client CPU s / run s: below 1 the client had headroom and the one-core fake"
        " server (or a busy machine) set tok/s;\n1-core max = tokens per client CPU second, the"
        " rate the client could sustain on one dedicated core"
    )


if __name__ == "__main__":
    main()
