"""Nothing of a leg outlives it, even what wipes every trace of it, and no leg runs unguarded.

A daemon that double-forks, calls setsid() and re-executes itself with an EMPTY environment carries
no marker: only the leg's supervisor, a child subreaper that adopts every orphan, can still find it.
The reaper that guards against an engine SIGKILL must say it is up before a leg starts. Real
processes, real signals, the real engine."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from engine.cli import main
from engine.run import reaper
from engine.run.process import run_command

ROOT = Path(__file__).resolve().parents[2]
LEG = str(Path(__file__).parents[1] / "legs" / "leg.py")
ENGINE = [sys.executable, "-m", "engine.cli"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def pid_in(path: Path, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def still_alive(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def spec_file(path: Path, *actions: str, grace_s: int = 5) -> Path:
    doc = {
        "version": 1,
        "name": "guarded",
        "budget_s": 1000,
        "steps": [
            {"name": "leg", "run": {"argv": [sys.executable, LEG, *actions], "timeout_s": 120, "grace_s": grace_s}}
        ],
        "checks": [{"name": "ran", "why": "the leg ran", "expr": "steps.leg.rc == `0`"}],
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    return path


@pytest.fixture
def cleanup():
    """Pid files of processes a failing test would leave behind: killed at the end."""
    files: list[Path] = []
    yield files
    for path in files:
        if path.exists() and path.read_text().strip() and alive(int(path.read_text())):
            os.kill(int(path.read_text()), signal.SIGKILL)


# ---------------------------------------------------------------- the reaper


@pytest.fixture
def broken_reaper(tmp_path, monkeypatch):
    """The next reaper cannot import the engine (as after a move that left its import root wrong)."""
    poison = tmp_path / "poison"
    poison.mkdir()
    (poison / "sitecustomize.py").write_text("import sys\nsys.modules['engine'] = None\n")
    monkeypatch.setenv("PYTHONPATH", str(poison))
    monkeypatch.setattr(reaper.Reaper, "_instance", None)


def test_a_reaper_that_cannot_start_refuses_the_leg_naming_why(tmp_path, broken_reaper):
    started = tmp_path / "started.pid"
    result = run_command([sys.executable, LEG, f"@pidfile:{started}"], log_path=tmp_path / "leg.log")
    assert result.rc == 126 and not started.exists()
    assert result.error.startswith("refusing to start the leg without the reaper that guards its processes: ")
    assert "did not start: it ended before it was ready (exit code 1)" in result.error
    assert "No module named 'engine.run'" in result.error  # its own output says why
    assert result.error in (tmp_path / "leg.log").read_text()


def test_engine_run_without_a_reaper_fails_the_leg_and_says_why(tmp_path, broken_reaper, capsys):
    started = tmp_path / "started.pid"
    spec = spec_file(tmp_path / "s.yaml", f"@pidfile:{started}")
    rc = main(["run", str(spec), "--run-dir", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert rc == 5 and not started.exists()
    error = json.loads((tmp_path / "r" / "evidence.json").read_text())["steps"]["leg"]["error"]
    assert "without the reaper" in error and "No module named 'engine.run'" in error
    assert "WARNING: the reaper" in out and "did not start" in out
