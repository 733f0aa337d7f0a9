"""The engine's terminal: one writer for the reader thread and the main thread, and a leg's
progress (a live line on a TTY, a plain line every `every_s` seconds in a CI log).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Protocol, TextIO


class SafeStream:
    """A standard stream whose reader may leave (`engine run SPEC | head -1`) or whose disk may fill.

    The first write or flush that fails points the descriptor at /dev/null (so Python's own flush
    at exit cannot fail again) and every later write is dropped: the command goes on to its verdict
    and exit code. A BrokenPipeError must never end `engine run` with 0 and no verdict. `lost`
    says why output stopped (None while it flows).
    """

    def __init__(self, stream: TextIO | None, name: str) -> None:
        # Python sets sys.stdout to None when descriptor 1 was closed at start (`engine run >&-`).
        self.stream: TextIO = stream if stream is not None else open(os.devnull, "w")
        self.name = name
        self.lost: str | None = None if stream is not None else "closed before the engine started"

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                return self.stream.write(text)
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


# What a leg's text must not do to the terminal it is echoed on: escape sequences clear the screen,
# set the window title or write the clipboard; other control bytes move the cursor; bidirectional
# overrides make text read differently than it is. Each is shown as a visible escape instead.
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F]}
_CONTROLS.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})
_CONTROLS.update({c: f"\\u{c:04x}" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]})


def printable(text: str) -> str:
    """`text` with every control character (newline and tab excepted) shown as an escape."""
    return text.translate(_CONTROLS)


class Progress(Protocol):
    """What the display reads of a leg's progress (output.ProgressState)."""

    step: int | None
    total: int | None

    def rate(self) -> float | None: ...

    def eta_s(self) -> float | None: ...


class Console:
    """Serialises printing from the reader thread and the main thread; owns the TTY live line."""

    def __init__(self, out: TextIO = sys.stdout, is_tty: bool | None = None) -> None:
        self.out = out
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


def progress_text(name: str, state: Progress, elapsed_s: float) -> str:
    if state.step is None:
        return f"  progress {name}: no step line yet ({format_duration(elapsed_s)} elapsed)"
    text = f"  progress {name}: step {state.step}/{state.total}"
    if state.total:
        text += f" ({100 * state.step // state.total}%)"
    rate, eta = state.rate(), state.eta_s()
    text += f" {rate:.2g} step/s" if rate is not None else " -- step/s"
    text += f" ETA {format_duration(eta)}" if eta is not None else " ETA --"
    return text


class ProgressDisplay:
    """Shows a leg's progress: a live line on a TTY, else a plain line every `every_s` seconds."""

    def __init__(self, name: str, state: Progress, every_s: float | None, console: Console) -> None:
        """`every_s` None: the leg has no progress rule, nothing is shown."""
        self.name, self.state, self.every_s, self.console = name, state, every_s, console
        self._next_plain = every_s
        self._shown = ""

    def tick(self, elapsed_s: float) -> None:
        if self.every_s is None:
            return
        if self.console.is_tty:
            text = progress_text(self.name, self.state, elapsed_s)
            # A printed line wipes the live line; redraw it even when nothing changed.
            if text != self._shown or not self.console.showing_live:
                self._shown = text
                self.console.live(text.strip())
        elif self._next_plain is not None and elapsed_s >= self._next_plain:
            self.console.line(progress_text(self.name, self.state, elapsed_s))
            while self._next_plain <= elapsed_s:
                self._next_plain += self.every_s

    def close(self) -> None:
        if self.console.is_tty:
            self.console.end_live()
