"""Processes in tests, on psutil: the pid a process wrote, whether it is gone, what a process started, and
waits whose deadlines grow with the machine's load.

Import as `from processes import ...` (pytest puts tests/ on sys.path). A test judges the processes it
started (a pid a leg wrote, the descendants of a process it holds), never every process of the machine:
other people's processes come and go on a shared machine.

A deadline is written for a quiet machine and passed through `patience()`, which stretches it by how much
slower than usual a bare Python starts right now; a wait is on an event (a file written, a process gone),
polled until that stretched deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from subprocess import Popen
from typing import Callable, Sequence, TypeVar

import psutil

T = TypeVar("T")

# `python -c pass` (site included, as a leg starts) on a quiet machine of the kind the suite runs on.
QUIET_START_S = 0.05
POLL_S = 0.02


def start_job(command: Sequence[str], *, cwd: Path, env: dict[str, str], stderr: int = subprocess.STDOUT) -> Popen:
    """`command` in a session of its own (a kill of its group reaches all of it, and nothing of the test), its
    output read line by line as it comes (stderr merged in unless `stderr` says otherwise)."""
    return subprocess.Popen(
        list(command),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        bufsize=1,
        start_new_session=True,
    )


def start_seconds() -> float:
    """How long a bare Python takes to start and exit here, now."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.monotonic() - started


def slowdown() -> float:
    """How many times slower than on a quiet machine a process starts now (1 at the least); the quickest of
    three starts, so that one start that lost the processor for a moment does not count as load."""
    return max(1.0, min(start_seconds() for _ in range(3)) / QUIET_START_S)


def patience(seconds: float) -> float:
    """`seconds` of a quiet machine, stretched by the load measured now."""
    return seconds * slowdown()


def wait_until(done: Callable[[], T], timeout: float, what: str) -> T:
    """Poll `done()` until it returns something true, for `patience(timeout)` at most; that value, or an
    AssertionError saying `what` never happened."""
    value = done()
    if value:
        return value  # most waits are over before they start: no need to measure the load
    limit = patience(timeout)
    deadline = time.monotonic() + limit
    while True:
        time.sleep(POLL_S)
        value = done()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} within {limit:.1f} s")


def pid_in(path: Path, timeout: float = 10.0) -> int:
    """The pid a process wrote to `path`, once it is there whole."""

    def read() -> int | None:
        try:
            text = path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    return wait_until(read, timeout, f"{path} never held a pid")


def file_says(path: Path, text: str, timeout: float = 30.0) -> None:
    """Wait until the file at `path` holds `text` (a leg's log line, say)."""

    def says() -> bool:
        try:
            return text in path.read_text()
        except OSError:
            return False

    wait_until(says, timeout, f"{path} never said {text!r}")


def gone(pid: int) -> bool:
    """Whether `pid` runs nothing: no such process, or a zombie (dead, its exit status not yet collected by
    its parent, which may be a slow init)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def still_alive(pids: list[int], timeout: float) -> list[int]:
    """The pids of `pids` still running after waiting up to `patience(timeout)` for all of them to end."""
    deadline = time.monotonic() + patience(timeout)
    while any(not gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return [p for p in pids if not gone(p)]


def group_gone(pgid: int) -> bool:
    """Whether process group `pgid` holds no running process (zombies do not count)."""
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, psutil.Error):
            continue
    return True


def descendants(pid: int) -> list[int]:
    """Every running descendant of `pid` (torchrun starts each worker in a session of its own: its process
    group alone would miss the ranks)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [child.pid for child in children if not gone(child.pid)]


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s process group and every descendant's group: a crash of the whole job at once."""
    for q in [pid, *descendants(pid)]:
        for kill in (lambda q=q: os.killpg(os.getpgid(q), signal.SIGKILL), lambda q=q: os.kill(q, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass
