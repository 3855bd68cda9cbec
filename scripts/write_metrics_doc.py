"""Regenerate docs/metrics.md from the column definitions in the code."""

from pathlib import Path

from avbench.store.cellrow import definitions_markdown

if __name__ == "__main__":
    out = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
    out.write_text(definitions_markdown(), encoding="utf-8")
    print(out)
