"""Nothing of a leg outlives the engine: a SIGKILL of the engine takes the leg with it, whatever escaped its
process group (a daemon, an orphan, a daemon that cleared its environment, torchrun and its ranks). Real
processes, real signals."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from engine_helpers import (
    LEG,
    QUIET,
    engine_started,
    leg,
    torchrun_leg,
    write_spec,
)
from processes import gone, pid_in, still_alive


@pytest.mark.parametrize("escape", ["@daemon", "@orphan", "@daemon_noenv"])
def test_sigkill_of_the_engine_takes_the_whole_leg_with_it(tmp_path, escape):
    leader, escaped = tmp_path / "leader.pid", tmp_path / "escaped.pid"
    spec = write_spec(tmp_path / "s.yaml", [leg(f"{escape}:{escaped}", f"@pidfile:{leader}", "@forever")])
    proc = engine_started("run", str(spec), "--run-dir", "r", cwd=tmp_path, **QUIET)
    try:
        pids = [pid_in(leader), pid_in(escaped)]
        assert not any(gone(p) for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert still_alive(pids, timeout=20) == []
    finally:
        for p in [leader, escaped]:
            if p.exists() and not gone(int(p.read_text())):
                os.kill(int(p.read_text()), signal.SIGKILL)


def test_a_child_orphaned_at_once_dies_with_the_leg(tmp_path):
    from engine.run.process import run_command

    escaped = tmp_path / "escaped.pid"
    result = run_command([sys.executable, LEG, f"@orphan:{escaped}"], timeout_s=30)
    assert result.rc == 0
    assert still_alive([pid_in(escaped)], timeout=0.5) == []


@pytest.mark.slow
def test_sigkill_of_the_engine_takes_torchrun_and_its_ranks_with_it(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    spec = write_spec(tmp_path / "s.yaml", [torchrun_leg("sleep", str(pids), timeout_s=600)])
    proc = engine_started("run", str(spec), "--run-dir", "r", cwd=tmp_path, **QUIET)
    ranks = [pid_in(pids / "rank0.pid", 120), pid_in(pids / "rank1.pid", 120)]
    try:
        import psutil

        agent = psutil.Process(ranks[0]).parent()
        victims = ranks + ([agent.pid] if agent is not None and agent.pid != proc.pid else [])
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert still_alive(victims, timeout=20) == []
    finally:
        for pid in ranks:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
