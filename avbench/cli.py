"""avbench command line. Thin: parse options, call one entry point, print errors as one line.

Heavy imports live inside the commands so ``--help`` stays fast.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from pathlib import Path

import typer

from avbench.errors import AvbenchError

app = typer.Typer(
    name="avbench",
    help="Benchmark speculative decoding and Adaptive Verification in vLLM.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Command groups, one module each under avbench/commands/ (registered if present).
_COMMAND_MODULES = (
    "pairs", "plan", "sweep", "report", "recommend", "workloads", "trace", "lossless", "tables",
    "doctor", "preflight", "compare", "merge", "estimator", "quality", "predict", "sanity",
)  # fmt: skip

for _name in _COMMAND_MODULES:
    try:
        _mod = importlib.import_module(f"avbench.commands.{_name}")
    except ModuleNotFoundError as exc:  # a group not written yet
        if exc.name != f"avbench.commands.{_name}":
            raise
        continue
    _mod.register(app)


def _secrets_in_use() -> list[str]:
    """The API key, wherever it was given, so a saved traceback never holds it."""
    args = sys.argv[1:]
    keys = [os.environ.get("OPENAI_API_KEY", "")]
    keys += [b for a, b in zip(args, args[1:], strict=False) if a == "--api-key"]
    keys += [a.split("=", 1)[1] for a in args if a.startswith("--api-key=")]
    files = [b for a, b in zip(args, args[1:], strict=False) if a == "--api-key-file"]
    files += [a.split("=", 1)[1] for a in args if a.startswith("--api-key-file=")]
    for path in files:
        try:
            from avbench.inputs.apikey import read_key_file

            keys.append(read_key_file(Path(path)))
        except AvbenchError:
            pass
    return [k for k in keys if k]


def main(typer_app: typer.Typer = app) -> None:
    """Exit codes (README): 0 ok, 1 cells failed, 2 bad input, 3 unsupported arm with
    --strict, 4 internal error (traceback saved), 130 interrupted. ``typer_app``: another
    command line run the same way (the test helpers' fake server)."""
    # typer (>= 0.26) vendors click as typer._click: its usage errors are raised from there.
    from typer._click.exceptions import NoArgsIsHelpError

    try:
        code = typer_app(standalone_mode=False)  # usage errors come here, printed as one line
    except NoArgsIsHelpError as exc:  # `avbench` alone: the help (rich printed it already)
        if exc.format_message().strip():
            print(exc.format_message(), file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except typer.TyperException as exc:
        print(f"error: {_usage_message(exc)}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        raise SystemExit(1) from None
    except AvbenchError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"error: {first}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except OSError as exc:
        if exc.errno not in _PATH_ERRNOS or exc.filename is None:
            _internal_error(exc)
        # A path the user gave that cannot be written (read-only, a file in the way, disk full).
        print(f"error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        raise SystemExit(1 if exc.errno == errno.ENOSPC else 2) from None
    except Exception as exc:
        _internal_error(exc)
    if isinstance(code, int) and code:  # typer.Exit(code) inside a command
        raise SystemExit(code)


def _usage_message(exc: typer.TyperException) -> str:
    """A usage error in one line: the command, what is wrong, where its help is."""
    what = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return what
    return f"{ctx.command_path}: {what} (see `{ctx.command_path} --help`)"


_PATH_ERRNOS = (
    errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.ENOTDIR, errno.EISDIR,
    errno.EEXIST, errno.ENOENT,
)  # fmt: skip


def _internal_error(exc: Exception) -> None:
    """A bug, not a user error: one line, and the full traceback saved to a file."""
    from avbench.errors import save_traceback

    path = getattr(exc, "avbench_traceback", None) or save_traceback(exc, None, _secrets_in_use())
    what = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    for key in _secrets_in_use():
        what = what.replace(key, "***")
    print(f"error: internal error ({what}); traceback saved to {path}", file=sys.stderr)
    raise SystemExit(4) from None


if __name__ == "__main__":
    main()
