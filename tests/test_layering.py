"""engine/'s shape, read from its source with ast: no import cycle (imports inside functions
included, where lazy imports would hide one), never the trainer, no module that has outgrown one
concept. `python tests/test_layering.py` prints the import graph and the module sizes."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"
MAX_LINES = 700


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def engine_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ENGINE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module `path` imports, at any depth of its code: `from engine import defaults` is
    engine.defaults when that is a module, else engine itself."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return found


def import_graph() -> dict[str, set[str]]:
    modules = engine_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a module importing itself
    (Tarjan's algorithm); each one is an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue  # outside engine/
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
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_engine_has_no_import_cycle_even_through_lazy_imports() -> None:
    assert cycles(import_graph()) == []


def test_a_lazy_import_that_closes_a_circle_is_found() -> None:
    graph = {
        "engine.cli": {"engine.diff"},
        "engine.diff": {"engine.recheck"},
        "engine.recheck": {"engine.cli", "json"},
        "engine.plan": set(),
    }
    assert cycles(graph) == [["engine.cli", "engine.diff", "engine.recheck"]]


def test_engine_never_imports_the_trainer() -> None:
    offenders = {name: sorted(d for d in deps if d.split(".")[0] == "trainer") for name, deps in import_graph().items()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_engine_module_outgrows_one_concept() -> None:
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in engine_modules().items()}
    assert {k: n for k, n in sizes.items() if n > MAX_LINES} == {}


if __name__ == "__main__":
    graph = import_graph()
    for name, path in engine_modules().items():
        inner = sorted(d for d in graph[name] if d in graph)
        lines = len(path.read_text(encoding="utf-8").splitlines())
        print(f"{name:<24} {lines:>5}  -> {', '.join(inner) or '-'}")
    print("cycles:", cycles(graph) or "none")
    sys.exit(1 if cycles(graph) else 0)
