"""avbench command line. Thin: parse options, call one entry point, print errors as one line.

Heavy imports live inside the commands so ``--help`` stays fast.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys

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
    "sweep", "answer", "workloads", "lab", "loadgen", "doctor", "nightly", "estimator", "quality",
    "predict",
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
            from avbench.apikey import read_key_file

            keys.append(read_key_file(path))
        except AvbenchError:
            pass
    return [k for k in keys if k]


def main() -> None:
    """Exit codes (README): 0 ok, 1 cells failed, 2 bad input, 3 unsupported arm with
    --strict, 4 internal error (traceback saved), 130 interrupted."""
    try:
        app()
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


_PATH_ERRNOS = (
    errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.ENOTDIR, errno.EISDIR,
    errno.EEXIST, errno.ENOENT,
)  # fmt: skip


def _internal_error(exc: Exception) -> None:
    """A bug, not a user error: one line, and the full traceback saved to a file."""
    from avbench.errors import save_traceback

    path = getattr(exc, "avbench_traceback", None) or save_traceback(
        exc, None, _secrets_in_use()
    )
    what = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    for key in _secrets_in_use():
        what = what.replace(key, "***")
    print(f"error: internal error ({what}); traceback saved to {path}", file=sys.stderr)
    raise SystemExit(4) from None


if __name__ == "__main__":
    main()
