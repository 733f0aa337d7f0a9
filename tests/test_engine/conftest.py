"""The engine's command line in tests: `engine` runs it in this process (no interpreter start, no imports
again: most tests), `engine_process` as a real program (for the tests whose subject is the program: its
pipes, its signals, its exit status, an interpreter of its own).

    ran = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, env={"NAME": "value"}, expect=Exit.PASS)
    ran.code, ran.out, ran.err

`expect=` asserts the exit code and shows both streams when it differs. `env` holds for that one call (None
unsets a variable). In this process `engine.cli.main` restores what it changes: the standard streams, the
signal handlers of a run, the working directory and the variables set here; its one process-wide trace is
the reaper (engine/run/reaper.py), a child of this process for the rest of the session, as in any program
that runs legs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import pytest
from bundles import Baselines
from engine_helpers import Engine, Ran, as_process, expecting, in_process


@pytest.fixture
def engine(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Engine:
    """`engine ARGS` in this process."""

    def run(
        *args: str, cwd: Path | None = None, env: Mapping[str, str | None] | None = None, expect: int | None = None
    ) -> Ran:
        return expecting(in_process(args, capsys, monkeypatch, cwd, env), expect)

    return run


@pytest.fixture
def engine_process() -> Engine:
    """`engine ARGS` as a program (`python -m engine.cli`; `command=` another, `environ=` a whole environment)."""

    def run(*args: str, expect: int | None = None, **how: object) -> Ran:
        return expecting(as_process(args, **how), expect)  # type: ignore[arg-type]

    return run


@pytest.fixture(scope="session")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> Baselines:
    """The outcome of every check on each saved P4 bundle, untampered (tests/bundles.py), computed once."""
    return Baselines(tmp_path_factory.mktemp("baseline"))
