"""What vLLM chose for an arm, read from its server log: attention backend and CUDA graphs.

Only the AV arm gets AV's own filters: vLLM drops attention backends that cannot verify a
variable number of drafts per request and forces full CUDA graphs (FULL_DECODE_ONLY or
FULL_AND_PIECEWISE), so an AV arm and its OFF twin can differ in more than AV unless both are
pinned. The lines read here (vLLM 0.32 and 0.33 write them the same way):

- ``Using FLASH_ATTN attention backend out of potential backends: [...]`` (vLLM picked it),
  ``Using AttentionBackendEnum.FLASH_ATTN backend.`` (pinned with ``--attention-backend``),
  ``Using CPU_MLA backend.`` (CPU, MLA models) and ``Using FLASH_ATTN_DIFFKV for attention.``
  (models that choose per layer). The CPU build logs nothing for its only other backend.
- the engine's config line (``Initializing a V1 LLM engine ... 'cudagraph_mode':
  <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>``), then any downgrade (``...; setting
  cudagraph_mode=PIECEWISE``, ``... Overriding to FULL_DECODE_ONLY.``): the last one wins.
  The mode AV selects for itself is not logged, so
- the capture progress bars (``Capturing CUDA graphs (FULL)``) say which kinds of graphs were
  captured in the end.

And what avbench's own plugin changed in the server (``avbench: server patched: <what>``,
``avbench.vllm_plugin``): a fix the numbers depend on, recorded with them.

And whether the engine died behind a live HTTP server (``engine_death``): vLLM's API server
outlives a dead engine core, answers every open stream with an error event and ``/health`` with
503, and its log holds the cause: the worker's or engine core's exception line, then
``EngineCore encountered a fatal error`` and ``EngineDeadError`` (vLLM 0.32 and 0.33), or
``Engine core proc ... died unexpectedly`` when the process itself was killed.
"""

from __future__ import annotations

import re

from avbench.capture_protocol import PATCH_LOG_MARK

_BACKENDS = (
    re.compile(r"Using ([A-Z][A-Z0-9_]+) attention backend out of potential backends"),
    re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+) backend\."),
    re.compile(r"Using ([A-Z][A-Z0-9_]+) for attention\."),
)
_MODE = re.compile(
    r"'cudagraph_mode': <CUDAGraphMode\.(\w+)"
    r"|setting cudagraph_mode=(\w+)"
    r"|requires piecewise capture.*? Overriding to (\w+)\."
)
_CAPTURED = re.compile(r"Capturing (?:[\w-]+ )*CUDA graphs \((\w+)\)")
_PATCHED = re.compile(re.escape(PATCH_LOG_MARK) + r" ([\w .-]+?) \(")
_DEATH = re.compile(
    r"EngineCore encountered a fatal error|EngineDeadError|Engine core proc \S+ died unexpectedly"
)
# "(Worker pid=12) ERROR 12-04 20:55:32 [multiproc_executor.py:1063] RuntimeError: ..."
_LOG_LINE = re.compile(
    r"^\((?P<proc>[^()]+?)(?: pid=\d+)?\) (?P<level>[A-Z]+) \S+ \S+ \[[^\]]*\] (?P<msg>.*)$"
)
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt): \S")

# Cell-row columns (avbench/store/cellrow.py), in this order.
ENGINE_COLUMNS = (
    "attention_backend_chosen",
    "cudagraph_mode_chosen",
    "cudagraphs_captured",
    "server_patched",
)


def engine_choices(log: str) -> dict[str, str | None]:
    """The ENGINE_COLUMNS of one server's log; None where the log does not say."""
    backends: dict[str, None] = {}
    for line in log.splitlines():
        for pattern in _BACKENDS:
            for m in pattern.finditer(line):
                backends[m.group(1)] = None
    modes = [next(g for g in m.groups() if g) for m in _MODE.finditer(log)]
    captured = dict.fromkeys(m.group(1) for m in _CAPTURED.finditer(log))
    patched = dict.fromkeys(m.group(1) for m in _PATCHED.finditer(log))
    return {
        "attention_backend_chosen": ", ".join(backends) or None,
        "cudagraph_mode_chosen": modes[-1] if modes else None,
        "cudagraphs_captured": "+".join(sorted(captured)) or None,
        "server_patched": ", ".join(sorted(patched)) or None,
    }


def engine_differences(off: dict, on: dict) -> list[str]:
    """What the two arms' servers chose differently (only where both logs said)."""
    out = []
    for col in ENGINE_COLUMNS:
        a, b = off.get(col), on.get(col)
        if a is not None and b is not None and a != b:
            out.append(f"{col.replace('_', ' ')} {a} vs {b}")
    return out


def names_exception(cause: str) -> bool:
    """Whether an ``engine_death`` cause is an exception line, not the death line itself."""
    return bool(_EXCEPTION.match(cause.partition(": ")[2]))


def engine_death(log: str) -> str | None:
    """The cause of an engine core's death as one log line, or None when the log shows none.

    The cause is the first exception line a process other than the API server logged at ERROR
    (the worker's root cause comes before the engine core's re-raise of it); else the API
    server's first; else the death line itself."""
    marker = _DEATH.search(log)
    if marker is None:
        return None
    first: dict[bool, str] = {}
    for line in log.splitlines():
        m = _LOG_LINE.match(line)
        if m is None or m["level"] != "ERROR" or not _EXCEPTION.match(m["msg"]):
            continue
        first.setdefault(m["proc"] == "APIServer", f"{m['proc']}: {m['msg'].strip()}")
        if False in first:
            break
    cause = first.get(False) or first.get(True)
    if cause is None:
        line_start = log.rfind("\n", 0, marker.start()) + 1
        line_end = log.find("\n", marker.end())
        cause = log[line_start : line_end if line_end >= 0 else None].strip()
    return cause[:300]
