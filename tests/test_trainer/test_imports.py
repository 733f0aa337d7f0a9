"""trainer/'s shape, read from its source with ast (tests/importgraph.py, the engine's walker): its floors,
imports only going down them, no import cycle, never the engine, no module that has outgrown one concept.
Imports inside functions count, and so do the packages a module's import runs first. The package faces
(trainer/store/__init__.py and the others) re-export their modules' names, so a module's edge to its own
package counts only when it imports that face by name (importgraph.import_graph says why).
`python tests/test_trainer/test_imports.py` prints the house and the module sizes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for `python tests/test_trainer/...` too
import importgraph
from importgraph import ROOT, climbs, cycles

MAX_LINES = 700  # a module past this holds more than one concept

# The floors from the ground up; a module may import its own floor and the ones below it, never above. The
# folders are floors of their own; a top-level module stands on the lowest floor its imports allow: the
# command line (cli) and the schedule need nothing of the trainer, preflight only reads a store URL, and the
# hub collector reads a store through the checkpoint protocol.
FLOORS = ("ground", "store", "model, data", "plan", "ckpt", "train")
TOP = {
    "trainer": "ground",
    "trainer.cli": "ground",
    "trainer.deps": "ground",
    "trainer.dist": "ground",
    "trainer.heap": "ground",
    "trainer.log": "ground",
    "trainer.runconfig": "ground",
    "trainer.schedule": "ground",
    "trainer.sigterm": "ground",
    "trainer.steptime": "ground",
    "trainer.preflight": "store",
    "trainer.plan": "plan",
    "trainer.collector": "ckpt",
    "trainer.train": "train",
}
FOLDERS = {"store": "store", "model": "model, data", "data": "model, data", "ckpt": "ckpt"}


def floor_of(name: str) -> str:
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in FOLDERS:
        return FOLDERS[parts[1]]
    return TOP.get(name, f"unknown ({name})")


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    return importgraph.import_graph("trainer", root, own_packages=False)


def test_every_trainer_module_stands_on_a_known_floor() -> None:
    assert {n: floor_of(n) for n in importgraph.modules("trainer") if floor_of(n) not in FLOORS} == {}


def test_trainer_imports_only_go_down_the_floors_even_lazily() -> None:
    assert climbs(import_graph(), FLOORS, floor_of) == []


def test_trainer_has_no_import_cycle_even_through_lazy_imports() -> None:
    assert cycles(import_graph()) == []


def test_only_the_entry_point_reads_the_command_line() -> None:
    """The command line stands on the ground (argparse alone), so the floors allow any module to import it; what
    the flags decide is trainer.plan's, and only `python -m trainer.train` builds the parser."""
    assert sorted(m for m, deps in import_graph().items() if "trainer.cli" in deps) == ["trainer.train"]


def test_no_face_imports_a_command_of_its_package() -> None:
    """`python -m trainer.data.mix` runs trainer/data/__init__.py first: a face that imported the command would
    have it loaded already when runpy runs it as __main__ (it warns, and the module then exists twice)."""
    graph = import_graph()
    commands = ("trainer.train", "trainer.preflight", "trainer.collector", "trainer.data.mix")
    assert {c: sorted(p for p in importgraph.parents(c) if c in graph[p]) for c in commands} == {
        c: [] for c in commands
    }


def test_the_graph_sees_lazy_imports_and_the_faces_they_run() -> None:
    """What the tests above stand on: an import inside a function (the collector's store opens the Hub backend
    lazily) and the face a module's import runs (the collector imports trainer.ckpt's names)."""
    graph = import_graph()
    assert "trainer.store.hub" in graph["trainer.store.url"]
    assert {"trainer.ckpt", "trainer.store", "trainer.log"} <= graph["trainer.collector"]
    assert "trainer.ckpt.scan" in graph["trainer.ckpt"]


def test_a_face_may_import_its_own_modules_but_a_module_may_not_import_its_face(tmp_path: Path) -> None:
    """A face that re-exports its modules' names closes no cycle (each module is complete before the face reads
    it); a module that imports its own face by name reads it half-built: that is a cycle, even lazily."""
    files = {
        "trainer/__init__.py": "",
        "trainer/ckpt/__init__.py": "from trainer.ckpt.scan import ResumeScan\nfrom trainer.ckpt.load import load\n",
        "trainer/ckpt/scan.py": "from trainer.ckpt.load import load\n",
        "trainer/ckpt/load.py": "def load():\n    from trainer.ckpt import ResumeScan\n",
    }
    importgraph.write_tree(tmp_path, files)
    graph = importgraph.import_graph("trainer", tmp_path, own_packages=False)
    assert graph["trainer.ckpt.scan"] == {"trainer.ckpt.load"}
    assert cycles(graph) == [["trainer.ckpt", "trainer.ckpt.load", "trainer.ckpt.scan"]]
    (tmp_path / "trainer/ckpt/load.py").write_text("def load():\n    from trainer.ckpt.scan import ResumeScan\n")
    graph = importgraph.import_graph("trainer", tmp_path, own_packages=False)
    assert cycles(graph) == [["trainer.ckpt.load", "trainer.ckpt.scan"]]  # a sibling cycle still counts
    (tmp_path / "trainer/ckpt/load.py").write_text("def load():\n    pass\n")
    assert cycles(importgraph.import_graph("trainer", tmp_path, own_packages=False)) == []
    # Counting each module's edge to its own package, every face would be a cycle.
    assert cycles(importgraph.import_graph("trainer", tmp_path)) == [
        ["trainer.ckpt", "trainer.ckpt.load", "trainer.ckpt.scan"]
    ]


def test_no_trainer_module_imports_the_engine() -> None:
    assert importgraph.importers_of(import_graph(), "engine") == {}


def test_no_trainer_module_outgrows_one_concept() -> None:
    assert importgraph.longer_than("trainer", MAX_LINES) == {}


if __name__ == "__main__":
    graph = import_graph()
    print("\n".join(importgraph.house("trainer", graph, FLOORS, floor_of)))
    print("climbs:", climbs(graph, FLOORS, floor_of) or "none")
    print("cycles:", cycles(graph) or "none")
    sys.exit(1 if cycles(graph) or climbs(graph, FLOORS, floor_of) else 0)
