"""Ctrl-C and SIGTERM during a run (`StopSignals`), and the engine's last resort on the second one:
SIGKILL to its children (`kill_children`), each leg with its process group or its supervisor's
leader's group.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from engine.run import subreaper


class StopSignals:
    """Ctrl-C and SIGTERM (a job scheduler's timeout) during a run, however many arrive.

    The first one raises KeyboardInterrupt where the run is, once it is armed (a signal that
    arrives before is held until then): the runner stops the leg (SIGTERM, then SIGKILL after its
    grace), marks it interrupted and writes the evidence and the verdict. The ones after it never
    raise: a KeyboardInterrupt inside that cleanup would lose the evidence, the verdict or the exit
    code. The second SIGKILLs the engine's child processes (the running leg: its grace is not waited
    out, process.py then removes the rest of its tree); later ones are only counted.

    On leaving, the previous handlers come back; with `linger` (the `engine` program, about to
    exit) not once a signal arrived: the exit code is decided, and a later Ctrl-C, ignored, must
    not turn it into a traceback or a death by signal.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, linger: bool = False, kill: Callable[[], list[int]] | None = None) -> None:
        self.linger = linger
        self.kill = kill or kill_children
        self.count = 0
        self.armed = False
        self._pending = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.armed = False
        for sig, previous in self._previous.items():
            # SIG_IGN, not a Python handler: the interpreter puts SIG_DFL back for those at its
            # very end, and a Ctrl-C landing then would kill the process (-2) instead of 130.
            signal.signal(sig, signal.SIG_IGN if self.linger and self.count else previous)
        self._previous.clear()

    def arm(self) -> None:
        """From here the first signal raises; one that came before raises now."""
        if self._pending:
            self._pending = False
            raise KeyboardInterrupt("interrupted before the first step")
        self.armed = self.count == 0

    def disarm(self) -> None:
        """The steps are over (or stopping): nothing raises any more."""
        self.armed = False

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1:
            if self.armed:
                self.armed = False
                raise KeyboardInterrupt(f"signal {signum}")
            self._pending = True
            return
        if self.count == 2:
            killed = self.kill()
            _say_now(
                f"engine: {signal.Signals(signum).name} again: SIGKILL to the running leg "
                f"({len(killed)} process group{'s' if len(killed) != 1 else ''}); "
                "the evidence is still written"
                if killed
                else f"engine: {signal.Signals(signum).name} again: still writing the evidence"
            )
        elif self.count == 3:
            _say_now("engine: stopping already; the evidence and the verdict are being written")


def _say_now(text: str) -> None:
    """Straight to fd 2: a signal handler must not re-enter a buffered stream the main thread may
    be writing to at that very moment."""
    try:
        os.write(2, (text + "\n").encode())
    except OSError:
        pass


def _child_pids() -> list[int]:
    """The engine's direct children (/proc/<pid>/task/<tid>/children); empty where unreadable."""
    me = os.getpid()
    pids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{me}/task")
    except OSError:
        return pids
    for tid in tasks:
        try:
            with open(f"/proc/{me}/task/{tid}/children", "rb") as fh:
                pids += [int(x) for x in fh.read().split()]
        except (OSError, ValueError):
            continue
    return pids


def kill_children() -> list[int]:
    """SIGKILL every child of the engine, with its process group where it leads one (a leg runs
    in a session of its own); for a leg under a supervisor (engine/run/subreaper.py), its leader's
    group, so that the supervisor lives on to take the rest of the leg down; the pids signalled."""
    killed = []
    for pid in _child_pids():
        leader = subreaper.LEADERS.get(pid)
        try:
            if leader is not None:
                os.killpg(leader, signal.SIGKILL)
            elif os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return killed
