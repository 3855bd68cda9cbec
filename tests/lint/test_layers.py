"""avbench's top-level packages import each other without a cycle, so the pipeline can be read
in one direction: suite files, plan, server arm, load driver, records, metrics, store, analysis,
reports, commands. Imports inside one package do not count here (test_code_shape checks
modules); the layers' order itself is pyproject's import-linter contract (`lint-imports`).
Lazy imports inside functions count: they are dependencies all the same."""

from __future__ import annotations

import sys
from collections import defaultdict

import grimp
from import_graph import strongly_connected

SHOWN_PER_EDGE = 3  # module imports named per package edge of a cycle


def package_imports(package: str) -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> its module imports, as "a.x imports b.y"; a
    package is a top-level subpackage or module of ``package`` (``avbench.cli`` is ``cli``)."""
    g = grimp.build_graph(package, cache_dir=None)
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for importer in sorted(g.modules):
        for imported in sorted(g.find_modules_directly_imported_by(importer)):
            a, b = _top(package, importer), _top(package, imported)
            if a and b and a != b:
                edges[(a, b)].append(f"{importer} imports {imported}")
    return dict(edges)


def _top(package: str, module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == package else None


def package_cycles(package: str) -> list[str]:
    """One description per group of packages that import each other: the group, then each
    import between two of them with the module imports that make it."""
    edges = package_imports(package)
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph[b]  # noqa: B018 (every package a node)
    out = []
    for group in strongly_connected(dict(graph)):
        lines = [" <-> ".join(sorted(group))]
        for (a, b), made_by in sorted(edges.items()):
            if a in group and b in group:
                more = len(made_by) - SHOWN_PER_EDGE
                tail = f" (+{more} more)" if more > 0 else ""
                lines.append(f"    {a} -> {b}: {'; '.join(made_by[:SHOWN_PER_EDGE])}{tail}")
        out.append("\n".join(lines))
    return sorted(out)


def test_no_import_cycle_between_packages():
    cycles = package_cycles("avbench")
    assert not cycles, (
        "import cycle(s) between avbench's packages (move the code to the layer that owns it: "
        "pyproject's layers contract):\n" + "\n".join("  " + c for c in cycles)
    )


def test_the_package_check_names_each_edge_of_a_cycle(tmp_path, monkeypatch):
    files = {
        "lay/__init__.py": "",
        "lay/low/__init__.py": "",
        "lay/low/a.py": "def f():\n    from lay.high import b\n",  # a lazy import counts
        "lay/high/__init__.py": "",
        "lay/high/b.py": "import lay.low.a\nimport lay.top\n",
        "lay/top.py": "from lay.high import b\n",
        "lay/alone/__init__.py": "from lay.low import a\n",  # imports into it, not part of it
        "lay/inner/__init__.py": "",
        "lay/inner/x.py": "from lay.inner import y\n",  # inside one package: not counted
        "lay/inner/y.py": "from lay.inner import x\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert package_cycles("lay") == [
            "high <-> low <-> top\n"
            "    high -> low: lay.high.b imports lay.low.a\n"
            "    high -> top: lay.high.b imports lay.top\n"
            "    low -> high: lay.low.a imports lay.high.b\n"
            "    top -> high: lay.top imports lay.high.b"
        ]
    finally:
        for name in [m for m in sys.modules if m == "lay" or m.startswith("lay.")]:
            del sys.modules[name]
