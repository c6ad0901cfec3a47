"""The packages' import graph: no cycle, and ``state`` never imports ``processors``.

The packages are ``processors``, ``state`` and the benchmark harness (``benchmarks``).
Every import counts: module level, under ``TYPE_CHECKING`` and inside functions (a
call-time import is a cycle all the same). Run alone to print the graph's size:
``python -m pytest tests/unit/test_import_graph.py -q -s``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("processors", "state", "benchmarks")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[_module_name(path)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that ``name`` (a module or ``module.attribute``) names."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (packages' ``__init__`` included)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module if is_package else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                names = [f"{base}.{alias.name}" for alias in node.names] or [base]
            for name in names:
                target = _resolve(name, modules)
                if target is not None and target != module:
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without the edges into package ``__init__`` modules from inside them.

    ``processors/__init__.py`` re-exports the public API: a module of the package that
    imports ``processors.exceptions`` goes through it, but that is Python's loading,
    not a dependency of the module on the re-exports.
    """
    inits = {m for m in graph if (ROOT / m.replace(".", "/") / "__init__.py").exists()}
    return {
        m: {t for t in targets if t not in inits or not m.startswith(t + ".")}
        for m, targets in graph.items()
    }


def test_no_import_cycles() -> None:
    graph = _without_package_inits(import_graph())
    edges = sum(len(t) for t in graph.values())
    print(f"{len(graph)} modules, {edges} imports")
    assert cycles(graph) == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between the folders of ``processors`` (a module outside them stands alone)."""

    def unit(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 else module

    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folded.setdefault(unit(module), set()).update(
            unit(t) for t in targets if unit(t) != unit(module)
        )
    for targets in list(folded.values()):
        for t in targets:
            folded.setdefault(t, set())
    return folded


def test_benchmarks_are_in_the_graph() -> None:
    """The no-cycle checks above cover the harness too (its modules import each other)."""
    graph = import_graph()
    assert {"benchmarks.run", "benchmarks.broker", "benchmarks.nexmark.harness"} <= set(graph)
    assert any(t.startswith("benchmarks.") for t in graph["benchmarks.run"])


def test_no_cycles_between_packages() -> None:
    """``processors/_dsl``, ``_task``, ``_runtime`` ... import each other one way only."""
    assert cycles(package_graph(_without_package_inits(import_graph()))) == []


def test_state_never_imports_processors() -> None:
    """``state`` (backends, codecs, the savepoint format and its Spark tools) is below
    ``processors``: not one import, TYPE_CHECKING and call-time ones included."""
    graph = import_graph()
    wrong = {
        m
        for m, targets in graph.items()
        if m.startswith("state") and any(t.startswith("processors") for t in targets)
    }
    assert wrong == set()


def test_the_checker_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
