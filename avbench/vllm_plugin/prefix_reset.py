"""The route a sweep empties a launched server's prefix cache through, between cells.

vLLM serves a reset only among its development endpoints (``VLLM_SERVER_DEV_MODE``), which also
open remote procedure calls into the workers; this middleware adds the one route the sweep
needs and nothing else. vLLM's ``--middleware`` installs it outside vLLM's own API-key check,
so it checks the key itself.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any

from avbench.capture_protocol import PREFIX_RESET_PATH


async def prefix_reset_route(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """``POST PREFIX_RESET_PATH`` -> ``{"success": bool}``: vLLM's engine answers false while
    requests still hold cached blocks (the caller retries); every other request passes on."""
    if request.url.path != PREFIX_RESET_PATH or request.method != "POST":
        return await call_next(request)
    from fastapi.responses import JSONResponse

    key = os.environ.get("VLLM_API_KEY")
    given = request.headers.get("authorization", "")
    if key and not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
        return JSONResponse({"error": "Unauthorized"}, status_code=401)
    success = await request.app.state.engine_client.reset_prefix_cache()
    return JSONResponse({"success": bool(success)})
