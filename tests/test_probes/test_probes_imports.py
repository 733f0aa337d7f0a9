"""probes/'s shape, read from its source with ast: it is the user's side of a probe (imported by their training
script, or run as a collector), so it never imports the engine or the trainer, and the emitters a script imports
stand on the standard library alone (transformers and Lightning only inside the callbacks that need them)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import importgraph
from importgraph import ROOT

# What a user's script runs by importing `probes.auto`: nothing beyond the standard library at import time.
EMITTERS = ("probes", "probes.emit", "probes.auto")


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    return importgraph.import_graph("probes", root)


def top_level_imports(path: Path) -> set[str]:
    """The modules a file imports when it is imported: its module-level statements only, not its functions."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module != "__future__":
            names.add((node.module or "").split(".")[0])
    return names


def test_probes_never_import_the_engine_or_the_trainer() -> None:
    offenders = {n: sorted(d for d in deps if d.split(".")[0] in ("engine", "trainer")) for n, deps in graph().items()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_emitters_a_script_imports_stand_on_the_standard_library_alone() -> None:
    modules = importgraph.modules("probes")
    foreign = {
        name: sorted(m for m in top_level_imports(modules[name]) if m not in sys.stdlib_module_names | {"probes"})
        for name in EMITTERS
    }
    assert {k: v for k, v in foreign.items() if v} == {}


def test_a_third_party_import_at_an_emitters_top_is_found(tmp_path: Path) -> None:
    bad = tmp_path / "emit.py"
    bad.write_text(
        "from __future__ import annotations\nimport json\nimport transformers\n\ndef f():\n    import torch\n"
    )
    assert top_level_imports(bad) - set(sys.stdlib_module_names) == {"transformers"}
