"""The trainer's modules import one another in one direction: no cycle, not even one hidden inside a
function (a lazy import), and no trainer module imports the engine; none outgrows one concept. Read from the
source with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 700  # a module past this holds more than one concept


def import_graph(package: str) -> dict[str, set[str]]:
    """{module: the modules of any first-party package it imports, at any depth of its code}; a subpackage's
    modules included (its ``__init__`` under the subpackage's own name)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name == package:
            continue
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from trainer import model` names a module; `from trainer.model import Llama` a member.
                deps |= {
                    f"{node.module}.{a.name}" if node.module in ("trainer", "engine") else node.module
                    for a in node.names
                }
        graph[name] = {d for d in deps if d.split(".")[0] in ("trainer", "engine") and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk, each as the list of modules around it."""
    found, state, stack = [], {}, []

    def visit(m: str) -> None:
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                found.append(stack[stack.index(d) :] + [d])
            elif d not in state and d in graph:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def test_no_import_cycle_in_the_trainer():
    assert cycles(import_graph("trainer")) == []


def test_the_cycle_finder_sees_a_lazy_import_cycle():
    graph = {
        "trainer.store.local": {"trainer.store.hub"},
        "trainer.store.hub": {"trainer.store.local"},
        "trainer.model": set(),
    }
    assert cycles(graph) == [["trainer.store.hub", "trainer.store.local", "trainer.store.hub"]]


def test_no_trainer_module_imports_the_engine():
    graph = import_graph("trainer")
    assert {
        m: sorted(d for d in deps if d.startswith("engine"))
        for m, deps in graph.items()
        if any(d.startswith("engine") for d in deps)
    } == {}
    chain = ("trainer.collector", "trainer.store", "trainer.store.url", "trainer.store.hub")
    assert all(dep in graph[m] for m, dep in zip(chain, chain[1:]))


def test_no_trainer_module_outgrows_one_concept():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in (ROOT / "trainer").rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
