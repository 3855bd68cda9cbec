"""`avbench workloads` and `avbench workloads show NAME` through the real CLI app."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from avbench.cli import app
from avbench.errors import WorkloadError
from avbench.workloads.registry import builtin_workloads

runner = CliRunner(env={"COLUMNS": "200"})


def test_show_gsm8k(data_root):
    import hashlib

    result = runner.invoke(app, ["workloads", "show", "gsm8k"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "1319" in out
    assert hashlib.sha256((data_root / "gsm8k" / "test.jsonl").read_bytes()).hexdigest() in out
    for col in (
        "p50",
        "p90",
        "p99",
        "max",
        "approx:ceil(chars/4)",
        "1-turn: 1319",
        "sample: gsm8k/",
    ):
        assert col in out


def test_show_mt_bench_categories_and_turns():
    result = runner.invoke(app, ["workloads", "show", "mt-bench", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "2-turn: 80" in result.output
    assert "turn 1 of 2" in result.output
    for cat in ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem"):
        assert cat in result.output


def test_show_speed_bench_fixture(speed_dir):
    args = ["workloads", "show", "speed-bench-2k-high", "--data-dir", str(speed_dir)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "high_entropy" in result.output and "NOT SPEED-Bench" in result.output


def test_plain_workloads_lists_builtins():
    for args in (["workloads"], ["workloads", "list"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        for name in builtin_workloads():
            assert name in result.output


def test_unknown_name_is_a_workload_error():
    result = runner.invoke(app, ["workloads", "show", "gsm9k"])
    assert isinstance(result.exception, WorkloadError)
    assert "unknown workload 'gsm9k'" in str(result.exception)


def test_missing_speed_bench_prints_one_line(tmp_path, capsys, monkeypatch):
    import sys

    from avbench import cli

    monkeypatch.setattr(
        sys,
        "argv",
        ["avbench", "workloads", "show", "speed-bench-2k-low", "--data-dir", str(tmp_path / "x")],
    )
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: SPEED-Bench data_dir") and "\n" not in err


def test_show_with_tokenizer_and_cap(tiny_tokenizer):
    args = ["workloads", "show", "gsm8k", "--tokenizer", str(tiny_tokenizer)]
    result = runner.invoke(app, [*args, "--max-input-tokens", "40", "--limit", "10"])
    assert result.exit_code == 0, result.output
    # A long path wraps inside the table title: compare without the wrapping whitespace.
    assert f"tokenizer:{tiny_tokenizer}" in "".join(result.output.split())
    assert "conversations     10" in result.output
    assert "max_input_tokens=40" in result.output
