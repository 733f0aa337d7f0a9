"""A leg's processes: its process group, its tree, and what carries its marker, and how they are
signalled.

A process group is not enough: torchrun starts each worker in a session of its own, and a daemon
double-forks out of the group. The tree under the leg's root (its supervisor, engine/run/subreaper.py,
where there is one) is read while the leg runs; the processes carrying the leg's marker
(engine/run/reaper.py) are found wherever they went. Every kill goes to all three.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import Any

import psutil

from engine.run.reaper import kill_marked, marked

# Orphans are reaped by init, asynchronously; waiting this long for that keeps "nothing of the
# leg outlives it" observable when run_command returns.
GROUP_GONE_S = 5.0
GONE_POLL_S = 0.02
# How long a hold waits for every process of the leg to be stopped (one in uninterruptible I/O
# stops when the I/O ends); the evidence says which were not.
HOLD_WAIT_S = 5.0
HOLD_POLL_S = 0.005
# The states a process cannot run on from: it has stopped, or it is gone.
_HELD = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def kill_group(pgid: int, sig: int) -> bool:
    """Signal a whole process group; False when nothing of it is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        # A zombie-only group can answer EPERM on some kernels; nothing we can do there.
        return False


def group_alive(pgid: int) -> bool:
    return kill_group(pgid, 0)


def live(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ProcessTree:
    """Every process a leg started, even those that left its process group.

    A process group is not enough: torchrun starts each worker with start_new_session, so a kill
    of the leader's group leaves the ranks training (and pushing checkpoints) after the leg "ended".
    So the tree under the leader is snapshotted while it runs (psutil remembers each process's
    start time: a pid reused by an unrelated process is never signalled), and every process that
    carries the leg's marker is found too, wherever it went (a setsid daemon, a child whose parent
    exited before the tree was read). Every kill goes to the group, the tree and the marked.
    """

    def __init__(
        self, leader: int, marker: tuple[str, str] | None = None, group: int | None = None, exempt: Sequence[int] = ()
    ) -> None:
        self.leader = leader
        self.group = leader if group is None else group
        self.marker = marker
        self.exempt = set(exempt)
        self.known: dict[int, psutil.Process] = {}

    def refresh(self) -> None:
        if self.leader not in self.known:
            try:
                self.known[self.leader] = psutil.Process(self.leader)
            except psutil.Error:
                pass
        children: dict[int, list[psutil.Process]] = {}
        for proc in psutil.process_iter(["ppid"]):
            ppid = proc.info.get("ppid")
            if ppid is not None:
                children.setdefault(ppid, []).append(proc)
        stack = [pid for pid, proc in self.known.items() if live(proc)]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child.pid not in self.known:
                    self.known[child.pid] = child
                    stack.append(child.pid)

    def alive(self) -> list[psutil.Process]:
        procs = {p.pid: p for p in self.known.values() if live(p)}
        if self.marker is not None:
            procs.update((p.pid, p) for p in marked(*self.marker) if live(p))
        return list(procs.values())

    def signal(self, pgid: int, sig: int) -> None:
        self.refresh()
        kill_group(pgid, sig)
        for proc in self.alive():
            if proc.pid in self.exempt:
                continue
            try:
                proc.send_signal(sig)  # psutil refuses a pid reused by another process
            except (psutil.Error, OSError):
                pass

    def hold(self, pgid: int, wait_s: float = HOLD_WAIT_S) -> dict[str, Any]:
        """SIGSTOP every process of the leg (its supervisor spared), again for any it started
        meanwhile, and wait until each one is stopped (at most `wait_s`): what a signal sent next
        lands on. Returns `{processes: [{pid, name, state}], stopped, waited_s}`: `state` is the one
        each was in when the hold came (a leg that stopped itself at its point is `stopped`
        already), `stopped` whether every one of them is stopped now."""
        start = time.monotonic()
        seen: dict[int, dict[str, Any]] = {}
        procs: dict[int, psutil.Process] = {}
        # The processes known already first, and at once: every millisecond here is one the leg
        # runs on past its line. Then the whole table for any it started since, until none is new.
        new = [p for p in self.known.values() if p.pid not in self.exempt and live(p)]
        while new:
            for proc in new:
                procs[proc.pid] = proc
                seen[proc.pid] = {"pid": proc.pid, "name": _name(proc), "state": _state(proc)}
            kill_group(pgid, signal.SIGSTOP)
            for proc in new:
                try:
                    proc.suspend()
                except (psutil.Error, OSError):
                    pass
            self.refresh()
            new = [p for p in self.alive() if p.pid not in self.exempt and p.pid not in procs]
        deadline = start + wait_s
        while not all(_state(p) in _HELD for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(HOLD_POLL_S)
        stopped = all(_state(p) in _HELD for p in procs.values())
        return {
            "processes": [seen[pid] for pid in sorted(seen)],
            "stopped": stopped,
            "waited_s": round(time.monotonic() - start, 3),
        }

    def release(self, pgid: int) -> None:
        """SIGCONT what a hold stopped: a signal other than SIGKILL is only delivered to a running process."""
        self.signal(pgid, signal.SIGCONT)

    def kill_all(self, pgid: int) -> None:
        """SIGKILL everything of the leg; what carries the marker is stopped first, so that a
        forking process cannot outrun the kill."""
        self.signal(pgid, signal.SIGKILL)
        if self.marker is not None:
            kill_marked(*self.marker, timeout_s=GROUP_GONE_S)


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except (psutil.Error, OSError):
        return "?"


def _state(proc: psutil.Process) -> str:
    try:
        return str(proc.status())
    except psutil.NoSuchProcess:
        return psutil.STATUS_DEAD
    except (psutil.Error, OSError):
        return "unknown"


def await_gone(pgid: int, tree: ProcessTree, timeout_s: float) -> bool:
    """Wait until what was killed above is reaped (by init, not us), so that on return nothing of
    the leg is left; True when it is gone."""
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) or tree.alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(GONE_POLL_S)
    return True
