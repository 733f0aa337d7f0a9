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
that prints a million lines. A chunk is decoded, split at its last newline, written through the leg
log it is given (engine/run/record.py `LegLog`: masked there, flushed once per chunk, so a crash
keeps everything read so far) and handed to the callback as one `Block` (engine/run/lines.py), as
the log kept it. A line over `limits.LINE_MAX_CHARS` keeps its head (a secret cut in two there is
redacted whole) and loses the rest; the log keeps its head and its tail.
"""

from __future__ import annotations

import codecs
import fcntl
import os
import re
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine import limits
from engine.defaults import GRACE_S
from engine.run import subreaper
from engine.run.lines import Block, LineMatcher, Pattern
from engine.run.proctree import GROUP_GONE_S, ProcessTree, await_gone
from engine.run.reaper import Reaper, ReaperUnavailable
from engine.run.record import LegLog
from engine.secrets import Mask

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
# The hold protocol (docs/running.md): the engine names the points to hold a leg at in HOLD_ENV
# (comma-separated); a leg that supports it prints `SPECPROBE_HOLD <point> pid=<pid>` at such a point,
# flushes, and stops itself (SIGSTOP).
HOLD_ENV = "SPECPROBE_HOLD_AT"
HOLD_LINE = "SPECPROBE_HOLD"


@dataclass(frozen=True)
class SignalRule:
    pattern: Pattern
    signal: signal.Signals
    after_s: float = 0.0
    hold: bool = False  # hold the leg's process tree at the line, then signal it there


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


def hold_line_pattern(point: str) -> str:
    """The regex of the line a leg prints when it stops itself at `point` (the hold protocol)."""
    return f"^{HOLD_LINE} {re.escape(point)}(?: |$)"


def hold_points(rules: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """The points a leg's signal rules hold it at (`hold_at`), for its SPECPROBE_HOLD_AT."""
    return [str(r["hold_at"]) for r in rules or () if isinstance(r, Mapping) and r.get("hold_at")]


def compile_signal_rules(rules: Sequence[Mapping[str, Any]] | None) -> list[SignalRule]:
    """The spec's `signals:` list -> SignalRule objects (regexes compiled, signal names resolved; a
    `hold_at` point as the regex of its protocol line, held)."""
    out = []
    for i, rule in enumerate(rules or ()):
        if rule.get("hold_at"):
            pattern = Pattern(hold_line_pattern(str(rule["hold_at"])), f"signals[{i}].hold_at")
            out.append(
                SignalRule(
                    pattern, parse_signal(rule.get("signal", "SIGTERM")), float(rule.get("after_s", 0) or 0), True
                )
            )
            continue
        pattern = Pattern(rule["match"], f"signals[{i}].match")
        out.append(
            SignalRule(
                pattern,
                parse_signal(rule.get("signal", "SIGTERM")),
                float(rule.get("after_s", 0) or 0),
                bool(rule.get("hold", False)),
            )
        )
    return out


class _Reader:
    """Reader thread: pipe -> lines -> the leg log (masked there) -> signal rules + callback."""

    def __init__(
        self,
        fd: int,
        log: LegLog,
        strip: Pattern | None,
        on_block: Callable[[Block], None] | None,
        rules: list[SignalRule],
        fire: Callable[[int, int, str], None],
    ) -> None:
        self.fd, self.log, self.strip = fd, log, strip
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
        self._deliver(self.log.lines(text))

    def _emit_cut(self, line: str) -> None:
        self._deliver(self.log.cut(line[: limits.LINE_MAX_CHARS]))

    def _deliver(self, text: str) -> None:
        """`text`: whole lines as the leg log kept them (masked), each ending in a newline."""
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
                self.fire(idx, hit[0], hit[1])


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
    log: LegLog | None = None,
    log_path: str | os.PathLike[str] | None = None,
    scrub: Mask | None = None,
    log_limits: tuple[int, int] = (limits.LOG_HEAD_BYTES, limits.LOG_TAIL_BYTES),
    on_block: Callable[[Block], None] | None = None,
    on_tick: Callable[[float], None] | None = None,
    signals: Sequence[SignalRule] = (),
    strip_prefix: Pattern | None = None,
    notify: Callable[[str], None] | None = None,
    drain_s: float = DRAIN_S,
) -> ProcessResult:
    """Run `argv` to completion (or timeout / signal rule / Ctrl-C) and return what happened.

    `env` is merged over os.environ. The output streams into `log`, the leg log a run's record
    opened (engine/run/record.py: masked there, before anyone sees a line); without one, into a
    log at `log_path` (None: none kept), masked by `scrub`, of at most `log_limits` (head, tail)
    bytes. The log is closed when the leg is over. `on_tick(elapsed_s)` is called from the calling
    thread about every POLL_S seconds (progress display); `notify(text)` hears about kills as they
    happen (a 90 s grace period must not look like a hang). On KeyboardInterrupt the leg's
    processes are terminated like on a timeout and `Interrupted` (a KeyboardInterrupt carrying the
    result) is raised. When the log cannot be written (a full disk), the leg is stopped the same
    way and `RecordError` (carrying the result) is raised.
    """
    argv = [str(a) for a in argv]
    full_env = dict(os.environ)
    full_env.update(env or {})
    start = time.monotonic()
    if log is None:
        log = LegLog(log_path, scrub, log_limits)
    try:
        started = _start(argv, full_env, cwd, start, log)
        if isinstance(started, ProcessResult):
            result = started
        else:
            proc, group, marker = started
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
                notify or (lambda text: None),
                drain_s,
            )
    finally:
        log.close()
    failure = log.failure(result)
    if failure is not None:
        raise failure
    return result


def _start(
    argv: list[str], env: dict[str, str], cwd: str | os.PathLike[str] | None, start: float, log: LegLog
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


def _not_started(rc: int, message: str, start: float, log: LegLog) -> ProcessResult:
    log.lines(message + "\n")
    return ProcessResult(rc=rc, seconds=time.monotonic() - start, error=message)


def _supervise(
    proc: subprocess.Popen[bytes],
    group: int,
    marker: tuple[str, str],
    start: float,
    log: LegLog,
    timeout_s: float | None,
    grace_s: float,
    on_block: Callable[[Block], None] | None,
    on_tick: Callable[[float], None] | None,
    rules: list[SignalRule],
    strip: Pattern | None,
    notify: Callable[[str], None],
    drain_s: float,
) -> ProcessResult:
    watch = _Watch(proc, group, marker, start, rules, grace_s, notify)
    assert proc.stdout is not None
    reader = _Reader(proc.stdout.fileno(), log, strip, on_block, rules, watch.fire)
    interrupted = False
    try:
        try:
            # Set up inside the try: a Ctrl-C or SIGTERM that lands while the watch is being set up
            # still ends the leg before the engine answers, as one during the leg does.
            watch.begin(reader)
            watch.wait(log, timeout_s, on_tick)
        except KeyboardInterrupt:
            interrupted = True
            watch.interrupt()
    finally:
        watch.end(reader, drain_s)
    result = watch.result
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


class _Watch:
    """One started leg under watch: its process tree, its signal rules' timers, and the result so far."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        group: int,
        marker: tuple[str, str],
        start: float,
        rules: list[SignalRule],
        grace_s: float,
        notify: Callable[[str], None],
    ) -> None:
        self.proc, self.start, self.rules = proc, start, rules
        self.pgid = group  # the leader's session of its own: its pid is the group id
        self.grace_s, self.notify = grace_s, notify
        # Under a supervisor, the tree is the supervisor's (it adopts every orphan) and the supervisor
        # itself is never signalled: it takes the rest down when the leader is gone.
        self.tree = ProcessTree(proc.pid, marker, group=group, exempt=() if group == proc.pid else (proc.pid,))
        self.result = ProcessResult(rc=None, seconds=0.0)
        self.lock = threading.Lock()
        self.timers: list[threading.Timer] = []

    def begin(self, reader: _Reader) -> None:
        """The first look at the leg's processes, and its output read from now on."""
        self.tree.refresh()
        assert self.proc.stdout is not None
        _enlarge_pipe(self.proc.stdout.fileno())
        reader.thread.start()

    def fire(self, idx: int, lineno: int, text: str) -> None:
        """A signal rule matched line `lineno` (the reader's thread): hold the leg there if the rule
        says so, then signal now, or after its delay."""
        rule = self.rules[idx]
        held = None
        if rule.hold and self.proc.poll() is None:
            held = {"at_s": round(time.monotonic() - self.start, 3), **self.tree.hold(self.pgid), "text": text}
        if rule.after_s <= 0:
            self._send_rule(idx, lineno, held)
            return
        timer = threading.Timer(rule.after_s, self._send_rule, (idx, lineno, held))
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

    def _send_rule(self, idx: int, lineno: int, held: dict[str, Any] | None = None) -> None:
        rule = self.rules[idx]
        if self.proc.poll() is not None:
            return
        self.tree.signal(self.pgid, rule.signal)
        if held is not None and rule.signal != signal.SIGKILL:
            self.tree.release(self.pgid)  # a stopped process takes no other signal until it runs
        sent: dict[str, Any] = {
            "signal": rule.signal.name,
            "line": lineno,
            "at_s": round(time.monotonic() - self.start, 3),
        }
        if held is not None:
            sent["held"] = held
        with self.lock:
            self.result.signals_sent.append(sent)

    def wait(self, log: LegLog, timeout_s: float | None, on_tick: Callable[[float], None] | None) -> None:
        """Until the leader exits, or the leg is stopped: its timeout passed, or its log failed."""
        deadline = self.start + timeout_s if timeout_s else None
        next_refresh = self.start + TREE_REFRESH_S
        while True:
            try:
                self.proc.wait(timeout=POLL_S)
                return
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now >= next_refresh:
                self.tree.refresh()
                next_refresh = now + TREE_REFRESH_S
            if on_tick is not None:
                on_tick(now - self.start)
            if deadline is not None and now >= deadline:
                self.result.timed_out = True
                self._stop("timeout", f"timeout after {timeout_s:g} s")
                return
            failure = log.failure()
            if failure is not None:
                # Its output can no longer be kept: the run stops, its verdict is ERROR.
                self._stop("record_error", f"{failure}: stopping the leg")
                return

    def _stop(self, why: str, what: str) -> None:
        self.result.terminated_by = why
        self.notify(f"{what}: SIGTERM to the process group, SIGKILL in {self.grace_s:g} s if it is still there")
        _terminate(self.proc, self.tree, self.grace_s, self.notify)

    def interrupt(self) -> None:
        """Ctrl-C (or SIGTERM to the engine): end the leg as a timeout would, a second one kills it now."""
        self.result.terminated_by = "interrupt"
        try:
            self.notify(
                f"interrupted: SIGTERM to the process group, SIGKILL in {self.grace_s:g} s "
                "(Ctrl-C again to kill it now)"
            )
            _terminate(self.proc, self.tree, self.grace_s, self.notify)
        except KeyboardInterrupt:
            # A second Ctrl-C while waiting out the grace period: no more patience.
            self.tree.signal(self.pgid, signal.SIGKILL)
            self.proc.wait()

    def end(self, reader: _Reader, drain_s: float) -> None:
        """However the watch ended: every process of the leg killed and reaped, the reader drained; what
        outlived that is a problem the result says."""
        for timer in self.timers:
            timer.cancel()
        # The leader is gone; whatever it left behind, in its group, its tree or carrying its
        # marker, goes with it.
        self.tree.kill_all(self.pgid)
        if self.proc.returncode is None:
            self.proc.wait()
        subreaper.finished(self.proc)
        if not await_gone(self.pgid, self.tree, GROUP_GONE_S):
            left = sorted(p.pid for p in self.tree.alive())
            self.result.problems.append(
                f"processes of the leg were still there {GROUP_GONE_S:g} s after SIGKILL "
                f"(group {self.pgid}{f', pids {left}' if left else ''}): they may outlive the run"
            )
        if reader.thread.ident is not None:
            reader.thread.join(drain_s)
        reader.stop.set()
        if reader.thread.ident is not None:
            reader.thread.join(READER_JOIN_S)
        if reader.thread.is_alive():
            self.result.problems.append(
                f"the output reader was still busy {drain_s + READER_JOIN_S:g} s "
                f"after the leg ended; the log and the harvest may be incomplete"
            )
        else:
            self.proc.stdout.close()


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
