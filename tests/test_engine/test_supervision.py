"""Nothing of a leg outlives it, even what wipes every trace of it, and no leg runs unguarded.

A daemon that double-forks, calls setsid() and re-executes itself with an EMPTY environment carries
no marker: only the leg's supervisor, a child subreaper that adopts every orphan, can still find it.
The reaper that guards against an engine SIGKILL must say it is up before a leg starts. Real
processes, real signals, the real engine."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
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


# N chains; in each, a generation forks, calls setsid() and exits, until SECONDS have passed. The first
# takes an flock on LOCK, closes its output and clears its environment: the lock is free again only once
# the last process of the last chain is gone, and nothing in any of them says whose it is.
FORK_CHAINS = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/time.h>
#include <unistd.h>
static double now(void) { struct timeval tv; gettimeofday(&tv, 0); return tv.tv_sec + tv.tv_usec / 1e6; }
int main(int argc, char **argv) {  /* chains LOCK SECONDS N */
    if (argc == 4) {
        int fd = open(argv[1], O_RDWR | O_CREAT, 0644);
        flock(fd, LOCK_EX);
        int null = open("/dev/null", O_RDWR);  /* like a daemon: nothing left to read from it */
        dup2(null, 0), dup2(null, 1), dup2(null, 2);
        char end[64];
        snprintf(end, sizeof end, "%f", now() + atof(argv[2]));
        char *args[] = {argv[0], end, argv[3], 0};
        char *env[] = {0};
        execve(argv[0], args, env);
        return 127;
    }
    double end = atof(argv[1]);
    for (int i = 0; i < atoi(argv[2]); i++) {
        if (fork() == 0) {
            while (now() < end) {
                pid_t pid = fork();
                if (pid > 0) _exit(0);
                if (pid == 0) setsid();
            }
            _exit(0);
        }
    }
    sleep(1);  /* the leader ends once the chains are in full swing */
    return 0;
}
"""


@pytest.mark.skipif(not subreaper.supported(), reason="needs a child subreaper (Linux)")
def test_a_runaway_fork_chain_is_gone_when_the_run_ends(engine_process, tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler: a chain in Python forks too slowly to race the supervisor")
    (tmp_path / "chains.c").write_text(FORK_CHAINS)
    subprocess.run([compiler, "-O2", "-o", str(tmp_path / "chains"), str(tmp_path / "chains.c")], check=True)
    lock = tmp_path / "chains.lock"
    chains = {"name": "leg", "run": {"argv": [str(tmp_path / "chains"), str(lock), "40", "32"], "timeout_s": 60}}
    spec = write_spec(tmp_path / "s.yaml", [chains], name="chains")
    proc = engine_process("run", str(spec), "--run-dir", "r", cwd=tmp_path, timeout=120)
    fd = os.open(lock, os.O_RDWR)
    try:
        # Nothing of the 32 chains is left: the lock they held is free the moment the run is over.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fcntl.flock(fd, fcntl.LOCK_EX)  # wait for the chains' own end before failing
        pytest.fail(f"the fork chains outlived the run:\n{proc}")
    finally:
        os.close(fd)
    assert proc.code == 0, proc
    assert "still forking" not in (tmp_path / "r" / "logs" / "leg.log").read_text()
    # Nor did the leg wait for the chains to stop by themselves (40 s): they were killed.
    seconds = json.loads((tmp_path / "r" / "evidence.json").read_text())["steps"]["leg"]["seconds"]
    assert seconds < 30, seconds


def test_a_supervisor_that_cannot_end_its_leg_s_processes_in_time_says_so(tmp_path):
    """The bound of the supervisor's killing, hit on purpose (no time at all): it says so on the leg's
    output, naming what was left, rather than end as if nothing were."""
    code = (
        "import os, signal, sys, time; sys.path.insert(0, sys.argv[1]); import subreaper as s; "
        "s.KILL_TIMEOUT_S = 0; pid = os.fork()\n"
        "if pid == 0: time.sleep(30); os._exit(0)\n"
        "r, w = os.pipe(); print(s._kill_descendants(r), flush=True); os.kill(pid, signal.SIGKILL)"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(Path(subreaper.__file__).parent)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.startswith(
        "[specprobe: the leg's processes were still forking after 0 s of SIGKILL; 1 left (pids "
    )
    assert proc.stdout.rstrip().endswith("False"), proc.stdout + proc.stderr


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
