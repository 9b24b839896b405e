"""No import circle among the project's own modules.

The graph is built statically with :mod:`ast` from every ``.py`` file of ``prioreplay/``,
``services/``, ``benchmarks/``, ``tests/`` and ``examples/``:

- a file's module name is its path with dots (``benchmarks/run.py`` -> ``benchmarks.run``), except
  ``services/<role>/...``, which imports as ``prioreplay.<role>...`` (its link, prioreplay/<role>);
- relative imports are resolved against the importing module's package;
- ``from pkg import name`` is an edge to the module ``pkg.name`` when that is a module of the
  tree, else to ``pkg`` (a name its ``__init__`` defines); ``import a.b.c`` is an edge to
  ``a.b.c`` only: the parent packages a Python import also runs are not edges, so a package whose
  ``__init__`` re-exports its own submodules is not a circle with them;
- imports inside functions count as much as those at module level. A function-level import still
  runs (only later), and it is still one module depending on the other: ``benchmarks.run``
  importing ``benchmarks.overhead`` inside a function while ``benchmarks.overhead`` imports
  ``benchmarks.run`` inside another is the circle a reader means, whatever the load order;
- imports under ``if TYPE_CHECKING:`` do not count: they never run and only name a type for an
  annotation (the checker, not the program, depends on it).

A circle is a strongly connected component of more than one module (or a module importing
itself); the failure lists every one with its modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ROOTS = ("prioreplay", "services", "benchmarks", "tests", "examples")


def module_name(path: Path) -> str:
    """The dotted name ``path`` (relative to the repo) imports as."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] == "services":
        parts[0] = "prioreplay"
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    """{module name: file} of every project module (generated code included: it imports too)."""
    out = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if "__pycache__" not in path.parts:
                out[module_name(path)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` (function bodies included), ``if TYPE_CHECKING:`` left out."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that module ``name`` (file ``path``) imports."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in modules)
            continue
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            target = ".".join([*base, node.module] if node.module else base)
        else:
            target = node.module or ""
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            if sub in modules:
                out.add(sub)
            elif target in modules:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    """{module: the project modules it imports} over the whole tree."""
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` that are circles (Tarjan's algorithm,
    iterative), each sorted; a module that imports itself is a circle of one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return sorted(found)


def test_the_graph_sees_relative_function_level_and_services_imports(tmp_path):
    """The resolver itself: a relative import, a function-level import and the services mapping
    each give the edge they should (else an empty graph would pass the test below)."""
    mod = tmp_path / "m.py"
    mod.write_text("from . import b\nfrom ..c import d\nif TYPE_CHECKING:\n    import p.x\ndef f():\n    import p.y\n")
    modules = dict.fromkeys(["p.q.m", "p.q.b", "p.c", "p.x", "p.y"], mod)
    assert imports_of("p.q.m", mod, modules) == {"p.q.b", "p.c", "p.y"}
    graph = import_graph()
    assert "prioreplay.learner.learner" in graph  # services/learner/learner.py
    assert "prioreplay.learner.persistence" in graph["prioreplay.learner.learner"]
    assert "benchmarks.simulate" in graph["benchmarks.run"]  # imported inside part_simulate()
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}) == [["a", "b", "c"], ["e"]]


def test_no_import_circle_in_the_tree():
    found = circles(import_graph())
    assert not found, "import circles (break each by moving what both sides need into a third module):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )
