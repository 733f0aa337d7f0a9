"""The shipped probe specs (specs/probes/*.yaml) run by the real engine, in this process, on the shipped drivers.

Every mode of one probe runs in one working directory per test session, so the reference (under
``work_dir/runs/reference/``) is made by the first mode that needs it and reused by the others; a run that finds
another xdist worker making it waits on the engine's own lock there. What a test asserts is what a user reads: the
exit code, the VERDICT line, and the first difference the failing check names.
"""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from engine.cli import main

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SpecRun:
    code: int
    out: str
    err: str
    evidence: dict[str, Any]

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out}--- stderr\n{self.err}"

    @property
    def failed(self) -> list[str]:
        return self.evidence["verdict"]["failed"]

    def said_under(self, check: str) -> str:
        """The explain lines under a check's row: where it names the first difference."""
        lines = self.out.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(check + " "))
        rest = [line for line in lines[start + 1 :]]
        end = next((i for i, line in enumerate(rest) if not line.startswith("    ")), len(rest))
        return "\n".join(rest[:end])

    def step_row(self, step: str) -> str:
        return next(line for line in self.out.splitlines() if line.startswith(f"step:{step} "))


def work_dir(tmp_path_factory: pytest.TempPathFactory, probe: str) -> Path:
    """The one working directory of a probe's spec runs in this test session, whichever xdist worker asks."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's directory, above each worker's own
    where = root / f"probe-spec-{probe}"
    with FileLock(str(root / f"probe-spec-{probe}.lock")):
        where.mkdir(exist_ok=True)
    return where


def run_spec(probe: str, mode: str, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> SpecRun:
    """`engine run specs/probes/<probe>.yaml --mode <mode>` from ``cwd``, its run dir named after the mode."""
    monkeypatch.chdir(cwd)
    run_dir = cwd / f"run-{mode}"
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(
            ["run", str(ROOT / "specs" / "probes" / f"{probe}.yaml"), "--mode", mode, "--run-dir", str(run_dir)]
        )
    return SpecRun(code, out.getvalue(), err.getvalue(), json.loads((run_dir / "evidence.json").read_text()))
