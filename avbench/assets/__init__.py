"""Files shipped inside the package: the embedded tiny speculative pair (`tiny-cpu`)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from avbench.errors import AvbenchError

_PAIR_PARTS = ("target", "drafter")


def tiny_pair_dir() -> Path:
    """Directory holding `target/` and `drafter/`, two Hugging Face model dirs.

    vLLM needs real paths on disk, so an install that cannot expose the package data as files
    (a zipped package) is reported instead of silently extracted somewhere.
    """
    res = files(__name__).joinpath("tiny")
    if not isinstance(res, Path):
        raise AvbenchError(
            f"avbench.assets: package data is not on the filesystem ({res!r}); "
            "install avbench from a directory or wheel, not a zip"
        )
    for part in _PAIR_PARTS:
        if not (res / part / "config.json").is_file():
            raise AvbenchError(
                f"{res / part}: missing config.json; expected the tiny pair's {part} model "
                "(regenerate with `python scripts/train_tiny_pair.py`)"
            )
    return res
