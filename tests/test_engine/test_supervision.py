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
from pathlib import Path

import pytest
from engine_helpers import LEG, engine_started, leg, write_spec
from processes import gone, pid_in, still_alive

from engine.run import reaper, subreaper
from engine.run.process import run_command


def spec_file(path: Path, *actions: str, grace_s: int = 5) -> Path:
    return write_spec(path, [leg(*actions, timeout_s=120, grace_s=grace_s)], name="guarded")


@pytest.fixture
def cleanup():
    """Pid files of processes a failing test would leave behind: killed at the end."""
    files: list[Path] = []
    yield files
    for path in files:
        if path.exists() and path.read_text().strip() and not gone(int(path.read_text())):
            os.kill(int(path.read_text()), signal.SIGKILL)


def test_a_daemon_that_clears_its_environment_dies_with_the_leg(tmp_path, cleanup):
    daemon = tmp_path / "daemon.pid"
    cleanup.append(daemon)
    log = tmp_path / "leg.log"
    result = run_command([sys.executable, LEG, f"@daemon_noenv:{daemon}", f"@environ_of:{daemon}"], log_path=log)
    assert result.rc == 0 and "ENVIRON_BYTES=0" in log.read_text()  # no trace of the leg in it
    assert still_alive([pid_in(daemon)], timeout=0.5) == []


def test_the_leg_s_exit_code_and_its_signal_come_through_its_supervisor(tmp_path):
    assert run_command([sys.executable, LEG, "@rc:3"]).rc == 3
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert run_command([sys.executable, "-c", kill]).rc == -9
    result = run_command([sys.executable, LEG, "@ignore_term", "@forever"], timeout_s=0.5, grace_s=0.5)
    assert result.timed_out and result.rc == -9


def test_the_second_ctrl_c_takes_a_daemon_the_leg_started_during_its_grace(tmp_path, cleanup):
    leader, daemon = tmp_path / "leader.pid", tmp_path / "daemon.pid"
    cleanup += [leader, daemon]
    # On the first Ctrl-C's SIGTERM the leg starts a daemon that leaves no trace, then waits out
    # its 60 s grace; the second Ctrl-C must take the daemon too, though no one has seen it yet.
    spec = spec_file(
        tmp_path / "s.yaml", f"@on_term:@daemon_noenv:{daemon}", f"@pidfile:{leader}", "@forever", grace_s=60
    )
    proc = engine_started("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    try:
        pid_in(leader)
        proc.send_signal(signal.SIGINT)
        escaped = pid_in(daemon)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert json.loads((tmp_path / "r" / "evidence.json").read_text())["steps"]["leg"]["rc"] == -9
    assert still_alive([escaped], timeout=5) == []


def test_without_a_subreaper_the_marker_still_takes_a_daemon_that_keeps_its_environment(tmp_path, monkeypatch, cleanup):
    # Where no child subreaper exists (not Linux), the legs run as they always did: found by the marker.
    monkeypatch.setattr(subreaper, "_supported", False)
    daemon = tmp_path / "daemon.pid"
    cleanup.append(daemon)
    result = run_command([sys.executable, LEG, f"@daemon:{daemon}", "@pidfile:" + str(tmp_path / "leader.pid")])
    assert result.rc == 0
    assert int((tmp_path / "leader.pid").read_text()) != 0
    assert still_alive([pid_in(daemon)], timeout=0.5) == []


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


def test_engine_run_without_a_reaper_fails_the_leg_and_says_why(engine, tmp_path, broken_reaper):
    started = tmp_path / "started.pid"
    spec = spec_file(tmp_path / "s.yaml", f"@pidfile:{started}")
    out = engine("run", str(spec), "--run-dir", str(tmp_path / "r"), expect=5).out
    assert not started.exists()
    error = json.loads((tmp_path / "r" / "evidence.json").read_text())["steps"]["leg"]["error"]
    assert "without the reaper" in error and "No module named 'engine.run'" in error
    assert "WARNING: the reaper" in out and "did not start" in out
