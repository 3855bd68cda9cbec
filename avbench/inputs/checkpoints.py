"""Where a pair's checkpoints are: Hugging Face ids, sub-folders of a repository, local dirs.

vLLM takes a Hugging Face id (``org/name``) or a local directory as a model. Some drafters ship
inside the target's repository (``XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash/dflash``): such an id is
neither, and vLLM rejects it ("Invalid repository ID"). avbench hands vLLM the sub-folder of
the repository's local snapshot instead (the Hugging Face cache, offline lookup), so the
repository must be downloaded first; ``missing`` says which and how, in one line each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# A Hugging Face repository id part: letters, digits, "-", "_", "." (huggingface_hub's rule).
_ID_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class SubfolderRef:
    """``org/name/sub/...``: the folder ``sub/...`` of the Hugging Face repository org/name."""

    ref: str
    repo: str
    subfolder: str

    @property
    def download(self) -> str:
        return f"hf download {self.repo}"


def subfolder_ref(ref: str | None) -> SubfolderRef | None:
    """The repository and folder of a sub-folder id; None for a plain id or a local path."""
    if not ref or ref.startswith(("/", ".", "~")) or Path(ref).exists():
        return None
    parts = ref.split("/")
    if len(parts) < 3 or not all(_ID_PART.match(p) for p in parts):
        return None
    return SubfolderRef(ref, "/".join(parts[:2]), "/".join(parts[2:]))


def local_snapshot(repo: str) -> Path | None:
    """The repository's snapshot in the local Hugging Face cache (no network), else None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def _folder(sub: SubfolderRef) -> tuple[Path | None, Path | None]:
    """(the repository's local snapshot, the sub-folder inside it) where each exists."""
    snapshot = local_snapshot(sub.repo)
    folder = snapshot / sub.subfolder if snapshot is not None else None
    return snapshot, folder if folder is not None and folder.is_dir() else None


def resolve(ref: str | None) -> str | None:
    """What vLLM is given for ``ref``: a sub-folder id becomes the folder inside the local
    snapshot when that exists; anything else (or an id not downloaded yet) is left as is."""
    sub = subfolder_ref(ref)
    folder = _folder(sub)[1] if sub is not None else None
    return str(folder) if folder is not None else ref


def missing(role: str, ref: str | None) -> str | None:
    """Why ``ref`` (the pair's ``role``, e.g. "drafter") cannot be handed to vLLM, or None."""
    sub = subfolder_ref(ref)
    if sub is None:
        return None
    snapshot, folder = _folder(sub)
    if folder is not None:
        return None
    where = (
        f"the local snapshot of {sub.repo} ({snapshot}) has no folder {sub.subfolder!r}"
        if snapshot is not None
        else f"{sub.repo} is not in the local Hugging Face cache"
    )
    return (
        f"{role} {ref} is a folder of the repository {sub.repo}, which vLLM loads only from a "
        f"local directory, and {where}: download it with `{sub.download}`"
    )


def describe(role: str, ref: str | None) -> str | None:
    """One line for `avbench plan`: what a sub-folder id will be resolved to at launch."""
    sub = subfolder_ref(ref)
    if sub is None:
        return None
    folder = _folder(sub)[1]
    if folder is not None:
        return f"{role} {ref} -> {folder} (local snapshot)"
    return (
        f"{role} {ref} -> <local snapshot of {sub.repo}>/{sub.subfolder} at launch; "
        f"not downloaded here (`{sub.download}`)"
    )
