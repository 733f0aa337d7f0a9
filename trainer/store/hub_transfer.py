"""A time limit on every transfer to or from the Hub, whatever its size, and progress lines for long ones.

A read timeout ends a transfer that stops; one that trickles (a byte a second) never trips it, and a download of a
few hundred KB then takes days. So every body huggingface_hub sends or receives goes through a :class:`Transfer`:
one of N bytes must end within ``Timeouts.transfer_s(N)`` (the read timeout, plus N at the minimum rate
``SPECPROBE_HUB_MIN_RATE_KB_S``), and a body of unknown length must keep that rate on average. Past it the transfer
raises :class:`TransferTooSlow` (a ``TimeoutError``: the store tries the operation again, within its tries). A
transfer still running after ``SPECPROBE_HUB_PROGRESS_S`` logs how far it got, and again at that interval.

A download is one transfer however many requests the client makes for it: huggingface_hub resumes a cut download
with a Range request, and resets its own count of retries whenever bytes arrived, so a trickle would otherwise be
resumed forever. :func:`transfer_scope` makes the answers of one thread that carry the file (HTTP 200 or 206 to a
GET) count into one transfer, whose clock starts with the first of them (the store opens one around each download;
the client's metadata requests, token requests, error answers and the waits between them are not the transfer).
Transfers through ``hf_xet`` (its own HTTP stack) are outside it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, Iterator

from trainer.store.hub_settings import ENV, Timeouts

__all__ = ["Transfer", "TransferTooSlow", "transfer_scope", "scoped_transfer"]

log = logging.getLogger("trainer.hub")
# A long transfer's progress lines are INFO on a logger of their own, shown at that level by the trainer's
# log handler, while the rest of trainer.hub keeps the root's WARNING.
progress_log = logging.getLogger("trainer.hub.progress")
progress_log.setLevel(logging.INFO)
_MB = 1024.0 * 1024.0


class TransferTooSlow(TimeoutError):
    """A transfer ran past the time its size allows at the minimum rate."""


def _size(n: float) -> str:
    return f"{n / _MB:.1f} MB" if n >= _MB else f"{n / 1024.0:.1f} KB"


class Transfer:
    """Bytes moved by one transfer, checked against its time limit at each chunk (module docstring)."""

    def __init__(
        self, label: str, size: int | None, limits: Timeouts, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.label, self.size, self.limits, self.clock = label, size, limits, clock
        self.start = clock()
        self.done = 0
        self._next_progress = self.start + limits.progress_s
        self.started = True  # a scope's transfer starts with the first body that carries the file
        self._lock = threading.Lock()  # one transfer may be fed by a request and its resumption

    def begin(self) -> None:
        """Start the clock now, if it has not started (a scope's first answer with the file's bytes)."""
        if not self.started:
            self.started, self.start = True, self.clock()
            self._next_progress = self.start + self.limits.progress_s

    def allowed_s(self) -> float:
        """The longest this transfer may take: from its size, or from what has arrived when the size is unknown."""
        return self.limits.transfer_s(max(self.size or 0, self.done))

    def add(self, nbytes: int) -> None:
        """Count ``nbytes`` more; TransferTooSlow when the transfer is past its limit."""
        with self._lock:
            self.done += nbytes
            now = self.clock()
            took, allowed = now - self.start, self.allowed_s()
            if took > allowed:
                raise TransferTooSlow(
                    f"{self.label}: {self.done} of {self._of()} bytes in {took:.1f}s, slower than the "
                    f"{self.limits.min_rate_kb_s:g} KB/s a transfer must keep ({ENV['min_rate']}): it may take "
                    f"{allowed:.1f}s ({ENV['read']} {self.limits.read_s:g}s plus its size at that rate)"
                )
            if now >= self._next_progress:
                self._next_progress = now + self.limits.progress_s
                share = f" ({100.0 * self.done / self.size:.0f}%)" if self.size else ""
                progress_log.info(
                    "hub: %s: %s of %s%s after %.1fs, %s/s; it must end within %.0fs (%s)",
                    self.label,
                    _size(self.done),
                    _size(self.size) if self.size else "an unknown size",
                    share,
                    took,
                    _size(self.done / max(took, 1e-9)),
                    allowed,
                    ENV["min_rate"],
                )

    def _of(self) -> str:
        return str(self.size) if self.size is not None else "an unknown number of"

    def chunks(self, inner: Any) -> Iterator[bytes]:
        """``inner``'s chunks, each counted after it was handed on (the time to send it included)."""
        for chunk in inner:
            yield chunk
            self.add(len(chunk))


_scope = threading.local()


@contextlib.contextmanager
def transfer_scope(label: str, size: int | None, limits: Timeouts) -> Iterator[Transfer]:
    """Every response body this thread receives inside the block counts into one Transfer (a download and the
    requests the client resumes it with)."""
    outer = getattr(_scope, "current", None)
    _scope.current = Transfer(label, size, limits)
    _scope.current.started = False
    try:
        yield _scope.current
    finally:
        _scope.current = outer


def scoped_transfer() -> Transfer | None:
    """The transfer this thread's responses count into, if a scope is open."""
    return getattr(_scope, "current", None)
