"""engine/'s shape, read from its source with ast: the stages as folders, imports only going down them
(spec -> plan -> legs -> evidence -> verdict), no import cycle, never the trainer, no module that has
outgrown one concept. Imports inside functions count (a lazy import can climb a stage as well as a top
one), and so does the package a module lives in: importing `engine.diff.phrases` runs
`engine/diff/__init__.py` first. `python tests/test_engine/test_layering.py` prints the graph and the module sizes."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for `python tests/test_engine/...` too
import importgraph
from importgraph import ROOT, cycles

MAX_LINES = 700

# The stages from the ground up; a module may import its own stage and the ones below it, never above.
# `engine` itself and its top-level modules (types, defaults, limits, secrets, secret_forms, text) are the ground floor.
STAGES = ("ground", "expr", "spec", "run", "judge", "show", "diff", "cli")


def engine_modules(root: Path = ROOT) -> dict[str, Path]:
    return importgraph.modules("engine", root)


def stage_of(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 1:
        return "ground"
    if parts[1] == "cli":
        return "cli"
    if parts[1] in STAGES:
        return parts[1]
    return "ground" if len(parts) == 2 else f"unknown ({parts[1]})"


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    return importgraph.import_graph("engine", root)


def climbs(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up a stage, as `importer (stage) -> imported (stage)`."""
    return importgraph.climbs(graph, STAGES, stage_of)


def test_every_engine_module_lives_in_a_known_stage() -> None:
    assert {n: stage_of(n) for n in engine_modules() if stage_of(n) not in STAGES} == {}


def test_engine_imports_only_go_down_the_stages_even_lazily() -> None:
    assert climbs(import_graph()) == []


def test_engine_has_no_import_cycle_even_through_lazy_imports() -> None:
    assert cycles(import_graph()) == []


def test_a_lazy_import_that_climbs_a_stage_through_a_package_is_found(tmp_path: Path) -> None:
    """The shape that once hid a cycle: the judge lazily imports a diff module, and importing any module
    of `engine.diff` runs its __init__, which reaches back down to the judge."""
    files = {
        "engine/__init__.py": "",
        "engine/judge/__init__.py": "",
        "engine/judge/recheck.py": "def change():\n    from engine.diff.phrases import argv_delta\n",
        "engine/diff/__init__.py": "from engine.diff.compare import compare\n",
        "engine/diff/compare.py": "from engine.judge import recheck\n",
        "engine/diff/phrases.py": "import json\n",
    }
    importgraph.write_tree(tmp_path, files)
    graph = import_graph(tmp_path)
    assert "engine.diff" in graph["engine.judge.recheck"]  # the package edge the old test missed
    assert climbs(graph) == [
        "engine.judge.recheck (judge) -> engine.diff (diff)",
        "engine.judge.recheck (judge) -> engine.diff.phrases (diff)",
    ]
    assert cycles(graph) == [["engine.diff", "engine.diff.compare", "engine.diff.phrases", "engine.judge.recheck"]]


def test_engine_never_imports_the_trainer() -> None:
    assert importgraph.importers_of(import_graph(), "trainer") == {}


def test_no_engine_module_outgrows_one_concept() -> None:
    assert importgraph.longer_than("engine", MAX_LINES) == {}


def test_only_the_record_the_reaper_and_the_plan_name_the_secret_filter() -> None:
    """The secret filter (engine/secrets.py's Scrubber and TreeScrubber) is named only where a plan's
    filter is built (spec/plan.py), where a run's output leaves (run/record.py) and where a killed
    engine's run dir is masked (run/reaper.py): every other module writes through a Record, so the
    masking holds without each author remembering it. Only the plan and the secrets build a plan's
    filter (`for_plan`)."""
    filters = {"Scrubber", "TreeScrubber"}
    naming, building = set(), set()
    for name, path in engine_modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        named |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        if (named | attributes) & filters:
            naming.add(name)
        if "for_plan" in attributes:
            building.add(name)
    assert naming - {"engine.secrets"} == {"engine.run.record", "engine.run.reaper", "engine.spec.plan"}
    assert building == {"engine.spec.plan"}


if __name__ == "__main__":
    graph = import_graph()
    print("\n".join(importgraph.house("engine", graph, STAGES, stage_of)))
    print("climbs:", climbs(graph) or "none")
    print("cycles:", cycles(graph) or "none")
    sys.exit(1 if cycles(graph) or climbs(graph) else 0)
