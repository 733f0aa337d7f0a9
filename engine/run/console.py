"""The engine's terminal: one writer for the reader thread and the main thread, and a leg's
progress (a live line on a TTY, a plain line every `every_s` seconds in a CI log).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol, TextIO

from engine import defaults
from engine.secrets import REDACTED
from engine.text import printable


class SafeStream:
    """A standard stream whose reader may leave (`engine run SPEC | head -1`) or whose disk may fill.

    The first write or flush that fails points the descriptor at /dev/null (so Python's own flush
    at exit cannot fail again) and every later write is dropped: the command goes on to its verdict
    and exit code. A BrokenPipeError must never end `engine run` with 0 and no verdict. `lost`
    says why output stopped (None while it flows).
    """

    def __init__(self, stream: TextIO | None, name: str, masks: Sequence[str] = ()) -> None:
        # Python sets sys.stdout to None when descriptor 1 was closed at start (`engine run >&-`).
        self.stream: TextIO = stream if stream is not None else open(os.devnull, "w")
        self.name = name
        self.lost: str | None = None if stream is not None else "closed before the engine started"
        # Credentials the command line carries in a URL's userinfo (`--set x=https://bob:PASS@host`): an
        # argparse or refusal message that quotes the argument must not show them, whatever value took it.
        self.masks = sorted(set(masks), key=len, reverse=True)

    def write(self, text: str) -> int:
        if self.lost is None:
            shown = text
            for secret in self.masks:
                shown = shown.replace(secret, REDACTED)
            try:
                self.stream.write(shown)
                return len(text)
            except (OSError, ValueError) as exc:
                self._lose(exc)
        return len(text)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self.stream.flush()
            except (OSError, ValueError) as exc:
                self._lose(exc)

    def isatty(self) -> bool:
        if self.lost is not None:
            return False
        try:
            return bool(self.stream.isatty())
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def _lose(self, exc: BaseException) -> None:
        self.lost = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
        try:
            fd = self.stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass  # not a real descriptor (a test's capture): dropping the writes is enough


class Progress(Protocol):
    """What the display reads of a leg's progress (output.ProgressState)."""

    step: int | None
    total: int | None
    done_at: float | None  # time.monotonic() when the leg printed its last step
    phase: str | None  # what it does since (validating, pushing), from the spec's `phases`
    phase_at: float | None

    def rate(self) -> float | None: ...

    def eta_s(self) -> float | None: ...


class Console:
    """Serialises printing from the reader thread and the main thread; owns the TTY live line."""

    def __init__(self, out: TextIO = sys.stdout, is_tty: bool | None = None, err: TextIO | None = None) -> None:
        self.out = out
        self.err = err if err is not None else sys.stderr
        if is_tty is None:
            isatty = getattr(out, "isatty", None)
            is_tty = bool(isatty and isatty())
        self.is_tty = is_tty
        self._lock = threading.Lock()
        self._live = 0  # width of the live line currently shown, 0 if none

    def line(self, text: str) -> None:
        with self._lock:
            self._clear_live()
            self.out.write(printable(text) + "\n")
            self.out.flush()

    def warn(self, text: str) -> None:
        """A line on stderr that must not drown in the log: the live line is wiped first."""
        with self._lock:
            self._clear_live()
            self.out.flush()
            self.err.write(printable(text) + "\n")
            self.err.flush()

    def live(self, text: str) -> None:
        """Overwrite the live status line (TTY only)."""
        text = printable(text)
        with self._lock:
            pad = max(self._live - len(text), 0)
            self.out.write("\r" + text + " " * pad)
            self.out.flush()
            self._live = len(text)

    @property
    def showing_live(self) -> bool:
        return self._live > 0

    def end_live(self) -> None:
        with self._lock:
            if self._live:
                self.out.write("\n")
                self.out.flush()
                self._live = 0

    def _clear_live(self) -> None:
        if self._live:
            self.out.write("\r" + " " * self._live + "\r")
            self._live = 0


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _limit(seconds: float) -> str:
    """A timeout as it is written: `10m`, not `10m00s`."""
    text = format_duration(seconds)
    return text[:-3] if text.endswith("m00s") else text


def time_left(elapsed_s: float, timeout_s: float | None) -> str:
    """`, 9m12s left before the 10m timeout` (empty without a timeout)."""
    if not timeout_s:
        return ""
    left = timeout_s - elapsed_s
    if left <= 0:
        return f", past its {_limit(timeout_s)} timeout"
    return f", {format_duration(left)} left before the {_limit(timeout_s)} timeout"


def progress_text(
    name: str, state: Progress, elapsed_s: float, timeout_s: float | None = None, now: float | None = None
) -> str:
    """The progress line: step/total, rate and ETA while the leg steps; after its last step, the
    phase it is in (or how long ago the last step was); the time left before the timeout."""
    left = time_left(elapsed_s, timeout_s)
    if state.step is None:
        return f"  progress {name}: no step line yet ({format_duration(elapsed_s)} elapsed){left}"
    text = f"  progress {name}: step {state.step}" + (f"/{state.total}" if state.total else "")
    if state.total:
        text += f" ({100 * state.step // state.total}%)"
    if state.done_at is not None:
        now = time.monotonic() if now is None else now
        if state.phase is not None and state.phase_at is not None:
            return f"{text} done; {state.phase} for {format_duration(now - state.phase_at)}{left}"
        return f"{text} done {format_duration(now - state.done_at)} ago{left}"
    rate, eta = state.rate(), state.eta_s()
    text += f" {rate:.2g} step/s" if rate is not None else " -- step/s"
    text += f" ETA {format_duration(eta)}" if eta is not None else " ETA --"
    return text + left


class ProgressDisplay:
    """Shows a leg's progress: a live line on a TTY, else a plain line every `every_s` seconds;
    warns once (stderr, and `warning` for the evidence) when the ETA passes the time left."""

    def __init__(
        self, name: str, state: Progress, every_s: float | None, console: Console, timeout_s: float | None = None
    ) -> None:
        """`every_s` None: the leg has no progress rule, nothing is shown."""
        self.name, self.state, self.every_s, self.console = name, state, every_s, console
        self.timeout_s = timeout_s
        self.warning: dict[str, Any] | None = None
        self._next_plain = min(every_s, defaults.PROGRESS_FIRST_S) if every_s is not None else None
        self._shown = ""

    def tick(self, elapsed_s: float) -> None:
        if self.every_s is None:
            return
        self._watch_timeout(elapsed_s)
        if self.console.is_tty:
            text = progress_text(self.name, self.state, elapsed_s, self.timeout_s)
            # A printed line wipes the live line; redraw it even when nothing changed.
            if text != self._shown or not self.console.showing_live:
                self._shown = text
                self.console.live(text.strip())
        elif self._next_plain is not None and elapsed_s >= self._next_plain:
            self.console.line(progress_text(self.name, self.state, elapsed_s, self.timeout_s))
            while self._next_plain <= elapsed_s:
                self._next_plain += self.every_s

    def _watch_timeout(self, elapsed_s: float) -> None:
        """Once: the ETA at the current rate passes the time left before the timeout."""
        state = self.state
        if self.warning is not None or not self.timeout_s or state.done_at is not None:
            return
        eta, rate = state.eta_s(), state.rate()
        left = self.timeout_s - elapsed_s
        if eta is None or rate is None or eta <= left or left <= 0:  # past it, TIMEOUT says so
            return
        message = (
            f"at {rate:.2g} step/s, step {state.step}/{state.total} needs about {format_duration(eta)} more, "
            f"but {format_duration(max(left, 0))} are left before the {_limit(self.timeout_s)} timeout"
        )
        self.warning = {
            "at_s": round(elapsed_s, 1),
            "step": state.step,
            "total": state.total,
            "steps_per_s": round(rate, 4),
            "eta_s": round(eta, 1),
            "left_s": round(left, 1),
            "timeout_s": self.timeout_s,
            "message": message,
        }
        self.console.warn(f"WARNING {self.name} will not finish before its timeout: {message}")

    def close(self) -> None:
        if self.console.is_tty:
            self.console.end_live()
