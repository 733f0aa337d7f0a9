"""`engine ARGS` in this process for the reference, hold and snapshot tests: the exit code and both
streams, shown whole when an expected code differs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.cli import main


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out}--- stderr\n{self.err}"


class EngineRuns:
    """Runs `engine` in this process from one directory; `expect=` asserts the exit code."""

    def __init__(self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, cwd: Path) -> None:
        self.capsys, self.cwd = capsys, cwd
        monkeypatch.chdir(cwd)

    def __call__(self, *args: str, expect: int | None = None) -> Ran:
        self.capsys.readouterr()
        ran = Ran(main(list(args)), *self.capsys.readouterr())
        if expect is not None:
            assert ran.code == expect, ran
        return ran

    def evidence(self, run_dir: str) -> dict[str, Any]:
        return json.loads((self.cwd / run_dir / "evidence.json").read_text())


def dump(doc: dict[str, Any]) -> str:
    """A spec document as YAML, each string on one line as written (no folding for the engine to refuse)."""
    return yaml.safe_dump(doc, sort_keys=False, width=1 << 20)
