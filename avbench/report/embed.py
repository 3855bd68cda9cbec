"""How the figures sit in the self-contained report page (it must work offline, so plotly.js
travels inside it).

plotly.js is 4.8 MB, nearly all of a small run's page. It is embedded once, deflated and
base64-encoded (about 2 MB), and the browser inflates it with its built-in
``DecompressionStream`` before drawing. Each figure is a JSON spec beside its div; the layout
template the figures share (about 7 kB of colours and axis defaults each) is stored once, and
64-bit float arrays are stored as 32-bit ones (7 significant digits, more than a figure shows).
"""

from __future__ import annotations

import base64
import functools
import html
import zlib

import numpy as np
from plotly.io.json import to_json_plotly

# Inflates plotly.js, then draws every figure with its template.
_LOADER = """
(async () => {
  const figures = document.querySelectorAll("script.avbench-figure");
  try {
    const packed = document.getElementById("avbench-plotlyjs").textContent;
    const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
    const code = document.createElement("script");
    code.textContent = await new Response(stream).text();
    document.head.appendChild(code);
  } catch (err) {
    for (const f of figures) {
      document.getElementById(f.dataset.div).textContent =
        "This browser cannot unpack the embedded plotly.js (" + err + ").";
    }
    return;
  }
  const templates = JSON.parse(document.getElementById("avbench-templates").textContent);
  for (const f of figures) {
    const fig = JSON.parse(f.textContent);
    if (fig.template !== undefined) fig.layout.template = templates[fig.template];
    Plotly.newPlot(f.dataset.div, fig.data, fig.layout, {responsive: true});
  }
})();
"""


@functools.cache
def _packed_plotlyjs() -> str:
    from plotly.offline.offline import get_plotlyjs

    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: what the browser inflates
    data = get_plotlyjs().encode()
    return base64.b64encode(deflate.compress(data) + deflate.flush()).decode("ascii")


def _as_float32(node):
    """The figure dict with every float64 typed array (plotly's ``bdata``) as float32."""
    if isinstance(node, dict):
        if node.get("dtype") == "f8" and isinstance(node.get("bdata"), str):
            values = np.frombuffer(base64.b64decode(node["bdata"]), dtype="<f8")
            return node | {
                "dtype": "f4",
                "bdata": base64.b64encode(values.astype("<f4").tobytes()).decode(),
            }
        return {k: _as_float32(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_as_float32(v) for v in node]
    return node


class Figures:
    """The figures of one page: each one's HTML, then the scripts that draw them all."""

    def __init__(self) -> None:
        self.templates: list[str] = []  # JSON of each distinct layout template
        self.count = 0

    def html(self, div_id: str, fig) -> str:
        self.count += 1
        spec = _as_float32(fig.to_plotly_json())
        layout = dict(spec.get("layout") or {})
        body = {"data": spec.get("data") or [], "layout": layout}
        template = layout.pop("template", None)
        if template is not None:
            text = to_json_plotly(template)
            if text not in self.templates:
                self.templates.append(text)
            body["template"] = self.templates.index(text)
        height = f"{layout['height']}px" if layout.get("height") else "100%"
        div_id = html.escape(div_id)
        return (
            f'<div id="{div_id}" class="plotly-graph-div" style="height:{height};width:100%">'
            f'</div><script type="application/json" class="avbench-figure" data-div="{div_id}">'
            f"{to_json_plotly(body)}</script>"
        )

    def scripts(self) -> str:
        """Once per page, after its figures: the templates, plotly.js and the loader."""
        if not self.count:
            return ""
        return (
            '<script type="application/json" id="avbench-templates">'
            f"[{','.join(self.templates)}]</script>"
            '<script type="application/octet-stream" id="avbench-plotlyjs">'
            f"{_packed_plotlyjs()}</script><script>{_LOADER}</script>"
        )
