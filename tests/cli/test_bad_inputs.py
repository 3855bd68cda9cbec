"""The bad-input list: every invocation a hostile or careless user might type, kept as data.

Each row is an invocation (options, a broken suite file, a broken run directory, a bad row of
cells.jsonl / failures.jsonl), the exit code it must give (README, "Exit codes": never 4) and a
fragment of its one-line message. They run in-process through ``avbench.cli.main`` (a subprocess
each would cost a second), so most rows cost milliseconds.

No row may start a server: launching is replaced by a guard that fails the row (a bad input
that got that far was not validated at the edge), and so is the vLLM pre-flight, which runs
just before. A bad row of cells.jsonl / failures.jsonl is skipped by every reader with a
warning naming the file and line."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import avbench.cli
from avbench.testing.fake_server import ServerConfig, serve_in_thread

REPO = Path(__file__).resolve().parents[2]
BIG = "100000000000000000000"  # 1e20 as an integer


@dataclass(frozen=True)
class Bad:
    """One bad invocation. Placeholders in ``args``: {tmp} a fresh directory, {suites} a copy of
    the shipped suites with ``suite`` applied, {run} a copy of a finished run with ``run``
    applied, {good} that finished run, {fake} / {notok} / {closed} / {busy} servers and ports."""

    args: tuple[str, ...]
    says: str  # fragment of the one-line message
    code: int = 2
    env: tuple[tuple[str, str], ...] = ()
    suite: tuple[str, str, str] | None = None  # (file, table, TOML line set in that table)
    raw_suite: tuple[str, bytes] | None = None  # (file, whole new content)
    files: tuple[tuple[str, bytes], ...] = ()  # written under {tmp} first
    run: tuple[str, bytes] | None = None  # (file in the run copy, new content)


SWEEP = ("sweep", "--pair", "tiny-cpu", "--results", "{tmp}/results", "--no-report")
ATTACH = (
    "sweep", "--pair", "tiny-cpu", "--endpoint", "{fake}", "--arm", "static-k3",
    "--workloads", "humaneval-tiny", "--concurrencies", "1", "--warmup", "0", "--requests", "2",
    "--results", "{tmp}/results", "--no-report",
)  # fmt: skip
BARE = ("sweep", "--endpoint", "{fake}", "--results", "{tmp}/results", "--no-report")
PLAN = ("plan", "--pair", "tiny-cpu", "--suites", "{suites}")
SUITE_SWEEP = (*SWEEP, "--suites", "{suites}")
USAGE = "(see `avbench"


def usage(args: tuple[str, ...], says: str) -> Bad:
    return Bad(args, says)


OPTIONS = [
    # numeric bounds: 1e20 as an integer reached islice() inside the cell
    Bad((*SWEEP, "--requests", BIG), "min_requests: Input should be less than or equal"),
    Bad((*SWEEP, "--requests", "0"), "min_requests: Input should be greater than 0"),
    Bad((*SWEEP, "--requests", "-3"), "min_requests: Input should be greater than 0"),
    Bad((*SWEEP, "--requests", "1e20"), "Invalid value for '--requests'"),
    Bad((*SWEEP, "--requests", "many"), "Invalid value for '--requests'"),
    Bad((*SWEEP, "--requests", "1000000"), "a cell would send 1000002 conversations"),
    Bad((*SWEEP, "--warmup", BIG), "warmup: Input should be less than or equal"),
    Bad((*SWEEP, "--warmup", "-1"), "warmup: Input should be greater than or equal to 0"),
    Bad((*SWEEP, "--warmup", "1.5"), "Invalid value for '--warmup'"),
    Bad((*SWEEP, "--concurrencies", BIG), "concurrencies: must be a non-empty"),
    Bad((*SWEEP, "--concurrencies", "65537"), "positive integers up to 65536"),
    Bad((*SWEEP, "--concurrencies", "0"), "concurrencies: must be a non-empty"),
    Bad((*SWEEP, "--concurrencies", "-4"), "concurrencies: must be a non-empty"),
    Bad((*SWEEP, "--concurrencies", "1e20"), "comma-separated list of integers, got '1e20'"),
    Bad((*SWEEP, "--concurrencies", "a,b"), "comma-separated list of integers, got 'a,b'"),
    Bad((*SWEEP, "--concurrencies", ","), "concurrencies: must be a non-empty"),
    Bad((*SWEEP, "--concurrencies", "4,4"), "concurrencies lists 4 more than once"),
    Bad((*SWEEP, "--concurrencies", "1.5"), "comma-separated list of integers"),
    Bad((*SWEEP, "--k", "0"), "k_values: must be a non-empty list"),
    Bad((*SWEEP, "--k", "1,5"), "--k: 5 above max_k 3 of pair tiny-cpu"),
    Bad((*SWEEP, "--k", BIG), "k_values: must be a non-empty list"),
    Bad((*SWEEP, "--k", "three"), "comma-separated list of integers, got 'three'"),
    # finite floats
    Bad((*SWEEP, "--temperature", "inf"), "sampling.temperature: Input should be a finite"),
    Bad((*SWEEP, "--temperature", "nan"), "sampling.temperature: Input should be a finite"),
    Bad((*SWEEP, "--temperature", "1e400"), "sampling.temperature: Input should be a finite"),
    Bad((*SWEEP, "--temperature", "-1"), "sampling.temperature: Input should be greater"),
    Bad((*SWEEP, "--temperature", "hot"), "Invalid value for '--temperature'"),
    Bad((*SWEEP, "--top-p", "0"), "sampling.top_p: Input should be greater than 0"),
    Bad((*SWEEP, "--top-p", "1.5"), "sampling.top_p: Input should be less than or equal to 1"),
    Bad((*SWEEP, "--top-p", "nan"), "sampling.top_p: Input should be a finite number"),
    Bad((*SWEEP, "--top-p", "-inf"), "sampling.top_p: Input should be a finite number"),
    Bad((*SWEEP, "--max-tokens", BIG), "sampling.max_tokens: Input should be less than or equal"),
    Bad((*SWEEP, "--max-tokens", "16777217"), "sampling.max_tokens: Input should be less than"),
    Bad((*SWEEP, "--max-tokens", "0"), "sampling.max_tokens: Input should be greater than 0"),
    Bad((*SWEEP, "--max-tokens", "1e20"), "Invalid value for '--max-tokens'"),
    Bad((*SWEEP, "--ready-timeout", "inf"), "--ready-timeout: expected a finite number > 0"),
    Bad((*SWEEP, "--ready-timeout", "nan"), "--ready-timeout: expected a finite number > 0"),
    Bad((*SWEEP, "--ready-timeout", "0"), "--ready-timeout: expected a finite number > 0"),
    Bad((*SWEEP, "--ready-timeout", "-5"), "--ready-timeout: expected a finite number > 0"),
    # timeouts (settable, so checked)
    Bad((*SWEEP, "--stall-timeout", "0"), "timeouts.stall_s: Input should be greater than 0"),
    Bad((*SWEEP, "--stall-timeout", "-1"), "timeouts.stall_s: Input should be greater than 0"),
    Bad((*SWEEP, "--stall-timeout", "inf"), "timeouts.stall_s: Input should be a finite number"),
    Bad((*SWEEP, "--stall-timeout", "nan"), "timeouts.stall_s: Input should be a finite number"),
    Bad((*SWEEP, "--stall-timeout", "1e9"), "timeouts.stall_s: Input should be less than"),
    Bad((*SWEEP, "--stall-timeout", "soon"), "Invalid value for '--stall-timeout'"),
    Bad((*SWEEP, "--read-timeout", "0"), "timeouts.read_s: Input should be greater than 0"),
    Bad((*SWEEP, "--read-timeout", "inf"), "timeouts.read_s: Input should be a finite number"),
    Bad((*SWEEP, "--request-timeout", "nan"), "timeouts.request_s: Input should be a finite"),
    Bad((*SWEEP, "--request-timeout", "-2"), "timeouts.request_s: Input should be greater"),
    Bad((*SWEEP, "--cell-timeout", "-3"), "timeouts.cell_s: Input should be greater than 0"),
    Bad((*SWEEP, "--cell-timeout", "inf"), "timeouts.cell_s: Input should be a finite number"),
    # ports, keys
    Bad((*SWEEP, "--port", "0"), "--port: expected a TCP port 1-65535, got 0"),
    Bad((*SWEEP, "--port", "70000"), "--port: expected a TCP port 1-65535, got 70000"),
    Bad((*SWEEP, "--port", "-1"), "--port: expected a TCP port 1-65535, got -1"),
    Bad((*SWEEP, "--port", BIG), f"--port: expected a TCP port 1-65535, got {BIG}"),
    Bad((*SWEEP, "--port", "http"), "Invalid value for '--port'"),
    Bad((*SWEEP, "--port", "{busy}"), "already in use"),
    Bad((*SWEEP, "--api-key", "short"), "key of 5 characters refused"),
    Bad((*SWEEP, "--api-key", "sk-abcdefgh\nX"), "control character ('\\n' at position 11)"),
    Bad((*SWEEP, "--api-key", "sk-abc\tdefgh"), "control character ('\\t' at position 6)"),
    Bad((*SWEEP, "--api-key", "sk-abcdefgh\x7f"), "control character ('\\x7f' at position 11)"),
    Bad((*SWEEP, "--api-key", "sk-abcdefgh\r"), "control character ('\\r' at position 11)"),
    Bad(SWEEP, "control character ('\\n'", env=(("OPENAI_API_KEY", "sk-abcdefgh\nZ"),)),
    Bad(SWEEP, "key of 3 characters refused", env=(("OPENAI_API_KEY", "abc"),)),
    Bad((*SWEEP, "--api-key-file", "{tmp}/nope"), "--api-key-file {tmp}/nope: cannot read"),
    Bad((*SWEEP, "--api-key-file", "{tmp}/k"), "empty", files=(("k", b"\n\n"),)),
    Bad((*SWEEP, "--api-key-file", "{tmp}/k"), "not a text file", files=(("k", b"\xff\xfe\x00"),)),
    Bad((*SWEEP, "--api-key-file", "{tmp}"), "--api-key-file {tmp}: cannot read"),
    Bad(
        (*SWEEP, "--api-key-file", "{tmp}/k"), "control character", files=(("k", b"sk-a\tbcdefgh"),)
    ),
    Bad(
        (*SWEEP, "--api-key", "sk-abcdefgh", "--api-key-file", "{tmp}/k"),
        "give the key one way only",
        files=(("k", b"sk-abcdefgh"),),
    ),
    # options that belong elsewhere, names that do not exist
    Bad((*SWEEP, "--arm", "static-k1"), "--arm describes an attached server"),
    Bad((*SWEEP, "--gpus", "two"), "--gpus 'two': expected GPU ids and ranges, e.g. 0-7 or 0,2,5"),
    Bad((*SWEEP, "--gpus", "0-3,2"), "--gpus '0-3,2': GPU 2 given twice"),
    Bad((*SWEEP, "--isolate", "fast"), "--isolate: arm name 'fast'"),
    Bad((*SWEEP, "--gpus", "0", "--ray", "local"), "--gpus and --ray: Ray gives each arm its GPUs"),
    Bad((*SWEEP, "--adaptive", "--ray", "local"), "--ray runs a planned sweep's arms"),
    Bad((*SWEEP, "--cell-noise", "0.1"), "--cell-noise 0.1: expected a fraction in (0, 1), with"),
    Bad((*SWEEP, "--adaptive", "--cell-noise", "0"), "--cell-noise 0.0: expected a fraction"),
    Bad((*SWEEP, "--capture-dir", "{tmp}"), "--capture-dir {tmp}: expected the existing directory"),
    Bad((*SWEEP, "--workloads", "nope"), "unknown workload 'nope'"),
    Bad((*SWEEP, "--workloads", "gsm8k-tiny,gsm8k-tiny"), "workloads lists gsm8k-tiny more"),
    Bad((*SWEEP, "--arms", "nope"), "arms.0: Input should be 'baseline', 'static', 'av' or 'dyn'"),
    Bad((*SWEEP, "--arms", ","), "arms.0: Input should be 'baseline'"),
    Bad((*SWEEP, "--capture", "nope"), "capture.0: Input should be 'drafts', 'refits' or 'steps'"),
    Bad((*SWEEP, "--draft-fraction", "0"), "draft_fraction: Input should be greater than 0"),
    Bad((*SWEEP, "--draft-fraction", "2"), "draft_fraction: Input should be less than or equal"),
    Bad((*SWEEP, "--draft-fraction", "nan"), "draft_fraction: Input should be a finite number"),
    Bad((*SWEEP, "--input-len", "10"), "--input-len/--output-len/--len-range: set the lengths"),
    Bad((*SWEEP, "--len-range", "0.5"), "--input-len/--output-len/--len-range: set the lengths"),
    Bad((*SWEEP, "--workloads", "synthetic", "--input-len", "0"), "input_len: Input should be"),
    Bad(
        (*SWEEP, "--workloads", "synthetic", "--input-len", BIG), "input_len: Input should be less"
    ),
    Bad((*SWEEP, "--workloads", "synthetic", "--output-len", "-1"), "output_len: Input should be"),
    Bad((*SWEEP, "--workloads", "synthetic", "--len-range", "1.0"), "len_range: Input should be"),
    Bad((*SWEEP, "--workloads", "synthetic", "--len-range", "nan"), "len_range: Input should be a"),
    Bad((*SWEEP, "--workloads", "synthetic", "--len-range", "-0.1"), "len_range: Input should be"),
    Bad((*SWEEP, "--run-id", "../../x"), "--run-id '../../x'"),
    Bad((*SWEEP, "--run-id", "a/b"), "--run-id 'a/b'"),
    Bad((*SWEEP, "--run-id", ".hidden"), "--run-id '.hidden'"),
    Bad((*SWEEP, "--results", "{tmp}/f"), "is a file, expected a directory", files=(("f", b"x"),)),
    Bad((*SWEEP, "--vllm-python", "{tmp}/none"), "cannot run it to launch vLLM"),
    Bad((*SWEEP, "--vllm-python", "/usr/bin/false"), "exited with code 1 and printed nothing"),
    Bad((*SWEEP, "--sweep", "nope"), "unknown sweep 'nope'"),
    Bad(("sweep", "--pair", "nope"), "unknown pair 'nope'"),
    Bad(("sweep", "--results", "{tmp}/r"), "--pair is required"),
    Bad((*SWEEP, "--schedule-from", "{tmp}/none"), "{tmp}/none"),
    Bad((*SWEEP, "--nope"), "No such option: --nope"),
    Bad((*SWEEP, "--pair"), "Option '--pair' requires an argument"),
    Bad((*SWEEP, "extra"), "Got unexpected extra argument(s) (extra)"),
    # --resume
    Bad(("sweep", "--resume", "{tmp}", "--requests", "3"), "refusing --requests"),
    Bad(("sweep", "--resume", "{tmp}", "--stall-timeout", "5"), "refusing --stall-timeout"),
    Bad(("sweep", "--resume", "{tmp}", "--cell-timeout", "5"), "refusing --cell-timeout"),
    Bad(("sweep", "--resume", "{tmp}/none"), "{tmp}/none"),
    Bad(("sweep", "--resume", "{tmp}/f"), "{tmp}/f", files=(("f", b"x"),)),
    Bad(("sweep", "--resume", "{tmp}"), "{tmp}"),
    Bad((*SWEEP, "--complete"), "--complete measures what a stored adaptive run left out"),
    Bad(("sweep", "--resume", "{tmp}", "--complete"), "--complete: {tmp} is not an adaptive run"),
    # attached: endpoints, arms (K >= 1), /tokenize, models
    Bad((*ATTACH[:4], "not a url", *ATTACH[5:]), "expected an http:// or https:// URL"),
    Bad((*ATTACH[:4], "ftp://127.0.0.1:21", *ATTACH[5:]), "expected an http:// or https:// URL"),
    Bad((*ATTACH[:4], "http://127.0.0.1:99999", *ATTACH[5:]), "port must be 1-65535"),
    Bad((*ATTACH[:4], "http://127.0.0.1:0", *ATTACH[5:]), "port must be 1-65535"),
    Bad((*ATTACH[:4], "http://", *ATTACH[5:]), "no host"),
    Bad((*ATTACH[:4], "http://127.0.0.1:8000/?q=1", *ATTACH[5:]), "expected no query"),
    Bad((*ATTACH[:4], "{closed}", *ATTACH[5:]), "cannot connect"),
    Bad((*ATTACH[:6], "static-k99", *ATTACH[7:]), "--arm static-k99: K=99 is above max_k 3"),
    Bad((*ATTACH[:6], "static-k0", *ATTACH[7:]), "--arm: arm static-k0: K must be 1-128"),
    Bad((*ATTACH[:6], "av-k0", *ATTACH[7:]), "--arm: arm av-k0: K must be 1-128"),
    Bad((*ATTACH[:6], "dyn-k0", *ATTACH[7:]), "--arm: arm dyn-k0: K must be 1-128"),
    Bad((*ATTACH[:6], "static-k", *ATTACH[7:]), "--arm: arm name 'static-k'"),
    Bad((*ATTACH[:6], "fast", *ATTACH[7:]), "--arm: arm name 'fast'"),
    Bad((*ATTACH, "--gpus", "0"), "--gpus: expected 1-4096, got 0"),
    Bad((*ATTACH, "--gpus", BIG), f"--gpus: expected 1-4096, got {BIG}"),
    Bad((*ATTACH, "--gpus", "0-3"), "--gpus '0-3': with --endpoint, expected the number of GPUs"),
    Bad(
        (*ATTACH, "--isolate", "baseline"), "--isolate and --ray place the servers avbench launches"
    ),
    Bad((*ATTACH, "--ray", "local"), "--isolate and --ray place the servers avbench launches"),
    Bad((*ATTACH, "--model", "other"), "model 'other' (--model"),
    Bad(
        (*ATTACH, "--capture-dir", "{tmp}/none"), "--capture-dir {tmp}/none: expected the existing"
    ),
    Bad((*BARE, "--arm", "static-k0"), "--arm: arm static-k0: K must be 1-128"),
    Bad((*BARE, "--workload", "nope"), "--workload: unknown workload nope"),
    Bad((*BARE, "--tokenizer", "{tmp}/none"), "--tokenizer {tmp}/none: not a directory"),
    Bad((*BARE, "--workload", "synthetic", "--input-len", "0"), "input_len: Input should be"),
    Bad((*BARE, "--concurrencies", BIG), "concurrencies:"),
    Bad((*BARE, "--temperature", "inf"), "sampling.temperature: Input should be a finite"),
    Bad(
        (
            "sweep",
            "--endpoint",
            "{notok}",
            "--workload",
            "synthetic",
            "--input-len",
            "8",
            "--output-len",
            "8",
            "--requests",
            "2",
            "--concurrencies",
            "1",
            "--results",
            "{tmp}/results",
            "--no-report",
        ),
        "POST /tokenize did not tokenize (HTTP 404)",
    ),  # fmt: skip
    # plan, pairs, workloads
    Bad(("plan", "--pair", "nope"), "unknown pair 'nope'"),
    Bad(("plan", "--pair", "tiny-cpu", "--sweep", "nope"), "unknown sweep 'nope'"),
    Bad(("plan", "--pair", "tiny-cpu", "--concurrencies", BIG), "concurrencies:"),
    Bad(("plan", "--pair", "tiny-cpu", "--k", "0"), "k_values:"),
    Bad(("plan", "--pair", "tiny-cpu", "--workloads", "nope"), "unknown workload 'nope'"),
    Bad(("plan",), "Missing option '--pair'"),
    Bad(("plan", "--pair", "tiny-cpu", "--suites", "{tmp}/none"), "suite file not found"),
    Bad(("pairs", "--suites", "{tmp}/none"), "suite file not found"),
    Bad(("pairs", "--suites", "{tmp}"), "pairs.toml: cannot read", files=(("pairs.toml/x", b""),)),
    Bad(("workloads", "show", "nope"), "nope"),
    Bad(("workloads", "show", "gsm8k", "--seed", "-1"), "--seed: expected an integer >= 0"),
    Bad(("workloads", "show", "gsm8k", "--seed", BIG), "seed: Input should be less than or equal"),
    Bad(("workloads", "show", "gsm8k", "--limit", "0"), "Invalid value for '--limit'"),
    Bad(("workloads", "show", "gsm8k", "--max-input-tokens", BIG), "max_input_tokens: Input"),
    Bad(("workloads", "show", "gsm8k", "--max-input-tokens", "0"), "Invalid value for"),
    Bad(("workloads", "show", "speed-bench-2k-low"), "HF_HUB_OFFLINE is set"),
    Bad(("workloads", "show", "speed-bench-2k-low", "--data-dir", "{tmp}/none"), "does not exist"),
    Bad(("workloads", "show", "speed-bench-2k-low", "--data-dir", "{tmp}"), "has neither"),
    Bad(("workloads", "show", "gsm8k", "--data-dir", "{tmp}"), "has no test.jsonl"),
    Bad(("workloads", "show", "gsm8k", "--tokenizer", "{tmp}/none"), "is not a directory"),
    Bad(("workloads", "show"), "Missing argument 'name'"),
    Bad(("workloads", "show", "gsm8k", "--sample-chars", "5"), "Invalid value for '--sample"),
    # other commands
    Bad(("lossless", "--pairs", "0"), "--pairs: expected an integer >= 1, got 0"),
    Bad(("lossless", "--seed", "-1"), "--seed: expected an integer >= 0, got -1"),
    Bad(("trace", "--seed", "-1"), "--seed: expected an integer >= 0, got -1"),
    Bad(("trace", "--out", "{tmp}/f"), "is a file", files=(("f", b"x"),)),
    Bad(("tables", "{tmp}/none"), "{tmp}/none"),
    Bad(("report", "{tmp}/none"), "{tmp}/none"),
    Bad(("report", "{tmp}/f"), "{tmp}/f", files=(("f", b"x"),)),
    Bad(("report", "{tmp}"), "{tmp}"),
    Bad(("report",), "Missing argument 'runs'"),
    Bad(("recommend", "{tmp}/none"), "{tmp}/none"),
    Bad(("recommend", "{tmp}"), "{tmp}"),
    Bad(("compare", "{tmp}/a", "{tmp}/b"), "{tmp}/a"),
    Bad(("compare", "{good}", "{tmp}"), "{tmp}"),
    Bad(("compare", "{good}"), "Missing argument"),
    Bad(("compare", "{good}", "{good}", "--tolerance", "nan"), "--tolerance"),
    Bad(("compare", "{good}", "{good}", "--tolerance", "-1"), "--tolerance"),
    Bad(("merge", "{tmp}/none", "--out", "{tmp}/m"), "{tmp}/none"),
    Bad(("merge", "--out", "{tmp}/m"), "Missing argument"),
    Bad(("quality", "explain", "{tmp}/none"), "{tmp}/none"),
    Bad(("quality", "explain", "{good}", "--limit", "0"), "Invalid value for '--limit'"),
    Bad(("estimator", "show", "{tmp}/none"), "{tmp}/none"),
    Bad(("preflight", "--pair", "nope"), "unknown pair 'nope'"),
    Bad(("preflight", "--pair", "tiny-cpu", "--sweep", "nope"), "unknown sweep 'nope'"),
    Bad(("nope",), "No such command 'nope'"),
]

# A line set in one table of a copy of the shipped suites, then `avbench plan` (or a sweep).
PAIR_LINES = [
    ('target = "@assets/../../../../etc/passwd"', "points outside avbench's assets directory"),
    ('target = "@assets/../.."', "points outside avbench's assets directory"),
    ('target = "@assets/tiny/nope"', "'@assets/tiny/nope': no such asset (shipped: tiny/drafter"),
    ('drafter = "@assets/../../x"', "pairs.tiny-cpu.drafter:"),
    (
        'target = "@derived/nope"',
        "pairs.tiny-cpu.target: '@derived/nope': no such derived asset (recipes in derived.toml: tiny-wide)",
    ),
    ("max_k = 0", "pairs.tiny-cpu.max_k: Input should be greater than 0"),
    (f"max_k = {BIG}", "pairs.tiny-cpu.max_k: Input should be less than or equal to 128"),
    ("max_k = 1.5", "pairs.tiny-cpu.max_k: Input should be a valid integer"),
    ("k_values = []", "pairs.tiny-cpu.k_values:"),
    ("k_values = [0]", "pairs.tiny-cpu.k_values:"),
    ("k_values = [1, 500]", "pairs.tiny-cpu.k_values:"),
    ("tensor_parallel = 0", "pairs.tiny-cpu.tensor_parallel: Input should be greater than 0"),
    (f"data_parallel = {BIG}", "pairs.tiny-cpu.data_parallel: Input should be less than"),
    ("ready_timeout_s = inf", "pairs.tiny-cpu.ready_timeout_s: Input should be a finite number"),
    ("ready_timeout_s = nan", "pairs.tiny-cpu.ready_timeout_s: Input should be a finite number"),
    ("ready_timeout_s = -1", "pairs.tiny-cpu.ready_timeout_s: Input should be greater than 0"),
    ("ready_timeout_s = 1e12", "pairs.tiny-cpu.ready_timeout_s: Input should be less than"),
    ("draft_fraction = nan", "pairs.tiny-cpu.draft_fraction: Input should be a finite number"),
    ("draft_fraction = 2", "pairs.tiny-cpu.draft_fraction: Input should be less than"),
    ('confidence_head = "maybe"', "pairs.tiny-cpu.confidence_head: Input should be 'auto'"),
    (
        'capture = ["nope"]',
        "pairs.tiny-cpu.capture.0: Input should be 'drafts', 'refits' or 'steps'",
    ),
    ('default_sweep = "nope"', "pairs.tiny-cpu.default_sweep: unknown sweep 'nope'"),
    ("method = 3", "pairs.tiny-cpu.method: Input should be a valid string"),
    ("colour = 1", "pairs.tiny-cpu.colour: Extra inputs are not permitted"),
    ("env = { A = 1 }", "pairs.tiny-cpu.env.A: Input should be a valid string"),
    ('serve_flags = "x"', "pairs.tiny-cpu.serve_flags: Input should be a valid list"),
    ("target = 7", "pairs.tiny-cpu.target: Input should be a valid string"),
]
SWEEP_LINES = [
    ("concurrencies = [0]", "sweeps.demo.concurrencies: must be a non-empty"),
    (f"concurrencies = [{BIG}]", "sweeps.demo.concurrencies:"),
    ("concurrencies = []", "sweeps.demo.concurrencies:"),
    ('concurrencies = "many"', "sweeps.demo.concurrencies: Input should be a valid list"),
    ("k_values = [0]", "sweeps.demo.k_values:"),
    (f"k_values = [{BIG}]", "sweeps.demo.k_values:"),
    ("requests_per_concurrency = 0", "sweeps.demo.requests_per_concurrency: Input should be"),
    (f"requests_per_concurrency = {BIG}", "sweeps.demo.requests_per_concurrency: Input should"),
    ("requests_per_concurrency = 999999", "a cell would send 3999998 conversations"),
    (f"min_requests = {BIG}", "sweeps.demo.min_requests: Input should be less than or equal"),
    ("max_requests = 0", "sweeps.demo.max_requests: Input should be greater than 0"),
    ("warmup = -1", "sweeps.demo.warmup: Input should be greater than or equal to 0"),
    (f"warmup = {BIG}", "sweeps.demo.warmup: Input should be less than or equal"),
    ("repeats = 0", "sweeps.demo.repeats: Input should be greater than 0"),
    ("repeats = 5000", "sweeps.demo.repeats: Input should be less than or equal to 1000"),
    ("rates = [inf]", "sweeps.demo.rates.0: Input should be a finite number"),
    ("rates = [nan]", "sweeps.demo.rates.0: Input should be a finite number"),
    ("rates = [1e300]", "a cell would send"),
    ("rates = [0.0]", "sweep demo: rates must be a non-empty list of positive req/s"),
    ("rates = [-1.0]", "sweep demo: rates must be a non-empty list of positive req/s"),
    ("rates = []", "sweep demo: rates must be a non-empty list of positive req/s"),
    ("max_failed_share = 1.0", "sweeps.demo.max_failed_share: Input should be less than 1"),
    ("max_failed_share = nan", "sweeps.demo.max_failed_share: Input should be a finite number"),
    ("draft_fraction = 0", "sweeps.demo.draft_fraction: Input should be greater than 0"),
    ("sampling = { temperature = inf }", "sweeps.demo.sampling.temperature: Input should be a"),
    ("sampling = { temperature = nan }", "sweeps.demo.sampling.temperature: Input should be a"),
    ("sampling = { temperature = -1.0 }", "sweeps.demo.sampling.temperature: Input should be"),
    ("sampling = { top_p = 0 }", "sweeps.demo.sampling.top_p: Input should be greater than 0"),
    (f"sampling = {{ max_tokens = {BIG} }}", "sweeps.demo.sampling.max_tokens: Input should be"),
    ("sampling = { max_tokens = 0 }", "sweeps.demo.sampling.max_tokens: Input should be greater"),
    (f"sampling = {{ seed = {BIG} }}", "sweeps.demo.sampling.seed: Input should be less than"),
    ("sampling = { heat = 1 }", "sweeps.demo.sampling.heat: Extra inputs are not permitted"),
    ("sampling = 5", "sweeps.demo.sampling: Input should be a valid dictionary"),
    ("timeouts = { stall_s = 0 }", "sweeps.demo.timeouts.stall_s: Input should be greater than 0"),
    ("timeouts = { stall_s = inf }", "sweeps.demo.timeouts.stall_s: Input should be a finite"),
    ("timeouts = { read_s = nan }", "sweeps.demo.timeouts.read_s: Input should be a finite"),
    ("timeouts = { cell_s = -1 }", "sweeps.demo.timeouts.cell_s: Input should be greater than 0"),
    ("timeouts = { request_s = 1e12 }", "sweeps.demo.timeouts.request_s: Input should be less"),
    ("timeouts = { stall = 5 }", "sweeps.demo.timeouts.stall: Extra inputs are not permitted"),
    ("timeouts = 5", "sweeps.demo.timeouts: Input should be a valid dictionary"),
    ('arms = ["nope"]', "sweeps.demo.arms.0: Input should be 'baseline'"),
    ("arms = []", "sweep demo: arms is empty"),
    ('static_k = "some"', "sweeps.demo.static_k: Input should be 'all' or 'max'"),
    ("schedule = [[1, 2]]", "sweeps.demo.schedule.0"),
    ('arms = ["dyn"]', "a dyn arm needs a schedule"),
    ('draft_sample_method = "greedy"', "draft_sample_method 'greedy' with an av arm"),
    ("workloads = []", "sweeps.demo.workloads: List should have at least 1 item"),
    ('workloads = ["nope"]', "sweeps.demo.workloads: unknown workload 'nope'"),
    ('pairs = ["nope"]', "sweeps.demo.pairs: unknown pair 'nope'"),
    ("rotate_workloads = 3", "sweeps.demo.rotate_workloads: Input should be a valid boolean"),
]
WORKLOAD_LINES = [
    ("max_input_tokens = 0", "workloads.gsm8k-tiny.max_input_tokens: Input should be greater"),
    (f"max_input_tokens = {BIG}", "workloads.gsm8k-tiny.max_input_tokens: Input should be less"),
    ("limit = 0", "workloads.gsm8k-tiny.limit: Input should be greater than 0"),
    ("seed = -1", "workloads.gsm8k-tiny.seed: Input should be greater than or equal to 0"),
    (f"seed = {BIG}", "workloads.gsm8k-tiny.seed: Input should be less than or equal"),
    ('dataset = "nope"', "workloads.gsm8k-tiny.dataset: Input should be 'gsm8k'"),
    ('subset = "throughput_2k"', "subset and category apply to dataset 'speed-bench'"),
    ("input_len = 10", "input_len, output_len and len_range apply to dataset 'synthetic'"),
    ('api = "grpc"', "workloads.gsm8k-tiny.api: Input should be 'chat' or 'completions'"),
    ('prompt_template = "x"', "workloads.gsm8k-tiny.prompt_template: Input should be 'chat'"),
    ("colour = 1", "workloads.gsm8k-tiny.colour: Extra inputs are not permitted"),
]
SPEED_LINES = [  # a SPEED-Bench workload "sb" added to the suites: checked at load
    ('subset = "throughput_3k"', "subset 'throughput_3k' is not a SPEED-Bench subset"),
    ('subset = "throughput_2k"\ncategory = "coding"', "category 'coding' is not in SPEED-Bench"),
    ('category = "low_entropy"', "category 'low_entropy' is not in SPEED-Bench qualitative"),
]
# A SPEED-Bench workload a sweep selects: its data is read before any server starts.
SB = 'dataset = "speed-bench"\nsubset = "throughput_2k"\n'
SPEED_SWEEPS = [
    (SB + 'data_dir = "{tmp}/none"', "SPEED-Bench data_dir {tmp}/none does not exist", ()),
    (
        SB + 'data_dir = "{tmp}"',
        "has neither throughput_2k.jsonl nor throughput_2k/test.parquet",
        (),
    ),
    (SB, "HF_HUB_OFFLINE is set", ()),
    (
        SB + 'data_dir = "{tmp}"',
        "are placeholders",
        (
            (
                "throughput_2k.jsonl",
                json.dumps(
                    {
                        "question_id": 1,
                        "category": "low_entropy",
                        "turns": ["FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE x"],
                    }
                ).encode(),
            ),
        ),
    ),  # fmt: skip
    (
        SB + 'data_dir = "{tmp}"',
        "not a text JSON Lines file",
        (("throughput_2k.jsonl", b"\xff\xfe"),),
    ),
    (
        SB + 'data_dir = "{tmp}"',
        "missing field 'question_id'",
        (("throughput_2k.jsonl", b'{"category": "mixed", "turns": ["hi"]}\n'),),
    ),
    ('dataset = "gsm8k"\ndata_dir = "{tmp}/none"', "has no test.jsonl", ()),
]
RAW_SUITES = [
    ("pairs.toml", b"[pairs.tiny-cpu\n", "pairs.toml: not valid TOML"),
    ("pairs.toml", b"\xff\xfe[pairs]\n", "pairs.toml: not UTF-8 text (byte 0 is 0xff)"),
    (
        "sweeps.toml",
        b"[sweeps.demo]\nworkloads = [\xe9]\n",
        "sweeps.toml: not UTF-8 text (byte 27 is 0xe9)",
    ),
    ("workloads.toml", "# caf\u00e9\n".encode("latin-1"), "workloads.toml: not UTF-8 text (byte 5"),
    ("pairs.toml", b"pairs = 1\n", "pairs.toml: pairs: expected a table of named entries"),
    ("pairs.toml", b"[pairs]\nx = 1\n", "pairs.toml: pairs.x: expected a table, got int"),
    ("sweeps.toml", b"[sweep.demo]\n", "sweeps.toml: unknown top-level key(s) ['sweep']"),
    ("pairs.toml", b"", "sweeps.nightly.pairs: unknown pair 'mimo-dflash'"),
]


SUITES = (
    [Bad(PLAN, says, suite=("pairs.toml", "pairs.tiny-cpu", ln)) for ln, says in PAIR_LINES]
    + [Bad(PLAN, says, suite=("sweeps.toml", "sweeps.demo", ln)) for ln, says in SWEEP_LINES]
    + [Bad(PLAN, s, suite=("workloads.toml", "workloads.gsm8k-tiny", ln)) for ln, s in WORKLOAD_LINES]
    + [Bad(PLAN, says, suite=("workloads.toml", "workloads.sb", 'dataset = "speed-bench"\n' + ln))
       for ln, says in SPEED_LINES]
    + [
        Bad((*SUITE_SWEEP, "--workloads", "sb"), says, suite=("workloads.toml", "workloads.sb", ln),
            files=files)
        for ln, says, files in SPEED_SWEEPS
    ]
    + [Bad(PLAN, says, raw_suite=(f, content)) for f, content, says in RAW_SUITES]
)  # fmt: skip

MANIFEST = "manifest.json"
RUN_DIRS = [  # `avbench sweep --resume` of a run whose manifest was damaged or edited
    (b"{}", "not a sweep manifest (no 'pair' key)"),
    (b"[]", "a JSON list"),
    (b"\x00\xff\x10binary", "not JSON"),
    (b'{"run_id": "r", "pair"', "not JSON"),
    (b"null", "manifest.json"),
]
MANIFEST_EDITS = [  # (edit of the good manifest, message)
    (lambda m: m | {"plan": "everything"}, "not a sweep manifest"),
    (lambda m: m | {"pair": m["pair"] | {"flavour": 1}}, "pair.flavour"),
    (lambda m: m | {"sweep": m["sweep"] | {"timeouts": {"stall_s": -1}}}, "sweep.timeouts.stall_s"),
    (lambda m: m | {"arms": [m["arms"][0] | {"k": 0}]}, "K must be 1-128"),
    (lambda m: m | {"sweep": m["sweep"] | {"concurrencies": [0]}}, "sweep.concurrencies"),
    (lambda m: m | {"pair": m["pair"] | {"target": "@assets/../../etc"}}, "pair.target"),
]

ROWS = [b"{}", b"[1, 2]", b'"hello"', b"null", b"42", b'{"arm": "static-k3"}']
ROW_COMMANDS = [
    ("report", "{run}", "--no-figures"),
    ("recommend", "{run}"),
    ("compare", "{good}", "{run}"),
    ("sweep", "--resume", "{run}", "--no-report"),
    ("quality", "explain", "{run}"),
]
ROW_CASES = [
    Bad(cmd, f, code=-1, run=(f, row + b"\n"))
    for f in ("cells.jsonl", "failures.jsonl")
    for row in ROWS
    for cmd in ROW_COMMANDS
    if f == "cells.jsonl" or cmd[0] == "report"
] + [  # resume never reads failures.jsonl: a bad row there changes nothing
    Bad(ROW_COMMANDS[3], "", code=-1, run=("failures.jsonl", row + b"\n")) for row in ROWS
]


def _manifest_cases() -> list[Bad]:
    out = [Bad(("sweep", "--resume", "{run}"), says, run=(MANIFEST, c)) for c, says in RUN_DIRS]
    out += [
        Bad(("sweep", "--resume", "{run}"), says, run=(MANIFEST, edit))
        for edit, says in MANIFEST_EDITS
    ]
    out += [Bad(("report", "{run}", "--no-figures"), "manifest.json", run=(MANIFEST, b"[]"))]
    out += [Bad(("compare", "{good}", "{run}"), "manifest.json", run=(MANIFEST, b"{oops"))]
    return out


CASES = OPTIONS + SUITES + _manifest_cases() + ROW_CASES


def _id(case: Bad) -> str:
    what = case.suite[2] if case.suite else case.raw_suite[0] if case.raw_suite else ""
    if case.run:
        what = f"{case.run[0]}={case.run[1]!r:.30}" if not callable(case.run[1]) else case.says
    return " ".join(a for a in case.args if a not in SWEEP[1:] + ("--results",))[:60] + " " + what


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def servers():
    """The project's scripted streaming server (stands in for vLLM; what is under test is the
    input checking), one without vLLM's /tokenize (like other OpenAI-style servers)."""
    with serve_in_thread(ServerConfig(model="tiny-target", output_tokens=4)) as fake:
        with serve_in_thread(ServerConfig(model="m", tokenize=False)) as notok:
            with socket.socket() as busy, socket.socket() as closed:
                busy.bind(("127.0.0.1", 0))
                busy.listen()
                closed.bind(("127.0.0.1", 0))  # bound, never listening: refuses
                yield {
                    "fake": fake.base_url,
                    "notok": notok.base_url,
                    "busy": str(busy.getsockname()[1]),
                    "closed": f"http://127.0.0.1:{closed.getsockname()[1]}",
                }


@pytest.fixture(scope="module")
def good_run(servers, tmp_path_factory) -> Path:
    """A finished attached run (two requests), the template of every run-directory row."""
    results = tmp_path_factory.mktemp("good")
    names = {"fake": servers["fake"], "tmp": str(results)}
    code, _ = _main([_fill(a, names) for a in ATTACH] + ["--run-id", "r"])
    assert code == 0
    return results / "results" / "r"


def _main(argv: list[str]) -> tuple[int, str]:
    """avbench.cli.main in this process: (exit code, stderr)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    err = io.StringIO()
    old_argv = sys.argv
    sys.argv = ["avbench", *argv]
    try:
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            try:
                avbench.cli.main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old_argv
    return code, err.getvalue()


@pytest.fixture
def no_server(monkeypatch):
    """A row that reaches a server start or the vLLM pre-flight was not checked at the edge."""
    import avbench.commands.sweep
    from avbench.serving.server import ServerProcess

    def refuse(*a, **k):
        print("bad input reached a vLLM server start or pre-flight", file=sys.stderr)
        raise SystemExit(99)

    monkeypatch.setattr(ServerProcess, "start", refuse)
    monkeypatch.setattr(avbench.commands.sweep, "_preflight", refuse)


def _prepare(case: Bad, tmp: Path, servers: dict, good: Path | None) -> list[str]:
    names = dict(servers, tmp=str(tmp), suites=str(tmp / "suites"), run=str(tmp / "run"))
    names["good"] = str(good) if good else ""
    for rel, content in case.files:
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    if case.suite or case.raw_suite:
        shutil.copytree(REPO / "avbench" / "suites", tmp / "suites")
        if case.raw_suite:
            (tmp / "suites" / case.raw_suite[0]).write_bytes(case.raw_suite[1])
        else:
            _set_line(tmp / "suites" / case.suite[0], *case.suite[1:], names)
    if case.run:
        shutil.copytree(good, tmp / "run")
        target = tmp / "run" / case.run[0]
        content = case.run[1]
        if callable(content):
            content = json.dumps(content(json.loads(target.read_text()))).encode()
        if case.run[0].endswith(".jsonl") and target.exists():
            content = target.read_bytes() + content  # a bad row after the good ones
        target.write_bytes(content)
    return [_fill(a, names) for a in case.args]


def _fill(text: str, names: dict) -> str:
    for k, v in names.items():
        text = text.replace("{" + k + "}", v)
    return text


def _set_line(path: Path, table: str, line: str, names: dict) -> None:
    """Set ``line`` (``key = value`` lines) in ``[table]`` of a TOML file, adding the table."""
    line = _fill(line, names)
    keys = {ln.split("=", 1)[0].strip() for ln in line.splitlines()}
    text = path.read_text()
    header = f"[{table}]\n"
    if header not in text:
        text += f"\n{header}"
    head, _, rest = text.partition(header)
    body, sep, tail = rest.partition("\n[")
    kept = [ln for ln in body.splitlines() if ln.split("=", 1)[0].strip() not in keys]
    path.write_text(head + header + line + "\n" + "\n".join(kept) + "\n" + sep + tail)


# ----------------------------------------------------------------------------- the test
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_bad_input_never_exits_4_and_says_one_line(
    case, servers, good_run, tmp_path, no_server, monkeypatch
):
    argv = _prepare(case, tmp_path, servers, good_run)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for k, v in case.env:
        monkeypatch.setenv(k, v)
    code, err = _main(argv)
    says = _fill(case.says, {"tmp": str(tmp_path)})
    assert code != 4, err
    assert "Traceback" not in err, err
    if case.code == -1:  # a bad row: skipped with a warning naming the file, never exit 4
        assert says in err, err
        return
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert code == case.code, err
    assert says in lines[0], err


def test_the_list_holds_at_least_200_invocations():
    assert len(CASES) >= 200, len(CASES)
