"""Read back what a report page draws (tests): each figure's JSON spec, by its div id."""

from __future__ import annotations

import html as html_lib
import json
import re

_FIGURE = re.compile(
    r'<script type="application/json" class="avbench-figure" data-div="([^"]+)">(.*?)</script>',
    re.S,
)


def figures_of(page: str) -> dict[str, dict]:
    """Div id -> {"data": traces, "layout": ...} of every figure on the page, in page order."""
    return {html_lib.unescape(div): json.loads(spec) for div, spec in _FIGURE.findall(page)}


def trace_labels(figure: dict) -> list[str]:
    """What a figure shows per trace: its name, and the point labels (loads) it carries."""
    out = []
    for trace in figure["data"]:
        text = trace.get("text")
        labels = text if isinstance(text, list) else []
        out += [trace.get("name", ""), *labels]
    return out
