"""Checks of what users type (options, URLs, keys): each failure is one line naming the option."""

from __future__ import annotations

import math
from urllib.parse import urlsplit

from avbench.errors import AvbenchError

# Redaction replaces every occurrence of the key in logs and manifests: a key of a few
# characters would blank ordinary words, so short keys are refused instead.
MIN_API_KEY_CHARS = 8


def check_endpoint(url: str, option: str = "--endpoint") -> str:
    """An http(s) URL with a host and a valid port; returned without a trailing slash."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        why = "port must be 1-65535" if "port" in str(exc).lower() else str(exc)
        raise AvbenchError(f"{option} {url!r}: {why} (expected http://HOST:PORT)") from None
    if parts.scheme not in ("http", "https"):
        raise AvbenchError(
            f"{option} {url!r}: expected an http:// or https:// URL such as http://127.0.0.1:8000"
        )
    if not parts.hostname:
        raise AvbenchError(f"{option} {url!r}: no host (expected http://HOST:PORT)")
    if port == 0:
        raise AvbenchError(f"{option} {url!r}: port must be 1-65535")
    if parts.query or parts.fragment:
        raise AvbenchError(f"{option} {url!r}: expected no query or fragment")
    return url.rstrip("/")


def check_port(port: int, option: str = "--port") -> int:
    if not 1 <= port <= 65535:
        raise AvbenchError(f"{option}: expected a TCP port 1-65535, got {port}")
    return port


def check_api_key(key: str, option: str = "--api-key / OPENAI_API_KEY") -> str:
    # A control character (a newline pasted along, a tab) would break the Authorization header
    # or be sent as part of it; the server's key cannot contain one either.
    bad = next((c for c in key if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise AvbenchError(
            f"{option}: the key contains a control character ({bad!r} at position "
            f"{key.index(bad)}); expected printable characters only"
        )
    if len(key) < MIN_API_KEY_CHARS:
        raise AvbenchError(
            f"{option}: key of {len(key)} characters refused (at least {MIN_API_KEY_CHARS}: "
            "shorter keys cannot be redacted from logs without blanking ordinary text)"
        )
    return key


def validation_error(exc, what: str) -> AvbenchError:
    """A pydantic ValidationError of what the user typed, as one line naming the field."""
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "of the sweep"  # empty: a cross-field check
    return AvbenchError(f"{what} {loc}: {err['msg'].removeprefix('Value error, ')}")


def check_positive(value: float | None, option: str) -> None:
    if value is not None and not 0 < value < math.inf:
        raise AvbenchError(f"{option}: expected a finite number > 0, got {value:g}")


def check_non_negative(value: int | None, option: str) -> None:
    if value is not None and value < 0:
        raise AvbenchError(f"{option}: expected an integer >= 0, got {value}")
