"""engine/run/collectors.py: built-in collectors and entry-point discovery."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from engine.run.collectors import CollectorError, collect, known_collectors

LEG = str(Path(__file__).parents[1] / "legs" / "leg.py")


def test_json_file_reads_relative_to_cwd(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"step": 10, "files": ["a"]}))
    assert collect("json_file", {"path": "state.json"}, {"cwd": str(tmp_path)}) == {"step": 10, "files": ["a"]}


def test_json_file_missing_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CollectorError, match=r"json_file: .*nope\.json: no such file"):
        collect("json_file", {"path": str(tmp_path / "nope.json")}, {})


def test_json_file_invalid_names_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "a": 1,\n  "b": }\n')
    with pytest.raises(CollectorError, match=r"bad\.json:3:8: invalid JSON"):
        collect("json_file", {"path": str(bad)}, {})


def test_command_parses_the_last_non_empty_line() -> None:
    args = {"argv": [sys.executable, LEG, "listing repo...", '{"checkpoints": [10, 20]}', ""]}
    assert collect("command", args, {}) == {"checkpoints": [10, 20]}


def test_command_parses_whole_pretty_printed_output() -> None:
    code = "import json; print(json.dumps({'a': [1, 2]}, indent=2))"
    assert collect("command", {"argv": [sys.executable, "-c", code]}, {}) == {"a": [1, 2]}


def test_command_failure_names_the_command_and_rc() -> None:
    with pytest.raises(CollectorError, match=r"exited with rc 4; last line: 'no repo'"):
        collect("command", {"argv": [sys.executable, LEG, "no repo", "@rc:4"]}, {})


def test_command_timeout_is_an_error() -> None:
    with pytest.raises(CollectorError, match="timed out after 0.5 s"):
        collect("command", {"argv": [sys.executable, LEG, "@forever"], "timeout_s": 0.5, "grace_s": 0.5}, {})


def test_command_env_and_non_json_output() -> None:
    args = {"argv": [sys.executable, LEG, "@env:SPECPROBE_X"], "env": {"SPECPROBE_X": "42"}}
    with pytest.raises(CollectorError, match="SPECPROBE_X=42"):
        collect("command", args, {})


def test_unknown_collector_lists_the_known_ones() -> None:
    with pytest.raises(
        CollectorError,
        match=r"unknown collector 'nope'; known: .*command.*"
        r"json_file",
    ):
        collect("nope", {}, {})


def test_known_collectors_include_builtins_and_entry_points() -> None:
    names = known_collectors()
    assert {"json_file", "command"} <= set(names)
    # pyproject.toml registers the trainer's `hub` collector in the specprobe.collectors group.
    assert "hub" in names
    assert names == sorted(names)
