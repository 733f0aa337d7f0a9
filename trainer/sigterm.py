"""SIGTERM as an exception a session unwinds through, so that what it holds (the store's lease) is released.

torchrun's agent SIGTERMs every surviving rank when one rank exits (a refusal, a crash), and a scheduler
preempts a job the same way. Python's default action ends the process on the spot: no ``finally`` runs, and
rank 0's lease then blocks every other machine until it expires. :class:`SigTerm` turns the first SIGTERM
into :class:`Terminated` on the main thread (``install``), so the session's cleanup runs; a SIGTERM that lands
while a cleanup that must finish runs (``shielded``: the lease's release) is only recorded, and a Ctrl-C there
waits for the cleanup's end. When the session is over the process ends by SIGTERM all the same
(``end_by_signal``): the launcher sees -15, never a success.

Python runs a signal handler on the main thread between bytecodes: a SIGTERM that lands while that thread is
blocked inside one C call (a collective waiting for a peer that hangs) takes effect when the call returns. A
launcher's SIGKILL after its grace (torchrun: 30 s) ends such a process regardless, leaving the lease to expire.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator

__all__ = ["Terminated", "install", "received", "shielded", "end_by_signal"]


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, so no ``except Exception`` on the way swallows it."""


class _State:
    received = False  # a SIGTERM arrived (the process ends by SIGTERM once its session is over)
    shields = 0  # cleanups running now that must not be cut short


def install() -> None:
    """Turn SIGTERM into Terminated (call on the main thread, once per process)."""
    signal.signal(signal.SIGTERM, _handle)


def _handle(signum: int, frame: object) -> None:
    first = not _State.received
    _State.received = True
    if first and not _State.shields:
        raise Terminated("SIGTERM")


def received() -> bool:
    return _State.received


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Cleanup that must run to its end (releasing the lease): a SIGTERM meanwhile is recorded, not raised; a
    Ctrl-C (SIGINT) meanwhile is held back and handled as usual (KeyboardInterrupt) once the cleanup is done."""
    _State.shields += 1
    held: list[int] = []  # a SIGINT that arrived during the cleanup
    main = threading.current_thread() is threading.main_thread()  # only the main thread sets handlers
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum)) if main else None
    try:
        yield
    finally:
        _State.shields -= 1
        if main:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
            if held:  # delivered again to the handler in place before (raise, die or ignore, as it would have)
                signal.raise_signal(signal.SIGINT)


def end_by_signal() -> None:
    """End this process by SIGTERM with the default action (the exit status a launcher expects)."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
