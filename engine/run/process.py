"""Running ONE command: its own session, streamed output, timeout escalation, signal rules, Ctrl-C.

The leg runs in a new session and carries the engine's marker (engine/run/reaper.py), an environment
variable every process it starts inherits. On Linux it runs under its supervisor, a child subreaper
(engine/run/subreaper.py) that adopts every orphan of the leg, even one that cleared its
environment. Every kill goes to its process group, to every process of its tree seen while it ran
(`ProcessTree`, the supervisor's tree, the supervisor itself spared), and to every process carrying
its marker: torchrun starts its workers in sessions of their own and a daemon double-forks out of
the tree, so neither the group nor the tree alone is enough. After the leader exits, everything
left of the leg is SIGKILLed, so nothing of it outlives the leg; if the engine itself dies, the
supervisor and the reaper do the same.

Output is read in chunks, not lines: per-line syscalls or per-line Python work would dominate a leg
that prints a million lines. A chunk is decoded, split at its last newline, scrubbed, appended to
the log (flushed once per chunk, so a crash keeps everything read so far) and handed to the callback
as one `Block` (engine/run/lines.py). A line over `limits.LINE_MAX_CHARS` keeps its head (a secret cut
in two there is redacted whole) and loses the rest; the log keeps its head and its tail.
"""

from __future__ import annotations

import codecs
import fcntl
import hashlib
import os
import select
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from engine import limits
from engine.defaults import GRACE_S
from engine.run import subreaper
from engine.run.evidence import RecordError
from engine.run.lines import Block, LineMatcher, Pattern
from engine.run.proctree import GROUP_GONE_S, ProcessTree, await_gone
from engine.run.reaper import Reaper, ReaperUnavailable

# A read is at most one line's limit, so a line wholly inside one read is never over it.
READ_CHUNK = min(1 << 20, limits.LINE_MAX_CHARS)
PIPE_SIZE = 1 << 20
# Below this many bytes per read, the reader naps BATCH_WAIT_S before reading again: at most that
# much latency per line, and PIPE_SIZE / BATCH_WAIT_S (500 MB/s) before a writer could ever block.
BATCH_MIN = 1 << 16
BATCH_WAIT_S = 0.002
# Seconds to keep reading after the leg is dead: a process that escaped every kill (it cleared its
# environment and left the tree unseen) may hold the pipe open forever, and that must not hang us.
DRAIN_S = 5.0
# The reader is told to stop after the drain; a reader still busy this much later (a rule's regex
# giving up line after line) is abandoned, and the step fails saying so.
READER_JOIN_S = 10.0
POLL_S = 0.1
# How often the leg's process tree is re-read (one pass over the process table).
TREE_REFRESH_S = 1.0
LOG_TAIL_SEGMENTS = 4


@dataclass(frozen=True)
class SignalRule:
    pattern: Pattern
    signal: signal.Signals
    after_s: float = 0.0


@dataclass
class ProcessResult:
    rc: int | None
    seconds: float
    timed_out: bool = False
    terminated_by: str | None = None  # "timeout" | "signal_rule" | "interrupt" | "record_error" | None
    signals_sent: list[dict[str, Any]] = field(default_factory=list)
    lines: int = 0
    error: str | None = None  # the command could not be started at all
    # What went wrong while it ran without stopping it: a signal rule's regex gave up, the output
    # reader could not finish. The step fails with these.
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rc": self.rc,
            "seconds": round(self.seconds, 3),
            "timed_out": self.timed_out,
            "terminated_by": self.terminated_by,
            "signals_sent": list(self.signals_sent),
            "lines": self.lines,
        }


class Interrupted(KeyboardInterrupt):
    """Ctrl-C arrived while a command ran; the command's processes are gone and `result` records it."""

    def __init__(self, result: ProcessResult) -> None:
        super().__init__("interrupted")
        self.result = result


def parse_signal(name: str | int) -> signal.Signals:
    """`SIGKILL`, `KILL` or `9` -> signal.SIGKILL; ValueError naming the bad value otherwise."""
    try:
        if isinstance(name, int):
            return signal.Signals(name)
        text = str(name).strip().upper()
        if text.isdigit():
            return signal.Signals(int(text))
    except ValueError:
        raise ValueError(f"unknown signal {name!r}") from None
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return signal.Signals[text]
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


def compile_signal_rules(rules: Sequence[Mapping[str, Any]] | None) -> list[SignalRule]:
    """The spec's `signals:` list -> SignalRule objects (regexes compiled, signal names resolved)."""
    out = []
    for i, rule in enumerate(rules or ()):
        pattern = Pattern(rule["match"], f"signals[{i}].match")
        out.append(SignalRule(pattern, parse_signal(rule.get("signal", "SIGTERM")), float(rule.get("after_s", 0) or 0)))
    return out


def _new_file(path: Path) -> BinaryIO:
    """A new, empty file at `path`, created, never opened through what is there: an earlier leg
    may have left a symlink at a later step's log name, which `open(path, "wb")` would follow
    and truncate."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o666), "wb")


class CappedLog:
    """A leg's raw log on disk, bounded: its first `head` bytes, then, once those are written, its
    most recent output in rotating segment files beside it (`<log>.tail-NNNN`, at most `tail`
    bytes together), appended to the log with a marker line saying what was dropped when the log
    is closed. A killed engine leaves the head and the segments, each complete up to its last read."""

    def __init__(
        self, path: str | os.PathLike[str], head: int = limits.LOG_HEAD_BYTES, tail: int = limits.LOG_TAIL_BYTES
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh: BinaryIO = _new_file(self.path)
        self.head, self.tail = head, tail
        self.segment_max = max(tail // LOG_TAIL_SEGMENTS, 1)
        self.size = 0
        self.segments: deque[list[Any]] = deque()  # [path, file, bytes, lines]
        self.serial = 0
        self.dropped_bytes = self.dropped_lines = 0
        self.error: OSError | None = None  # the first write that failed (a full disk): nothing after it
        # The SHA-256 of the file as closed, handed to `on_close`: the run-dir scrubber then need
        # not search what the engine wrote through the secret filter, while it still holds that.
        self.digest, self.on_close = hashlib.sha256(), None

    def _put(self, data: bytes) -> None:
        self.fh.write(data)
        if self.on_close is not None:  # set before the leg's first line, or never
            self.digest.update(data)

    def write(self, data: bytes) -> None:
        """Append whole lines."""
        if not self.segments:
            if self.size + len(data) <= self.head:
                self._put(data)
                self.fh.flush()
                self.size += len(data)
                return
            cut = data.rfind(b"\n", 0, self.head - self.size) + 1  # whole lines only
            self._put(data[:cut])
            self.fh.flush()
            self.size += cut
            data = data[cut:]
            self._new_segment()
        while data:
            # At most one segment's worth, in whole lines (a longer line goes alone).
            piece = data[: self.segment_max]
            if len(piece) < len(data):
                end = piece.rfind(b"\n") + 1 or data.find(b"\n", len(piece)) + 1 or len(data)
                piece = data[:end]
            data = data[len(piece) :]
            segment = self.segments[-1]
            if segment[2] and segment[2] + len(piece) > self.segment_max:
                segment = self._new_segment()
            segment[1].write(piece)
            segment[2] += len(piece)
            segment[3] += piece.count(b"\n")
        self.segments[-1][1].flush()

    def _new_segment(self) -> list[Any]:
        if len(self.segments) == LOG_TAIL_SEGMENTS:
            path, fh, size, lines = self.segments.popleft()
            fh.close()
            path.unlink(missing_ok=True)
            self.dropped_bytes += size
            self.dropped_lines += lines
        self.serial += 1
        path = self.path.with_name(f"{self.path.name}.tail-{self.serial:04d}")
        self.segments.append([path, _new_file(path), 0, 0])
        return self.segments[-1]

    def close(self) -> None:
        """Append the tail to the head and close; a write that fails is kept in `error` (the
        segments then stay beside the log, each complete up to its last write)."""
        try:
            self._close()
        except OSError as exc:
            self.error = self.error or exc
            for fh in [self.fh] + [segment[1] for segment in self.segments]:
                try:
                    fh.close()
                except OSError:
                    pass

    def _close(self) -> None:
        if self.dropped_bytes:
            self._put(
                f"[specprobe: {self.dropped_lines:,} lines ({self.dropped_bytes:,} bytes) of this "
                f"log dropped here; a log keeps its first {self.head:,} bytes and its last "
                f"{self.tail:,} at most]\n".encode()
            )
        for path, fh, _, _ in self.segments:
            fh.close()
            with open(path, "rb") as src:
                while chunk := src.read(1 << 20):
                    self._put(chunk)
            path.unlink(missing_ok=True)
        self.segments.clear()
        self.fh.close()
        if self.on_close is not None:
            self.on_close(self.path, self.digest.digest())

    def write_text(self, text: str) -> None:
        """Append whole lines; after a write that failed (a full disk, a file-size limit) the log
        takes nothing more, and `error` says why."""
        if self.error is not None:
            return
        try:
            self.write(text.encode("utf-8", errors="replace"))
        except OSError as exc:
            self.error = exc


class _Reader:
    """Reader thread: pipe -> lines -> log + signal rules + callback."""

    def __init__(
        self,
        fd: int,
        log: CappedLog | None,
        scrub: Any,
        strip: Pattern | None,
        on_block: Callable[[Block], None] | None,
        rules: list[SignalRule],
        fire: Callable[[int, int], None],
    ) -> None:
        self.fd, self.log, self.strip = fd, log, strip
        self.scrub: Callable[[str], str] | None = getattr(scrub, "scrub", scrub)
        # A cut line may end in the first part of a secret; only a Scrubber can tell.
        self.scrub_cut: Callable[[str], str] | None = getattr(scrub, "scrub_cut", self.scrub)
        self.on_block, self.rules, self.fire = on_block, rules, fire
        self.matchers = [LineMatcher(rule.pattern) for rule in rules]
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""
        self.cutting = False  # dropping the rest of a line that was over the limit
        self.lines = 0
        self.fired: set[int] = set()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="specprobe-reader", daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                ready, _, _ = select.select([self.fd], [], [], POLL_S)
                if not ready:
                    continue
                data = os.read(self.fd, READ_CHUNK)
                if not data:
                    break
                self._take(self.decoder.decode(data))
                if len(data) < BATCH_MIN:
                    # A leg writing one line per syscall (PYTHONUNBUFFERED) would otherwise wake
                    # us per line; a short nap lets its lines pile up in the (enlarged) pipe.
                    time.sleep(BATCH_WAIT_S)
            self._take(self.decoder.decode(b"", final=True))
            self._finish()
        except Exception as exc:  # an I/O error must surface, not silently end the log
            self.error = exc

    def _take(self, text: str) -> None:
        if not text:
            return
        if self.cutting:
            nl = text.find("\n")
            if nl < 0:
                return
            self.cutting = False
            text = text[nl + 1 :]
        buf = self.pending + text if self.pending else text
        cut = buf.rfind("\n")
        if cut < 0:
            self.pending = buf
        else:
            self.pending = buf[cut + 1 :]
            body = buf[: cut + 1]
            # Only the first line can be over the limit: it is the one that began in `pending`.
            first = body.find("\n")
            if first > limits.LINE_MAX_CHARS:
                self._emit_cut(body[:first])
                body = body[first + 1 :]
            if body:
                self._emit(body)
        if len(self.pending) > limits.LINE_MAX_CHARS:
            self._emit_cut(self.pending)
            self.pending, self.cutting = "", True

    def _finish(self) -> None:
        if self.pending:
            self._emit(self.pending + "\n")
            self.pending = ""

    def _emit(self, text: str) -> None:
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        if self.scrub is not None:
            text = self.scrub(text)
        self._deliver(text)

    def _emit_cut(self, line: str) -> None:
        head = line[: limits.LINE_MAX_CHARS]
        if self.scrub_cut is not None:
            head = self.scrub_cut(head)
        self._deliver(head.replace("\n", " ") + limits.CUT_MARKER + "\n")

    def _deliver(self, text: str) -> None:
        """`text`: whole, scrubbed lines, each ending in a newline."""
        if self.log is not None:
            self.log.write_text(text)
        body = text[:-1]
        block = Block(body, body.count("\n") + 1, self.lines + 1, self.strip)
        self.lines += block.count
        if self.rules:
            self._match_rules(block)
        if self.on_block is not None:
            try:
                self.on_block(block)
            except Exception as exc:
                # Keep draining into the log (a full pipe would stall the leg) and report the
                # bug when the command is over.
                self.error, self.on_block = exc, None

    def _match_rules(self, block: Block) -> None:
        for idx, matcher in enumerate(self.matchers):
            if idx in self.fired:
                continue
            hit = matcher.first(block)
            if hit is not None:
                self.fired.add(idx)
                self.fire(idx, hit[0])


def launch_problem(argv: Sequence[str], env: Mapping[str, str], cwd: str | os.PathLike[str] | None) -> str | None:
    """Why the OS would refuse to start this command (a NUL byte, an `=` in a variable's name),
    said before trying: a secret's text is never part of the answer."""
    if not argv:
        return "the command is empty"
    for i, arg in enumerate(argv):
        if "\0" in arg:
            return f"argv[{i}] contains a NUL byte"
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            return f"environment variable name {name!r} is not valid (empty, or holding '=' or NUL)"
        if "\0" in value:
            return f"environment variable {name} contains a NUL byte"
    if cwd is not None and "\0" in os.fspath(cwd):
        return "the working directory contains a NUL byte"
    return None


def run_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout_s: float | None = None,
    grace_s: float = GRACE_S,
    log_path: str | os.PathLike[str] | None = None,
    on_block: Callable[[Block], None] | None = None,
    on_tick: Callable[[float], None] | None = None,
    signals: Sequence[SignalRule] = (),
    strip_prefix: Pattern | None = None,
    scrub: Any = None,
    notify: Callable[[str], None] | None = None,
    drain_s: float = DRAIN_S,
    log_limits: tuple[int, int] = (limits.LOG_HEAD_BYTES, limits.LOG_TAIL_BYTES),
    log_written: Callable[[Path, bytes], None] | None = None,
) -> ProcessResult:
    """Run `argv` to completion (or timeout / signal rule / Ctrl-C) and return what happened.

    `env` is merged over os.environ. `scrub` is a Scrubber (engine/secrets.py) or any str -> str
    function applied to every line before it is logged or seen. `on_tick(elapsed_s)` is called from
    the calling thread about every POLL_S seconds (progress display); `notify(text)` hears about
    kills as they happen (a 90 s grace period must not look like a hang). `log_limits` is the
    log's (head, tail) in bytes; `log_written(path, sha256)` hears of the log once it is closed
    after the leg ran, whole. On KeyboardInterrupt the leg's processes are terminated like on a
    timeout and `Interrupted` (a KeyboardInterrupt carrying the result) is raised. When the log
    cannot be written (a full disk), the leg is stopped the same way and `RecordError` (carrying
    the result) is raised.
    """
    argv = [str(a) for a in argv]
    full_env = dict(os.environ)
    full_env.update(env or {})
    start = time.monotonic()
    log: CappedLog | None = None
    if log_path is not None:
        try:
            log = CappedLog(log_path, *log_limits)
        except OSError as exc:
            raise RecordError(log_path, exc) from None
    try:
        started = _start(argv, full_env, cwd, start, log)
        if isinstance(started, ProcessResult):
            result = started
        else:
            proc, group, marker = started
            if log is not None:
                log.on_close = log_written
            result = _supervise(
                proc,
                group,
                marker,
                start,
                log,
                timeout_s,
                grace_s,
                on_block,
                on_tick,
                list(signals),
                strip_prefix,
                scrub,
                notify or (lambda text: None),
                drain_s,
            )
    finally:
        if log is not None:
            log.close()
    if log is not None and log.error is not None:
        raise RecordError(log.path, log.error, result)
    return result


def _start(
    argv: list[str], env: dict[str, str], cwd: str | os.PathLike[str] | None, start: float, log: CappedLog | None
) -> ProcessResult | tuple[subprocess.Popen[bytes], int, tuple[str, str]]:
    """The leg started under the reaper's guard: (Popen, leader's group, marker); or, when it
    could not start, the result that says why (also written to the log)."""
    problem = launch_problem(argv, env, cwd)
    if problem is not None:
        message = f"cannot start {argv[0][:200]!r}: {problem}" if argv else f"cannot start: {problem}"
        return _not_started(126, message, start, log)
    try:
        reaper = Reaper.get()
    except (ReaperUnavailable, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        return _not_started(
            126, f"refusing to start the leg without the reaper that guards its processes: {why}", start, log
        )
    marker = reaper.marker()
    try:
        proc, group = subreaper.spawn(argv, env, cwd, marker)
    except (OSError, ValueError) as exc:
        # Same convention as a shell: 127 not found, 126 not executable.
        rc = 127 if isinstance(exc, FileNotFoundError) else 126
        # exc.filename tells a missing program from a missing working directory.
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        why = getattr(exc, "strerror", None) or exc
        return _not_started(rc, f"cannot start {argv[0]!r} (cwd {cwd or os.getcwd()}): {where}{why}", start, log)
    return proc, group, marker


def _not_started(rc: int, message: str, start: float, log: CappedLog | None) -> ProcessResult:
    if log is not None:
        log.write_text(message + "\n")
    return ProcessResult(rc=rc, seconds=time.monotonic() - start, error=message)


def _supervise(
    proc: subprocess.Popen[bytes],
    group: int,
    marker: tuple[str, str],
    start: float,
    log: CappedLog | None,
    timeout_s: float | None,
    grace_s: float,
    on_block: Callable[[Block], None] | None,
    on_tick: Callable[[float], None] | None,
    rules: list[SignalRule],
    strip: Pattern | None,
    scrub: Any,
    notify: Callable[[str], None],
    drain_s: float,
) -> ProcessResult:
    pgid = group  # the leader's session of its own: its pid is the group id
    # Under a supervisor, the tree is the supervisor's (it adopts every orphan) and the supervisor
    # itself is never signalled: it takes the rest down when the leader is gone.
    tree = ProcessTree(proc.pid, marker, group=group, exempt=() if group == proc.pid else (proc.pid,))
    result = ProcessResult(rc=None, seconds=0.0)
    lock = threading.Lock()
    timers: list[threading.Timer] = []

    def send_rule(idx: int, lineno: int) -> None:
        rule = rules[idx]
        if proc.poll() is not None:
            return
        tree.signal(pgid, rule.signal)
        with lock:
            result.signals_sent.append(
                {"signal": rule.signal.name, "line": lineno, "at_s": round(time.monotonic() - start, 3)}
            )

    def fire(idx: int, lineno: int) -> None:
        delay = rules[idx].after_s
        if delay <= 0:
            send_rule(idx, lineno)
            return
        timer = threading.Timer(delay, send_rule, (idx, lineno))
        timer.daemon = True
        timers.append(timer)
        timer.start()

    assert proc.stdout is not None
    reader = _Reader(proc.stdout.fileno(), log, scrub, strip, on_block, rules, fire)
    deadline = start + timeout_s if timeout_s else None
    interrupted = False
    next_refresh = start + TREE_REFRESH_S
    try:
        try:
            # Set up inside the try: a Ctrl-C or SIGTERM that lands while the watch is being set up
            # still ends the leg before the engine answers, as one during the leg does.
            tree.refresh()
            _enlarge_pipe(proc.stdout.fileno())
            reader.thread.start()
            while True:
                try:
                    proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if now >= next_refresh:
                    tree.refresh()
                    next_refresh = now + TREE_REFRESH_S
                if on_tick is not None:
                    on_tick(now - start)
                if deadline is not None and now >= deadline:
                    result.timed_out, result.terminated_by = True, "timeout"
                    notify(
                        f"timeout after {timeout_s:g} s: SIGTERM to the process group, "
                        f"SIGKILL in {grace_s:g} s if it is still there"
                    )
                    _terminate(proc, tree, grace_s, notify)
                    break
                if log is not None and log.error is not None:
                    # Its output can no longer be kept: the run stops, its verdict is ERROR.
                    result.terminated_by = "record_error"
                    notify(
                        f"{RecordError(log.path, log.error)}: stopping the leg: SIGTERM to the process "
                        f"group, SIGKILL in {grace_s:g} s if it is still there"
                    )
                    _terminate(proc, tree, grace_s, notify)
                    break
        except KeyboardInterrupt:
            interrupted = True
            result.terminated_by = "interrupt"
            try:
                notify(
                    f"interrupted: SIGTERM to the process group, SIGKILL in {grace_s:g} s (Ctrl-C again to kill it now)"
                )
                _terminate(proc, tree, grace_s, notify)
            except KeyboardInterrupt:
                # A second Ctrl-C while waiting out the grace period: no more patience.
                tree.signal(pgid, signal.SIGKILL)
                proc.wait()
    finally:
        for timer in timers:
            timer.cancel()
        # The leader is gone; whatever it left behind, in its group, its tree or carrying its
        # marker, goes with it.
        tree.kill_all(pgid)
        if proc.returncode is None:
            proc.wait()
        subreaper.finished(proc)
        if not await_gone(pgid, tree, GROUP_GONE_S):
            left = sorted(p.pid for p in tree.alive())
            result.problems.append(
                f"processes of the leg were still there {GROUP_GONE_S:g} s after SIGKILL "
                f"(group {pgid}{f', pids {left}' if left else ''}): they may outlive the run"
            )
        if reader.thread.ident is not None:
            reader.thread.join(drain_s)
        reader.stop.set()
        if reader.thread.ident is not None:
            reader.thread.join(READER_JOIN_S)
        if reader.thread.is_alive():
            result.problems.append(
                f"the output reader was still busy {drain_s + READER_JOIN_S:g} s "
                f"after the leg ended; the log and the harvest may be incomplete"
            )
        else:
            proc.stdout.close()
    result.rc = proc.returncode
    result.seconds = time.monotonic() - start
    result.lines = reader.lines
    result.problems += [rule.pattern.error for rule in rules if rule.pattern.error]
    if result.terminated_by is None and result.signals_sent and result.rc != 0:
        result.terminated_by = "signal_rule"
    if reader.error is not None:
        raise reader.error
    if interrupted:
        raise Interrupted(result)
    return result


def _enlarge_pipe(fd: int) -> None:
    """Best effort (Linux): a bigger pipe lets the reader batch without ever blocking the leg."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setsize is None:
        return
    for size in (PIPE_SIZE, 1 << 18):
        try:
            fcntl.fcntl(fd, setsize, size)
            return
        except OSError:
            continue


def _terminate(proc: subprocess.Popen[bytes], tree: ProcessTree, grace_s: float, notify: Callable[[str], None]) -> None:
    """SIGTERM the leg's processes, wait `grace_s` for the leader, then SIGKILL them all."""
    pgid = tree.group
    tree.signal(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=max(grace_s, 0.0))
    except subprocess.TimeoutExpired:
        notify(f"still running {grace_s:g} s after SIGTERM: SIGKILL to the process group")
        tree.signal(pgid, signal.SIGKILL)
        proc.wait()
