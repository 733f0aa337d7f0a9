"""`engine ARGS` in this process from one working directory, for the reference, hold and snapshot tests: the
same in-process run as the `engine` fixture (engine_helpers.in_process), its directory set once for a test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from engine_helpers import Ran, expecting, in_process


class EngineRuns:
    """Runs `engine` in this process from one directory; `expect=` asserts the exit code."""

    def __init__(self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, cwd: Path) -> None:
        self.capsys, self.monkeypatch, self.cwd = capsys, monkeypatch, cwd
        monkeypatch.chdir(cwd)

    def __call__(self, *args: str, expect: int | None = None) -> Ran:
        return expecting(in_process(args, self.capsys, self.monkeypatch), expect)

    def evidence(self, run_dir: str) -> dict[str, Any]:
        return json.loads((self.cwd / run_dir / "evidence.json").read_text())


def dump(doc: dict[str, Any]) -> str:
    """A spec document as YAML, each string on one line as written (no folding for the engine to refuse)."""
    return yaml.safe_dump(doc, sort_keys=False, width=1 << 20)
