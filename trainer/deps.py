"""The trainer's dependencies beyond the engine's (pyproject's ``trainer`` extra), and the one line that says which
are missing and how to install them.

A core-only install (``pip install .``: the engine alone) can still start the trainer's commands, from a spec's
legs. Each of them says in one line what is missing instead of ending on an import traceback:

- ``python -m trainer.train`` and ``python -m trainer.data.mix`` import their dependencies inside
  :func:`command_imports`, which prints the line and exits with :data:`EXIT_MISSING` when run as a command;
- ``python -m trainer.preflight`` lists the line among the requirements it found missing;
- the hub collector (``trainer/collector.py``) raises :class:`MissingDependencies` with it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from typing import Iterator, Sequence

__all__ = [
    "TRAINER_DEPENDENCIES",
    "INSTALL",
    "EXIT_MISSING",
    "MissingDependencies",
    "missing_dependencies",
    "missing_message",
    "require_trainer_dependencies",
    "command_imports",
]

# What the trainer's checkpoints, stores and data need beyond the engine (pyproject's trainer extra).
TRAINER_DEPENDENCIES = ("huggingface_hub", "torch", "safetensors", "numpy")
INSTALL = "pip install '.[trainer]' (from the specprobe checkout)"
EXIT_MISSING = 3  # the trainer's "a precondition is not met", preflight's "a requirement is missing"


class MissingDependencies(ImportError):
    """The trainer's dependencies are not installed; the message is one line naming them and the fix."""


def missing_dependencies(names: Sequence[str] = TRAINER_DEPENDENCIES) -> list[str]:
    """The ones of ``names`` that cannot be imported here, in their order (nothing is imported to find out)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def missing_message(who: str, missing: Sequence[str]) -> str:
    """The one line: ``who`` needs the trainer's dependencies, which are missing, and the install command."""
    return f"{who} needs the trainer's dependencies, missing here: {', '.join(missing)}. Install them: {INSTALL}"


def require_trainer_dependencies(who: str) -> None:
    """MissingDependencies naming every one of TRAINER_DEPENDENCIES that cannot be imported here."""
    missing = missing_dependencies()
    if missing:
        raise MissingDependencies(missing_message(who, missing))


@contextlib.contextmanager
def command_imports(who: str, module: str) -> Iterator[None]:
    """Around a command module's imports: an import of a trainer dependency that is not installed becomes the
    one line. Run as the command (``module`` is ``"__main__"``), it is printed to stderr and the process exits
    with EXIT_MISSING; imported as a library, it is raised as MissingDependencies. Any other import error
    (a broken install of a dependency that is there) stays as it is."""
    try:
        yield
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in TRAINER_DEPENDENCIES:
            raise
        line = missing_message(who, missing_dependencies() or [e.name or "?"])
        if module != "__main__":
            raise MissingDependencies(line) from None
        print(f"error: {line}", file=sys.stderr, flush=True)
        sys.exit(EXIT_MISSING)
