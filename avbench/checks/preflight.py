"""Pre-flight: check every arm's vLLM command line against the installed vLLM, in seconds.

Each arm's exact argv (``avbench.serving.server.build_command``) is parsed by the installed vLLM's own
server argument parser, in a subprocess of the vLLM interpreter, and the keys (and literal-typed
values such as ``method``) of ``--speculative-config`` are checked against that version's
``SpeculativeConfig`` fields; the checks vLLM's server entry runs right after parsing
(``validate_parsed_serve_args``) run too, and a drafter that is a folder of a Hugging Face
repository must be in the local cache (``avbench.inputs.checkpoints``). Nothing is loaded beyond vLLM's
Python modules: no model, no tokenizer, no GPU. One subprocess checks every arm of every pair, so the cost is one import of
vLLM (about 8 s on 2 cores) however many arms there are. Its answer for each command line is
kept under ``$AVBENCH_CACHE/preflight``, per interpreter, ``VLLM_*`` environment and vLLM files
(their count, sizes and newest change): a resumed run, a nightly's second sweep or any check of
lines already parsed skips the import.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from avbench.assets.derived import cache_root
from avbench.checks.av_start import PARSER_MODULES, AvStart, av_start_checks
from avbench.errors import AvbenchError, ServerError, UnsupportedArm
from avbench.inputs.suite import Pair, Sweep
from avbench.plan.cells import Arm
from avbench.serving.server import (
    VLLM_MODULE,
    VllmInstall,
    build_command,
    check_arm_supported,
    missing_checkpoints,
    probe_vllm,
    require_vllm,
)

_MARK = "AVBENCH-PREFLIGHT "


# Runs in the vLLM interpreter. `error` raises instead of exiting so every arm is parsed by one
# parser; each parsed argv then gets the checks the server's entry runs before loading anything
# (validate_parsed_serve_args).
_CHECK = r"""
import dataclasses, importlib, json, sys, typing
from vllm.utils.argparse_utils import FlexibleArgumentParser

spec = json.load(sys.stdin)
tried = []
for name in spec["modules"]:
    try:
        cli_args = importlib.import_module(name)
        make_arg_parser = cli_args.make_arg_parser
        break
    except (ImportError, AttributeError) as exc:
        tried.append(f"{name} ({type(exc).__name__}: {' '.join(str(exc).split())})")
else:
    print(__MARK__ + json.dumps({"no_parser": tried}))
    sys.exit(0)
validate = getattr(cli_args, "validate_parsed_serve_args", None)
from vllm.config import SpeculativeConfig

class ParseError(Exception):
    pass

class Parser(FlexibleArgumentParser):
    def error(self, message):
        raise ParseError(message)

def literals(tp):
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Literal:
        return list(args)
    out = []
    for a in args:
        if a is type(None):
            continue
        sub = literals(a)
        if not sub:
            return []
        out += sub
    return out

parser = make_arg_parser(Parser(description="avbench pre-flight"))
fields = {f.name: literals(f.type) for f in dataclasses.fields(SpeculativeConfig) if f.init}
results = []
for argv in spec["argvs"]:
    try:
        ns = parser.parse_args(argv)
    except ParseError as exc:
        results.append({"error": str(exc), "speculative_config": None})
        continue
    error = None
    try:
        if validate is not None:
            validate(ns)
    except (TypeError, ValueError) as exc:
        error = str(exc)
    results.append({"error": error, "speculative_config": getattr(ns, "speculative_config", None)})
flags = sorted(o for o in parser._option_string_actions if o.startswith("--"))
print(__MARK__ + json.dumps({"module": name, "fields": fields, "flags": flags, "results": results}))
""".replace("__MARK__", repr(_MARK))


class PreflightError(AvbenchError):
    """One or more arms would not even start: their command line is wrong for this vLLM."""


@dataclass(frozen=True)
class Problem:
    """One unknown flag, speculative-config key or value, as a single line."""

    pair: str
    arm: str
    key: str
    message: str
    vllm: str
    where: str | None = None  # "pairs.toml:12" when the offending text is in the pair file

    def line(self) -> str:
        where = f" ({self.where})" if self.where else ""
        message = " ".join(self.message.split())
        return f"pair {self.pair}, arm {self.arm}: {message}{where} [vLLM {self.vllm}]"


@dataclass
class PreflightReport:
    install: VllmInstall
    checked: list[tuple[str, str]] = field(default_factory=list)  # (pair, arm) parsed
    unsupported: list[tuple[str, str, str]] = field(default_factory=list)  # (pair, arm, reason)
    problems: list[Problem] = field(default_factory=list)  # of arms a sweep would start
    notes: list[Problem] = field(default_factory=list)  # of unsupported arms (never started)
    parser: str | None = None  # the module whose make_arg_parser parsed them
    av_start: list[AvStart] = field(default_factory=list)  # vLLM's AV start-up checks, per AV arm

    @property
    def ok(self) -> bool:
        return not self.problems

    def refused(self, pair: str) -> dict[str, str]:
        """Arm -> reason, for the arms of ``pair`` this vLLM would not run (never started)."""
        return {arm: reason for p, arm, reason in self.unsupported if p == pair}

    def verdicts(self) -> list[tuple[str, str, str]]:
        """(pair, arm, "startable" or "unsupported: <reason>") for every arm checked."""
        why = {(p, a): r for p, a, r in self.unsupported}
        return [
            (p, a, f"unsupported: {why[p, a]}" if (p, a) in why else "startable")
            for p, a in self.checked
        ]


@dataclass(frozen=True)
class Target:
    """One arm of one pair to check; ``pairs_file`` lets problems point at a line."""

    pair: Pair
    arm: Arm
    pairs_file: Path | None = None
    sweep: Sweep | None = None  # the sweep shapes the command (draft method, attention backend)


def preflight(targets: list[Target], python: str, *, timeout_s: float = 300) -> PreflightReport:
    """Parse every target's server command line with the vLLM installed for ``python``.

    Arms this vLLM cannot run (``check_arm_supported``, and for AV arms vLLM's own start-up
    checks, ``avbench.checks.av_start``) are parsed too, but their problems are notes, not
    failures: a sweep reports such arms as unsupported without starting a server.
    """
    install = probe_vllm(python)
    require_vllm(install)
    report = PreflightReport(install)
    if not targets:
        return report
    argvs = [_server_argv(t, python) for t in targets]
    known = _check_kept(install, argvs, timeout_s)
    report.parser = known.get("module")
    version = f"{install.distribution} {install.version}"
    av: list[Target] = []
    for t, res in zip(targets, known["results"], strict=True):
        report.checked.append((t.pair.name, t.arm.name))
        problems = _problems(t, res, known, version)
        problems += [
            Problem(t.pair.name, t.arm.name, ref, line, version, _where(t, ref))
            for ref, line in missing_checkpoints(t.pair, t.arm)
        ]
        try:
            check_arm_supported(t.pair, t.arm, install)
        except UnsupportedArm as exc:
            report.unsupported.append((t.pair.name, t.arm.name, str(exc)))
            report.notes += problems
            continue
        if t.arm.kind == "av" and not problems:
            av.append(t)
        report.problems += problems
    _check_av_start(report, av, python)
    return report


def _check_av_start(report: PreflightReport, targets: list[Target], python: str) -> None:
    """vLLM's own AV start-up checks of the AV arms whose command line is sound: an arm they
    refuse becomes unsupported, with vLLM's reason."""
    if not targets or report.parser is None:
        return
    jobs = [(t.pair, t.arm, t.sweep) for t in targets]
    report.av_start = av_start_checks(jobs, python, (report.parser,))
    vllm = f"{report.install.distribution} {report.install.version}"
    for res in report.av_start:
        reason = res.reason(vllm)
        if reason is not None:
            report.unsupported.append((res.pair, res.arm, reason))


def require_preflight(
    targets: list[Target], python: str, echo: Callable[[str], None] = print
) -> PreflightReport:
    """Echo every problem (one line each), then raise PreflightError (exit code 2)."""
    report = preflight(targets, python)
    for p in report.problems:
        echo(p.line())
    if report.problems:
        raise PreflightError(
            f"pre-flight: {len(report.problems)} problem(s) in the server command lines "
            "(listed above); no server was started"
        )
    return report


def _server_argv(t: Target, python: str) -> list[str]:
    # The port is irrelevant to parsing; any valid one will do.
    cmd = build_command(t.pair, t.arm, port=8000, python=python, sweep=t.sweep)
    if cmd[1:3] != ["-m", VLLM_MODULE]:
        raise AssertionError(f"unexpected server command shape: {cmd[:3]}")
    return cmd[3:]


def _install_stamp(package_dir: str) -> list[int]:
    """How many Python files the vLLM package has, their total size and newest change: an
    upgrade, a reinstall or an edit of an editable checkout moves it (a walk of about 0.1 s)."""
    count = size = newest = 0
    for folder, _, names in os.walk(package_dir):
        for name in names:
            if name.endswith(".py"):
                st = os.stat(os.path.join(folder, name))
                count, size, newest = count + 1, size + st.st_size, max(newest, st.st_mtime_ns)
    return [count, size, newest]


def _check_kept(install: VllmInstall, argvs: list[list[str]], timeout_s: float) -> dict:
    """The parser's answer for ``argvs``: each command line's verdict kept from an earlier check
    under the same installation, the rest parsed (one import) and kept. Without a vLLM package
    folder to stamp nothing is kept."""
    if install.package_dir is None:
        return _run_check(install.python, argvs, timeout_s)
    folder = cache_root() / "preflight" / _install_key(install, install.package_dir)
    files = [folder / f"{_digest(argv)}.json" for argv in argvs]
    kept = [_read_kept(f) for f in files]
    parser = _read_kept(folder / "parser.json")
    todo = [i for i, k in enumerate(kept) if k is None]
    if parser is None or todo:
        known = _run_check(install.python, [argvs[i] for i in todo] or argvs, timeout_s)
        results = known.pop("results")
        parser = known
        _keep(folder / "parser.json", parser)
        for i, res in zip(todo or range(len(argvs)), results, strict=True):
            kept[i] = res
            _keep(files[i], res)
    return parser | {"results": kept}


def _install_key(install: VllmInstall, package_dir: str) -> str:
    """What a parse depends on besides the command line."""
    env = [(k, v) for k, v in os.environ.items() if k.startswith("VLLM_") or k == "PYTHONPATH"]
    return _digest(
        {
            "python": os.path.realpath(install.python),
            "vllm": [install.distribution, install.version, package_dir],
            "stamp": _install_stamp(package_dir),
            "env": sorted(env),
            "modules": list(PARSER_MODULES),
            "check": _CHECK,
        }
    )


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]


def _read_kept(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # none kept, or torn: parsed again


def _keep(path: Path, value: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(value))
        tmp.replace(path)
    except OSError:
        pass  # a cache that cannot be written only costs the next check its import


def _run_check(python: str, argvs: list[list[str]], timeout_s: float) -> dict:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        res = subprocess.run(
            [python, "-c", _CHECK],
            input=json.dumps({"modules": list(PARSER_MODULES), "argvs": argvs}),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ServerError(
            f"pre-flight: vLLM's argument parser did not answer in {timeout_s:g} s"
        ) from None
    for line in reversed(res.stdout.splitlines()):
        if line.startswith(_MARK):
            known = json.loads(line[len(_MARK) :])
            if "no_parser" in known:
                raise ServerError(
                    f"pre-flight: vLLM's server argument parser (make_arg_parser) is in none of "
                    f"the modules tried with {python}: {'; '.join(known['no_parser'])}"
                )
            return known
    tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or ["no output"]
    raise ServerError(
        f"pre-flight: could not load vLLM's argument parser with {python} "
        f"(exit {res.returncode}): {tail[0]}"
    )


_UNRECOGNIZED = "unrecognized arguments:"


def _hint(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _problems(t: Target, res: dict, known: dict, version: str) -> list[Problem]:
    fields = known["fields"]
    out: list[Problem] = []

    def add(key: str, message: str, needle: str | None) -> None:
        where = _where(t, needle) if needle else None
        out.append(Problem(t.pair.name, t.arm.name, key, message, version, where))

    err = res["error"]
    if err and err.startswith(_UNRECOGNIZED):
        rest = err[len(_UNRECOGNIZED) :]
        for flag in [x for x in rest.split() if x.startswith("-")] or [rest.strip()]:
            name = flag.split("=", 1)[0]
            add(flag, f"unknown vLLM flag {flag}{_hint(name, known['flags'])}", name)
    elif err:
        flag = m.group(1) if (m := re.search(r"argument (\S+?)[:/ ]", err)) else ""
        add(flag, f"vLLM rejects the command line: {err}", flag)
    for key, value in (res["speculative_config"] or {}).items():
        name = key.replace("-", "_")  # vLLM normalises keys the same way
        if name not in fields:
            add(key, f"unknown --speculative-config key {key!r}{_hint(name, list(fields))}", key)
        elif fields[name] and isinstance(value, str) and value not in fields[name]:
            add(
                key,
                f"--speculative-config {key}={value!r} is not a value this vLLM accepts"
                + (_hint(value, fields[name]) or f" ({len(fields[name])} known)"),
                value,
            )
    return out


def _where(t: Target, needle: str) -> str | None:
    """The pairs.toml line of this pair's table that mentions ``needle``, else its header."""
    if t.pairs_file is None or not t.pairs_file.exists():
        return None
    lines = t.pairs_file.read_text(encoding="utf-8").splitlines()
    header = re.compile(rf"^\s*\[pairs\.\"?{re.escape(t.pair.name)}\"?\]\s*(#.*)?$")
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        return None
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(r"\s*\[+\s*[A-Za-z_\"]", lines[i])),
        len(lines),
    )
    for i in range(start + 1, end):
        if needle and needle in lines[i].split("#", 1)[0]:
            return f"{t.pairs_file.name}:{i + 1}"
    return f"{t.pairs_file.name}:{start + 1}"
