"""Commands made from request models (avbench/commands/request.py): every command's options are
its model's fields, Typer parses them as written, and a bad value is one line naming the option."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pytest
import typer
from pydantic import ValidationError, field_validator
from typer.testing import CliRunner

from avbench.cli import app
from avbench.commands.request import IntList, NameList, Request, command, invalid, parse
from avbench.errors import AvbenchError
from avbench.testing.cli import run_cli

# Not generated from a request: the workloads group's own callback (`avbench workloads` alone
# lists them, as `workloads list` does).
NOT_REQUESTS = {"workloads"}


def _commands(group, prefix: str = "") -> list:
    """(name, command) of every command and group under ``group`` (typer's own click)."""
    found = []
    for name, cmd in group.commands.items():
        path = f"{prefix}{name}"
        if hasattr(cmd, "commands"):
            found += _commands(cmd, path + " ")
        found.append((path, cmd))
    return found


COMMANDS = [c for c in _commands(typer.main.get_command(app)) if c[0] not in NOT_REQUESTS]


def test_every_command_is_listed():
    names = {name for name, _ in COMMANDS}
    assert {"sweep", "plan", "pairs", "trace", "compare", "workloads show", "quality explain"} <= (
        names
    )


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_options_come_from_the_request_model(name, cmd):
    if hasattr(cmd, "commands"):
        pytest.skip("a group: its commands are checked")
    model = getattr(cmd.callback, "request_model", None)
    assert model is not None and issubclass(model, Request), name
    params = [p for p in cmd.params if p.name != "help"]
    assert [p.name for p in params] == list(model.model_fields)
    help_text = CliRunner().invoke(app, [*name.split(), "--help"], env={"COLUMNS": "300"}).output
    for p in params:
        if p.param_type_name == "option":
            assert model.flag(p.name) in p.opts, (name, p.name, p.opts)
            assert model.flag(p.name) in help_text, (name, p.name)
            field = model.model_fields[p.name]
            assert p.required == field.is_required(), p.name
            assert p.required or p.default == field.default, p.name


class Demo(Request):
    """A request using each kind of option the commands use."""

    count: Annotated[int, typer.Option("--count", "-n", help="how many")] = 1
    ks: Annotated[IntList, typer.Option("--k", help="K list")] = None
    names: Annotated[NameList, typer.Option(help="names")] = None
    report: Annotated[bool, typer.Option(help="write it")] = True
    path: Annotated[list[Path] | None, typer.Option("--from", help="runs; repeatable")] = None
    run: Annotated[Path, typer.Argument(help="a run")]

    @field_validator("count")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"expected an integer >= 1, got {v}")
        return v


def _invoke(*args: str):
    seen: list[Demo] = []
    demo_app = typer.Typer()
    demo_app.command("a")(command(Demo)(seen.append))
    demo_app.command("b")(lambda: None)  # two commands: `a` is then a subcommand
    return CliRunner().invoke(demo_app, ["a", *args]), seen


def test_typer_parses_the_fields_as_declared(tmp_path):
    res, seen = _invoke(str(tmp_path), "-n", "3", "--k", "1,3", "--names", "x,y", "--no-report",
                        "--from", "r1", "--from", "r2")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert seen == [
        Demo(
            count=3,
            ks=[1, 3],
            names=["x", "y"],
            report=False,
            path=[Path("r1"), Path("r2")],
            run=tmp_path,
        )  # fmt: skip
    ]
    res, seen = _invoke(str(tmp_path))
    assert seen[0].report is True and seen[0].ks is None and seen[0].count == 1


def test_a_bad_value_names_the_option_it_came_from(tmp_path):
    res, _ = _invoke(str(tmp_path), "--k", "1,x")
    assert isinstance(res.exception, AvbenchError)
    assert str(res.exception) == "--k: expected a comma-separated list of integers, got '1,x'"
    res, _ = _invoke(str(tmp_path), "-n", "0")
    assert str(res.exception) == "--count: expected an integer >= 1, got 0"


def test_the_formatter_names_a_field_path_or_a_flag():
    from avbench.inputs.suite import Sweep

    with pytest.raises(ValidationError) as bad:
        Sweep.model_validate({"name": "s", "workloads": ["w"], "sampling": {"top_p": 2}})
    line = str(invalid(bad.value, "command-line override"))
    assert line.startswith("command-line override sampling.top_p: Input should be")
    with pytest.raises(AvbenchError, match=r"^--k: expected a comma-separated list"):
        parse(Demo, {"run": "r", "ks": "a"})
    with pytest.raises(AvbenchError, match="^RUN: Field required$"):
        parse(Demo, {})


def test_a_bad_option_is_one_line_from_the_command_line():
    res = run_cli("plan", "--pair", "tiny-cpu", "--concurrencies", "a,b")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: --concurrencies: expected a comma-separated list of integers, got 'a,b'"
    ]
