"""Emptying a server's prefix cache before a cell (avbench/vllm_plugin/prefix_reset.py).

Cells of one workload send the same prompts at every load, so without a reset a cell served
after another finds their prefixes cached and starts warm: its TTFT and throughput then depend
on the order the sweep measured the cells in (docs/adaptive.md).
"""

from __future__ import annotations

import time

import httpx

from avbench.capture_protocol import PREFIX_RESET_PATH

# vLLM refuses a reset while requests still hold cached blocks: requests a stalled or
# deadline-cut cell left behind drain within a few seconds.
RETRY_S = 15.0
RETRY_EVERY_S = 0.5


def reset_prefix_cache(
    base_url: str, headers: dict[str, str], timeout_s: float = 30.0
) -> bool | None:
    """True: the cache is empty; False: the engine kept refusing (requests held blocks for
    ``RETRY_S``); None: the server has no such route (not launched by avbench with its plugin)."""
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            r = httpx.post(base_url + PREFIX_RESET_PATH, headers=headers, timeout=timeout_s)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        try:
            if r.json().get("success") is True:
                return True
        except ValueError:
            return None
        if time.monotonic() >= deadline:
            return False
        time.sleep(RETRY_EVERY_S)
