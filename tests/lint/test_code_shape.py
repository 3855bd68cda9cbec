"""The package's shape, kept: small functions with few parameters, no import cycle.

Every function and method in avbench/ takes at most MAX_PARAMS parameters (``self``/``cls``
not counted; ``*args`` and ``**kwargs`` count one each) and spans at most MAX_LINES lines (its
``def`` line to its last, decorators aside, docstring and comments included); the modules
import each other without a cycle (lazy imports inside functions count: they are dependencies
all the same).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import grimp
from import_graph import cycle_through, strongly_connected

import avbench

MAX_PARAMS = 6
MAX_LINES = 80
PACKAGE_DIR = Path(avbench.__file__).resolve().parent


@dataclass(frozen=True)
class Function:
    path: str  # relative to the package's parent, e.g. avbench/run/runner.py
    name: str  # dotted within its module: Class.method, outer.inner
    lines: int
    params: int

    def __str__(self) -> str:
        return f"{self.path}::{self.name}: {self.lines} lines, {self.params} parameters"


def _param_count(fn: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> int:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    if in_class and positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    return len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def _functions(tree: ast.Module, path: str) -> list[Function]:
    out: list[Function] = []

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                out.append(Function(path, name, lines, _param_count(child, in_class)))
                visit(child, name + ".", False)
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".", True)
            else:
                visit(child, prefix, in_class and isinstance(child, ast.If | ast.Try))

    visit(tree, "", False)
    return out


def functions_of(package_dir: Path) -> list[Function]:
    out: list[Function] = []
    for file in sorted(package_dir.rglob("*.py")):
        rel = file.relative_to(package_dir.parent).as_posix()
        out += _functions(ast.parse(file.read_text(encoding="utf-8"), rel), rel)
    return out


def oversized(functions: list[Function]) -> list[Function]:
    return [f for f in functions if f.params > MAX_PARAMS or f.lines > MAX_LINES]


def import_cycles(package: str) -> list[list[str]]:
    """One cycle (as a chain of modules) per group of modules that import each other."""
    g = grimp.build_graph(package, cache_dir=None)
    graph = {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}
    return sorted(cycle_through(graph, c) for c in strongly_connected(graph))


def test_no_function_is_over_the_size_limits():
    offenders = oversized(functions_of(PACKAGE_DIR))
    assert not offenders, (
        f"{len(offenders)} function(s) over {MAX_PARAMS} parameters or {MAX_LINES} lines "
        "(group parameters into a typed object; split long bodies):\n"
        + "\n".join(f"  {f}" for f in offenders)
    )


def test_no_import_cycle():
    cycles = import_cycles("avbench")
    assert not cycles, "import cycle(s) between avbench's modules:\n" + "\n".join(
        "  " + " -> ".join(c) for c in cycles
    )


# ----------------------------------------------------------------------------- the checks, checked


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_size_check_counts_parameters_and_lines_as_documented(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1))
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/mod.py": (
                "def six(a, b, c, d, e, f):\n    pass\n\n"
                "def seven(a, /, b, *args, c, **kwargs):\n    pass\n\n"
                f"def eighty():\n{body}\n\n"
                f"def eighty_one():\n{body}\n    return 0\n\n"
                "class C:\n"
                "    def method(self, a, b, c, d, e, f):\n        pass\n\n"
                "    @classmethod\n"
                "    def too_many(cls, a, b, c, d, e, f, g):\n        pass\n\n"
                "    @staticmethod\n"
                "    def static(self_like, a, b, c, d, e, f):\n        pass\n\n"
                "def outer():\n"
                "    async def inner(a, b, c, d, e, f, g):\n        pass\n"
            ),
        },
    )
    found = {f.name: f for f in functions_of(tmp_path / "pkg")}
    assert found["six"].params == 6 and found["seven"].params == 5
    assert found["eighty"].lines == 80 and found["eighty_one"].lines == 81
    assert found["C.method"].params == 6 and found["C.too_many"].params == 7
    assert found["C.static"].params == 7
    assert [str(f) for f in oversized(list(found.values()))] == [
        "pkg/mod.py::eighty_one: 81 lines, 0 parameters",
        "pkg/mod.py::C.too_many: 2 lines, 7 parameters",
        "pkg/mod.py::C.static: 2 lines, 7 parameters",
        "pkg/mod.py::outer.inner: 2 lines, 7 parameters",
    ]


def test_the_cycle_check_reports_each_cycle_as_a_chain(tmp_path, monkeypatch):
    _write(
        tmp_path,
        {
            "cyc/__init__.py": "",
            "cyc/a.py": "from cyc import b\n",
            "cyc/b.py": "def f():\n    from cyc import c\n",  # a lazy import counts too
            "cyc/c.py": "import cyc.a\n",
            "cyc/d.py": "import cyc.a\n",  # imports into the cycle, is not part of it
            "cyc/e.py": "from cyc import f\n",
            "cyc/f.py": "from cyc import e\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert import_cycles("cyc") == [
            ["cyc.a", "cyc.b", "cyc.c", "cyc.a"],
            ["cyc.e", "cyc.f", "cyc.e"],
        ]
    finally:
        for name in [m for m in sys.modules if m == "cyc" or m.startswith("cyc.")]:
            del sys.modules[name]
