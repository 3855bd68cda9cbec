"""Where the API key comes from: a file or the environment, so it never shows in ``ps``.

Given one of: ``--api-key-file PATH`` (its first line, surrounding whitespace dropped),
``--api-key`` (kept for scripts, but visible to every user of the machine in the process list
while avbench runs), or ``OPENAI_API_KEY`` (used when neither option is given).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import SecretStr

from avbench.errors import AvbenchError


def read_key_file(path: Path) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise AvbenchError(f"--api-key-file {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise AvbenchError(f"--api-key-file {path}: not a text file") from None
    key = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not key:
        raise AvbenchError(f"--api-key-file {path}: empty (expected the key on its first line)")
    return key


def resolve_api_key(cli_key: str | None, key_file: Path | None) -> SecretStr | None:
    """The API key to use, or None when none was given anywhere."""
    if cli_key and key_file is not None:
        raise AvbenchError("--api-key and --api-key-file: give the key one way only")
    key = read_key_file(key_file) if key_file is not None else None
    key = key or cli_key or os.environ.get("OPENAI_API_KEY")
    return SecretStr(key) if key else None
