"""A package's import graph, read from its source with ast, and what the layering tests ask of it: the
floors a module may import from, the cycles, the imports of a package it must never import, the modules grown
past one concept, and the house drawn floor by floor.

Imports inside functions count (a lazy import can climb a floor as well as a top one), relative imports are
resolved against the importing module's package, and so do the packages Python runs first: importing
`engine.diff.phrases` runs `engine/diff/__init__.py` before it, so its importer depends on `engine.diff` too.
tests/test_engine/test_layering.py holds the engine to its stages, tests/test_trainer/test_imports.py the
trainer to its floors; each prints its house when run as a script.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: str, root: Path = ROOT) -> dict[str, Path]:
    """{dotted name: source file} of every module of `package`, its subpackages' `__init__` files included
    (under the subpackage's own name)."""
    return {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}


def parents(name: str) -> set[str]:
    """The packages Python initialises before `name`: `engine.diff.phrases` -> engine.diff, engine."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def imports_of(name: str, path: Path, known: set[str], *, own_packages: bool = True) -> set[str]:
    """Every module `path` imports, at any depth of its code, with the packages each one runs first:
    `from engine.spec import plan` is engine.spec.plan when that is a module, else engine.spec.
    `own_packages=False` leaves out the packages `name` itself lives in, unless it imports one by name
    (import_graph says when that is right)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            named |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    found = set(named)
    for target in named:
        found |= parents(target)
    if not own_packages:
        found -= parents(name) - named
    return found - {name}


def import_graph(package: str, root: Path = ROOT, *, own_packages: bool = True) -> dict[str, set[str]]:
    """{module: every module it imports} over `package`'s modules (imports from outside it included).

    With `own_packages` (the default) a module also depends on the packages it lives in, which Python runs
    before it. A tree whose package faces re-export their modules' names (trainer/store/__init__.py) passes
    False: such a face imports its own modules, so each of them would close a cycle through it, yet Python
    has finished the module before the face reads a name from it. A module that imports its own package's
    face by name is still counted: that is the import that would find the face half-built."""
    found = modules(package, root)
    known = set(found)
    return {
        name: imports_of(name, path, known, own_packages=own_packages)
        | (parents(name) & known if own_packages else set())
        for name, path in found.items()
    }


def climbs(graph: dict[str, set[str]], floors: Sequence[str], floor_of: Callable[[str], str]) -> list[str]:
    """Every import that goes up a floor, as `importer (floor) -> imported (floor)`; `floors` from the ground up."""
    order = {s: i for i, s in enumerate(floors)}
    found = []
    for name, deps in sorted(graph.items()):
        for dep in sorted(d for d in deps if d in graph):
            if order.get(floor_of(dep), -1) > order.get(floor_of(name), -1):
                found.append(f"{name} ({floor_of(name)}) -> {dep} ({floor_of(dep)})")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a module importing itself
    (Tarjan's algorithm); each one is an import cycle. With `own_packages`, a package __init__ that imports
    its own modules is one too (each module runs the __init__ first), so the engine's stage packages'
    __init__ files hold only their docstring."""
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
                continue  # outside the package
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


def lines_of(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def house(
    package: str, graph: dict[str, set[str]], floors: Sequence[str], floor_of: Callable[[str], str], root: Path = ROOT
) -> list[str]:
    """The package drawn floor by floor from the ground up: each module, its lines and the modules of the
    package it imports. A package is left out where it only repeats what the line says already: the module's
    own packages, and the package of a module the line names."""
    found = modules(package, root)
    width = max(len(n) for n in found) + 1
    out = []
    for floor in floors:
        out.append(f"-- {floor}")
        for name, path in found.items():
            if floor_of(name) != floor:
                continue
            deps = {d for d in graph[name] if d in graph}
            implied = parents(name).union(*(parents(d) for d in deps))
            inner = sorted(deps - implied)
            out.append(f"   {name:<{width}} {lines_of(path):>5}  -> {', '.join(inner) or '-'}")
    return out


def importers_of(graph: dict[str, set[str]], package: str) -> dict[str, list[str]]:
    """{module: the modules of `package` it imports}, for each module of the graph that imports any."""
    found = {name: sorted(d for d in deps if d.split(".")[0] == package) for name, deps in graph.items()}
    return {name: deps for name, deps in found.items() if deps}


def longer_than(package: str, max_lines: int, root: Path = ROOT) -> dict[str, int]:
    """{module: its lines} for each module of `package` longer than `max_lines`: one that holds more than one concept."""
    sizes = {name: lines_of(path) for name, path in modules(package, root).items()}
    return {name: n for name, n in sizes.items() if n > max_lines}


def write_tree(root: Path, files: Mapping[str, str]) -> None:
    """Write `files` ({path under root: its source}) under `root`: a made-up package for a test of the walker."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
