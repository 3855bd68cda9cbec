"""Reading prompt sets from the Hugging Face hub, and deciding quickly when not to try.

``datasets`` retries for a long time when the hub is unreachable, so we check
``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` first and then probe the endpoint with one short TCP
connect before handing over to ``datasets``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass
from urllib.parse import urlparse

_TRUE = {"1", "true", "yes", "on"}


class HubUnavailable(Exception):
    """The hub cannot be used now (offline mode, unreachable, or the load failed)."""


def hub_offline() -> bool:
    """True when the environment asks for no hub access at all."""
    return any(
        os.environ.get(var, "").strip().lower() in _TRUE
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """One TCP connect to the configured endpoint; cheap compared to datasets' retries."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class HubRows:
    rows: list[dict]
    repo: str
    revision: str  # the commit the rows came from when known, else what was asked for
    sha256: str  # of the rows as canonical JSON (the hub has no single file to hash)


def rows_sha256(rows: list[dict]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def load_hub_rows(repo: str, config: str | None, split: str, revision: str | None) -> HubRows:
    """All rows of ``repo``/``config``/``split``; raises HubUnavailable instead of hanging."""
    if hub_offline():
        raise HubUnavailable("HF_HUB_OFFLINE is set")
    if not hub_reachable():
        raise HubUnavailable("the Hugging Face hub is unreachable")
    try:
        from datasets import load_dataset

        ds = load_dataset(repo, config, split=split, revision=revision)
        rows = ds.to_list()
    except Exception as exc:  # network, auth (gated), missing config: all mean "not from the hub"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HubUnavailable(f"loading {repo} from the hub failed: {first}") from exc
    resolved = revision or "main"
    try:
        from huggingface_hub import HfApi

        sha = HfApi().dataset_info(repo, revision=revision).sha
        resolved = sha or resolved
    except Exception:  # the rows are loaded; a missing commit id is recorded as the ref asked for
        pass
    return HubRows(rows=rows, repo=repo, revision=resolved, sha256=rows_sha256(rows))
