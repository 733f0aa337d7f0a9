"""Without the trainer's dependencies (a core-only `pip install .`), each trainer command and the hub collector say
in one line which are missing and how to install them (trainer/deps.py), never an import traceback.

Each case runs a fresh interpreter in which importing the named modules fails as if they were not installed
(``sys.modules[name] = None``), and starts the command as ``python -m`` does (runpy, run as ``__main__``).
tests/test_engine/test_core_install.py runs the same commands in a real core-only venv.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL = "Install them: pip install '.[trainer]' (from the specprobe checkout)"


def without(modules: list[str], code: str, *argv: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where importing any of ``modules`` fails as if not installed."""
    block = f"import sys\nfor name in {modules!r}:\n    sys.modules[name] = None\n"
    return subprocess.run(
        [sys.executable, "-c", block + code, *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )


def command(module: str) -> str:
    """Code that starts ``python -m module`` with the arguments given after it."""
    return (
        f"import runpy\nsys.argv[0] = {module!r}\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    )


LOAD_AND_COLLECT = """
from importlib.metadata import entry_points
(hub,) = [ep for ep in entry_points(group="specprobe.collectors") if ep.name == "hub"]
collect = hub.load()  # what the engine does: the module must load without the trainer's dependencies
try:
    collect({"repo": sys.argv[1]}, {})
except Exception as e:
    print(f"{type(e).__name__}: {e}")
"""


def test_without_huggingface_hub_the_entry_point_loads_and_says_what_is_missing_in_one_line(tmp_path):
    proc = without(["huggingface_hub"], LOAD_AND_COLLECT, "hf://owner/name")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines() == [
        f"MissingDependencies: the hub collector needs the trainer's dependencies, missing here: huggingface_hub. "
        f"{INSTALL}"
    ]


def test_every_missing_dependency_is_named_even_for_a_local_store(tmp_path):
    proc = without(["huggingface_hub", "torch", "safetensors", "numpy"], LOAD_AND_COLLECT, f"file://{tmp_path}/o/x")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines() == [
        "MissingDependencies: the hub collector needs the trainer's dependencies, missing here: huggingface_hub, "
        f"torch, safetensors, numpy. {INSTALL}"
    ]
    assert not (tmp_path / "o").exists()


def test_the_collector_command_without_the_trainers_dependencies_prints_one_line_and_exits_3(tmp_path):
    proc = without(["torch"], command("trainer.collector"), "--repo", f"file://{tmp_path}/o/x")
    assert proc.returncode == 3 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: the hub collector needs the trainer's dependencies, missing here: torch. {INSTALL}"
    ]


def test_the_data_mix_command_without_numpy_and_torch_says_so_in_one_line_and_exits_3(tmp_path):
    args = ("fetch", "--repo", f"file://{tmp_path}/o/mix", "--out", str(tmp_path / "mix"))
    proc = without(["numpy", "torch"], command("trainer.data.mix"), *args)
    assert proc.returncode == 3 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: python -m trainer.data.mix needs the trainer's dependencies, missing here: torch, numpy. {INSTALL}"
    ]
    assert not (tmp_path / "mix").exists() and not (tmp_path / "o").exists()


def test_the_trainer_without_torch_says_so_in_one_line_and_exits_3(tmp_path):
    args = ("--root", str(tmp_path / "mix"), "--out", str(tmp_path / "out"), "--hub-repo", f"file://{tmp_path}/o/x")
    proc = without(["torch"], command("trainer.train"), *args, "--tokens", "1024")
    assert proc.returncode == 3 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: python -m trainer.train needs the trainer's dependencies, missing here: torch. {INSTALL}"
    ]


def test_preflight_lists_the_missing_dependencies_among_the_requirements(tmp_path):
    proc = without(
        ["huggingface_hub", "torch"], command("trainer.preflight"), "--gpus", "0", "--repo", f"file://{tmp_path}/o/x"
    )
    assert proc.returncode == 3 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [
        f"preflight: this run needs the trainer's dependencies, missing here: huggingface_hub, torch. {INSTALL}"
    ]


def test_an_import_error_of_something_else_is_left_as_it_is():
    """Only a trainer dependency that is not there becomes the one line: any other missing module (inside a
    dependency that is installed but broken, or the trainer's own) keeps its traceback."""
    code = (
        "from trainer.deps import command_imports\n"
        "with command_imports('python -m x', '__main__'):\n"
        "    import not_a_trainer_dependency\n"
    )
    proc = without([], code)
    assert proc.returncode == 1 and proc.stderr.splitlines()[0] == "Traceback (most recent call last):"
    assert proc.stderr.splitlines()[-1] == "ModuleNotFoundError: No module named 'not_a_trainer_dependency'"
