"""The project's shape as a specification (issue 50, "the floor plan"): what STYLE.md asks of every module.

- no import circle among the modules of flows, pipeline, trainer, storage and bench, counting every import: at
  module level, under `if TYPE_CHECKING:` and inside functions (a circle of "lazy" imports is still two
  modules that each need the other);
- no file of the wheel's packages (flows, pipeline, trainer, storage) over `MAX_FILE_LINES` lines;
- no function or method of those packages over `MAX_FUNCTION_LINES` lines (its `def` line to its last).

Each failure lists every offender, largest first, so the message is the to-do list.  The first tests check
the checkers themselves on made-up sources: a rule that cannot fail specifies nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEEL = ("flows", "pipeline", "trainer", "storage")
"""The packages the wheel ships."""
IMPORT_GRAPH = (*WHEEL, "bench")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


# ---- the checkers ------------------------------------------------------------------------------------------
def modules(roots: Iterable[str], base: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `roots` (a package is its `__init__.py`)."""
    out = {}
    for root in roots:
        for path in sorted((base / root).rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports_of(name: str, source: str, known: Mapping[str, object], *, package: bool) -> set[str]:
    """The modules of `known` that module `name` imports anywhere in `source` (TYPE_CHECKING and function bodies
    included), each import resolved to the longest known module it names."""

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    here = name.split(".") if package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(m for a in node.names if (m := resolve(a.name)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here[: len(here) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:  # `from pkg import module` imports the module, `from module import name` it
                m = resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in known else resolve(base)
                if m:
                    found.add(m)
    found.discard(name)
    return found


def import_graph(found: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules among `found` it imports."""
    return {
        name: imports_of(name, path.read_text(), found, package=path.name == "__init__.py")
        for name, path in found.items()
    }


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: its strongly connected components of more than one module, each sorted
    (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return sorted(out)


def long_functions(source: str, limit: int) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of each function or method of `source` longer than `limit` lines."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                qualified = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    if length > limit:
                        out.append((qualified, child.lineno, length))
                visit(child, f"{qualified}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


# ---- the checkers can fail ---------------------------------------------------------------------------------
def test_the_circle_finder_sees_circles_of_every_kind_of_import() -> None:
    known = dict.fromkeys(["p", "p.a", "p.b", "p.c", "p.d", "q"], None)
    sources = {
        "p.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import B\n",
        "p.b": "def f():\n    from . import c\n",  # function-local, relative
        "p.c": "import p.a.x\n",  # resolved to p.a
        "p.d": "from p import q\nimport q\n",
        "q": "",
    }
    graph = {n: imports_of(n, s, known, package=False) for n, s in sources.items()}
    assert graph["p.b"] == {"p.c"} and graph["p.c"] == {"p.a"} and graph["p.d"] == {"p", "q"}
    assert circles(graph) == [["p.a", "p.b", "p.c"]]
    assert circles({"x": {"y"}, "y": set()}) == []


def test_the_length_checkers_name_what_is_too_long(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(5))
    source = (
        f"def short():\n    pass\n\nclass C:\n    def long(self):\n{body}\n        def inner():\n            pass\n"
    )
    assert long_functions(source, 5) == [("C.long", 5, 8)]
    (tmp_path / "m.py").write_text(source)
    assert line_count(tmp_path / "m.py") == 12
    assert modules(["."], tmp_path) == {"m": tmp_path / "m.py"}


# ---- the floor plan ----------------------------------------------------------------------------------------
def test_no_import_circle_among_the_projects_modules() -> None:
    found = circles(import_graph(modules(IMPORT_GRAPH)))
    assert not found, (
        f"{len(found)} import circle(s) among {', '.join(IMPORT_GRAPH)} (module-level, TYPE_CHECKING and "
        "function-local imports all count); move what both need into a module below them:\n  "
        + "\n  ".join(" <-> ".join(c) for c in found)
    )


def test_no_file_of_the_wheel_is_over_500_lines() -> None:
    long = sorted(((line_count(p), str(p.relative_to(REPO))) for p in modules(WHEEL).values()), reverse=True)
    over = [f"{path}: {n} lines" for n, path in long if n > MAX_FILE_LINES]
    assert not over, (
        f"{len(over)} file(s) over {MAX_FILE_LINES} lines; split each by responsibility:\n  " + "\n  ".join(over)
    )


def test_no_function_of_the_wheel_is_over_80_lines() -> None:
    found = [
        (length, f"{path.relative_to(REPO)}:{line} {name}: {length} lines")
        for path in modules(WHEEL).values()
        for name, line, length in long_functions(path.read_text(), MAX_FUNCTION_LINES)
    ]
    over = [text for _, text in sorted(found, reverse=True)]
    assert not over, (
        f"{len(over)} function(s) over {MAX_FUNCTION_LINES} lines; cut each into named steps with one job each:\n  "
        + "\n  ".join(over)
    )
