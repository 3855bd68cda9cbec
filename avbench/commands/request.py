"""Commands made from typed request models: one pydantic model per command, validated once.

A request field carries its command-line metadata as a `typer.Option` / `typer.Argument` in
its ``Annotated`` type; `command` turns the model into the Typer command, so the flags, their
help and defaults, and the checks on what was typed live in one place. A field whose typed
value differs from what Typer parses (``1,4,16`` → ``[1, 4, 16]``) says what Typer sees with
`CliType` and converts in a validator.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from typer.models import ParameterInfo

from avbench.errors import AvbenchError
from avbench.inputs.checks import validation_error

R = TypeVar("R", bound="Request")


class Request(BaseModel):
    """What one command was asked, checked: the command body reads only this."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def flag(cls, field: str) -> str:
        """The option a field is typed as (``k_values`` → ``--k``); an argument's metavar."""
        info = cli_info(cls, field)
        if isinstance(info, typer.models.ArgumentInfo):
            return field.upper()
        # In Annotated, typer.Option("--x") holds its first name where a default would be.
        given = [info.default, *(info.param_decls or ())]
        decls = [d.split("/")[0] for d in given if isinstance(d, str) and d.startswith("--")]
        return decls[0] if decls else "--" + field.replace("_", "-")

    @classmethod
    def flags(cls) -> dict[str, str]:
        return {name: cls.flag(name) for name in cls.model_fields}

    def changed(self, fields: tuple[str, ...]) -> list[str]:
        """The flags among ``fields`` given a value other than their default."""
        return [
            self.flag(f)
            for f in fields
            if getattr(self, f) not in (None, type(self).model_fields[f].default)
        ]


class CliType:
    """The type Typer parses for a field whose validated type differs (a CSV list; an
    interpreter that defaults from the environment)."""

    def __init__(self, annotation: object) -> None:
        self.annotation = annotation


def cli_info(model: type[BaseModel], field: str) -> ParameterInfo:
    found = [m for m in model.model_fields[field].metadata if isinstance(m, ParameterInfo)]
    if len(found) != 1:
        raise TypeError(f"{model.__name__}.{field}: expected one typer.Option or typer.Argument")
    return found[0]


def _cli_annotation(model: type[BaseModel], field: str) -> object:
    info = model.model_fields[field]
    given = [m.annotation for m in info.metadata if isinstance(m, CliType)]
    return Annotated[given[0] if given else info.annotation, cli_info(model, field)]


def command(model: type[R]) -> Callable[[Callable[[R], None]], Callable[..., None]]:
    """The Typer command whose options are ``model``'s fields; it calls the decorated
    function with the validated request."""

    def make(run: Callable[[R], None]) -> Callable[..., None]:
        params = []
        for name, info in model.model_fields.items():
            required = info.is_required()
            params.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=inspect.Parameter.empty if required else info.get_default(),
                    annotation=_cli_annotation(model, name),
                )
            )

        def cli(**options: Any) -> None:
            run(parse(model, options))

        cli.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        cli.__annotations__ = {}
        cli.__name__, cli.__qualname__, cli.__doc__ = run.__name__, run.__qualname__, run.__doc__
        cli.__module__ = run.__module__
        cli.request_model = model  # type: ignore[attr-defined]
        return cli

    return make


def parse(model: type[R], options: Mapping[str, object]) -> R:
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        raise invalid(exc, flags=model.flags()) from None


def invalid(
    exc: ValidationError, what: str = "", flags: Mapping[str, str] | None = None
) -> AvbenchError:
    """A pydantic error of what the user typed as one line: the option (``flags`` maps a
    request's field to its flag), else ``what`` and the field's path; then what was expected."""
    err = exc.errors()[0]
    loc = [str(x) for x in err["loc"]]
    if flags is None or (loc and loc[0] not in flags):
        return validation_error(exc, what)
    msg = err["msg"].removeprefix("Value error, ")
    return AvbenchError(f"{flags[loc[0]]}: {msg}" if loc else msg)


def resolve_vllm_python(given: str | None) -> str:
    """--vllm-python, else $AVBENCH_VLLM_PYTHON, else this interpreter."""
    return given or os.environ.get("AVBENCH_VLLM_PYTHON") or sys.executable


def _int_list(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected a comma-separated list of integers, got {value!r}") from None


def _name_list(value: object) -> object:
    if isinstance(value, str) or value is None:
        return value.split(",") if value else None
    return value


def _rate_list(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        rates = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        rates = []
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
        raise ValueError(
            "expected a comma-separated list of positive, finite requests per second, e.g. 2,8;"
            f" got {value!r}"
        )
    return rates


IntList = Annotated[list[int] | None, CliType(str | None), BeforeValidator(_int_list)]
NameList = Annotated[list[str] | None, CliType(str | None), BeforeValidator(_name_list)]
RateList = Annotated[list[float] | None, CliType(str | None), BeforeValidator(_rate_list)]

RATES_HELP = "Open loop instead: requests per second, e.g. 2,8 (like vllm bench --request-rate)"
SUITES_HELP = "Suite directory (default: $AVBENCH_SUITES, else ./suites, else the suites shipped with avbench)"
Suites = Annotated[Path | None, typer.Option("--suites", help=SUITES_HELP)]
VllmPython = Annotated[
    str,
    CliType(str | None),
    BeforeValidator(resolve_vllm_python),
    typer.Option(help="Python interpreter that has vLLM (default: this one)"),
]
