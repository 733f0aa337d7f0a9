"""Running ONE command: its own session, streamed output, timeout escalation, signal rules, Ctrl-C.

The leg runs in a new session, and every kill goes to its process group AND to every process of
its tree seen while it ran (`ProcessTree`): torchrun starts its workers in sessions of their own,
so the group alone would leave them running. After the leader exits, everything left of the leg is
SIGKILLed, so nothing of it outlives the leg.

Output is read in chunks, not lines: per-line syscalls or per-line Python work would dominate a leg
that prints a million lines. A chunk is split at its last newline, decoded, scrubbed, appended to
the log (flushed once per chunk, so a crash keeps everything read so far) and handed to the callback
as one `Block` (engine/lines.py).
"""
from __future__ import annotations

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
from pathlib import Path
from typing import Any, TextIO

from engine.defaults import GRACE_S
from engine.lines import Block, LineMatcher

READ_CHUNK = 1 << 20
PIPE_SIZE = 1 << 20
# Below this many bytes per read, the reader naps BATCH_WAIT_S before reading again: at most that
# much latency per line, and PIPE_SIZE / BATCH_WAIT_S (500 MB/s) before a writer could ever block.
BATCH_MIN = 1 << 16
BATCH_WAIT_S = 0.002
# A line longer than this without a newline is cut into pieces rather than buffered without bound.
MAX_PENDING = 1 << 20
# Seconds to keep reading after the group is dead: a process that escaped the group (setsid) may
# hold the pipe open forever, and that must not hang the engine.
DRAIN_S = 5.0
POLL_S = 0.1
# Orphans are reaped by init, asynchronously; waiting this long for that keeps "nothing of the
# leg outlives it" observable when run_command returns.
GROUP_GONE_S = 5.0
# How often the leg's process tree is re-read from /proc (cheap: one listdir and a few reads).
TREE_REFRESH_S = 0.5


@dataclass(frozen=True)
class SignalRule:
    pattern: re.Pattern[str]
    signal: signal.Signals
    after_s: float = 0.0


@dataclass
class ProcessResult:
    rc: int | None
    seconds: float
    timed_out: bool = False
    terminated_by: str | None = None  # "timeout" | "signal_rule" | "interrupt" | None
    signals_sent: list[dict[str, Any]] = field(default_factory=list)
    lines: int = 0
    error: str | None = None  # the command could not be started at all

    def as_dict(self) -> dict[str, Any]:
        return {"rc": self.rc, "seconds": round(self.seconds, 3), "timed_out": self.timed_out,
                "terminated_by": self.terminated_by, "signals_sent": list(self.signals_sent),
                "lines": self.lines}


class Interrupted(KeyboardInterrupt):
    """Ctrl-C arrived while a command ran; the command's processes are gone and `result` records it."""

    def __init__(self, result: ProcessResult) -> None:
        super().__init__("interrupted")
        self.result = result


def parse_signal(name: str | int) -> signal.Signals:
    """`SIGKILL`, `KILL` or `9` -> signal.SIGKILL; ValueError naming the bad value otherwise."""
    if isinstance(name, int):
        return signal.Signals(name)
    text = str(name).strip().upper()
    if text.isdigit():
        return signal.Signals(int(text))
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
        try:
            pattern = re.compile(rule["match"])
        except re.error as exc:
            raise ValueError(f"signals[{i}].match {rule['match']!r}: {exc}") from None
        out.append(SignalRule(pattern, parse_signal(rule.get("signal", "SIGTERM")),
                              float(rule.get("after_s", 0) or 0)))
    return out


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


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, start time) for every process, from /proc (empty where there is none)."""
    table: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # comm may hold spaces and parentheses: the fields we need come after the LAST ')'.
        rest = stat[stat.rfind(b")") + 2:].split()
        try:
            table[int(name)] = (int(rest[1]), int(rest[19]))
        except (IndexError, ValueError):
            continue
    return table


class ProcessTree:
    """Every process a leg started, even those that left its process group.

    A process group is not enough: torchrun starts each worker with start_new_session, so a kill
    of the leader's group leaves the ranks training (and pushing checkpoints) after the leg "ended".
    So the tree under the leader is snapshotted while it runs, each pid with its start time (a pid
    reused by an unrelated process is never signalled), and every kill goes to the group AND to
    every process of the snapshot that is still the same process.
    """

    def __init__(self, leader: int) -> None:
        self.leader = leader
        self.known: dict[int, int] = {}

    def refresh(self) -> None:
        table = _proc_table()
        if self.leader in table:
            self.known.setdefault(self.leader, table[self.leader][1])
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        stack = [pid for pid in self.known if pid in table]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in self.known:
                    self.known[child] = table[child][1]
                    stack.append(child)

    def alive(self) -> list[int]:
        table = _proc_table()
        return [pid for pid, start in self.known.items()
                if pid in table and table[pid][1] == start and not _is_zombie(pid)]

    def signal(self, pgid: int, sig: int) -> None:
        self.refresh()
        kill_group(pgid, sig)
        for pid in self.alive():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] == b"Z"


class _Reader:
    """Reader thread: pipe -> lines -> log + signal rules + callback."""

    def __init__(self, fd: int, log: TextIO | None, scrub: Callable[[str], str] | None,
                 strip: re.Pattern[str] | None, on_block: Callable[[Block], None] | None,
                 rules: list[SignalRule], fire: Callable[[int, int], None]) -> None:
        self.fd, self.log, self.scrub, self.strip = fd, log, scrub, strip
        self.on_block, self.rules, self.fire = on_block, rules, fire
        self.matchers = [LineMatcher(rule.pattern) for rule in rules]
        self.pending = b""
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
                self._take(data)
                if len(data) < BATCH_MIN:
                    # A leg writing one line per syscall (PYTHONUNBUFFERED) would otherwise wake
                    # us per line; a short nap lets its lines pile up in the (enlarged) pipe.
                    time.sleep(BATCH_WAIT_S)
            self._finish()
        except Exception as exc:  # an I/O error must surface, not silently end the log
            self.error = exc

    def _take(self, data: bytes) -> None:
        buf = self.pending + data
        cut = buf.rfind(b"\n")
        if cut < 0:
            if len(buf) > MAX_PENDING:
                self._emit(buf + b"\n")
                buf = b""
            self.pending = buf
            return
        self.pending = buf[cut + 1:]
        self._emit(buf[:cut + 1])

    def _finish(self) -> None:
        if self.pending:
            self._emit(self.pending + b"\n")
            self.pending = b""
        if self.log is not None:
            self.log.flush()

    def _emit(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace")
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        if self.scrub is not None:
            text = self.scrub(text)
        if self.log is not None:
            self.log.write(text)
            self.log.flush()
        body = text[:-1]  # every emitted chunk ends with a newline
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


def run_command(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                cwd: str | os.PathLike[str] | None = None, timeout_s: float | None = None,
                grace_s: float = GRACE_S, log_path: str | os.PathLike[str] | None = None,
                on_block: Callable[[Block], None] | None = None,
                on_tick: Callable[[float], None] | None = None,
                signals: Sequence[SignalRule] = (), strip_prefix: re.Pattern[str] | None = None,
                scrub: Callable[[str], str] | None = None,
                notify: Callable[[str], None] | None = None,
                drain_s: float = DRAIN_S) -> ProcessResult:
    """Run `argv` to completion (or timeout / signal rule / Ctrl-C) and return what happened.

    `env` is merged over os.environ. `on_tick(elapsed_s)` is called from the calling thread about
    every POLL_S seconds (progress display); `notify(text)` hears about kills as they happen (a
    90 s grace period must not look like a hang). On KeyboardInterrupt the leg's processes are
    terminated like on a timeout and `Interrupted` (a KeyboardInterrupt carrying the result) is raised.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    log: TextIO | None = None
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "w", encoding="utf-8", newline="\n")
    start = time.monotonic()
    try:
        try:
            proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=full_env, cwd=cwd,
                                    start_new_session=True, bufsize=0)
        except OSError as exc:
            # Same convention as a shell: 127 not found, 126 not executable.
            rc = 127 if isinstance(exc, FileNotFoundError) else 126
            # exc.filename tells a missing program from a missing working directory.
            where = f"{exc.filename}: " if exc.filename else ""
            message = f"cannot start {argv[0]!r} (cwd {cwd or os.getcwd()}): {where}" \
                      f"{exc.strerror or exc}"
            if log is not None:
                log.write(message + "\n")
            return ProcessResult(rc=rc, seconds=time.monotonic() - start, error=message)
        return _supervise(proc, start, log, timeout_s, grace_s, on_block, on_tick,
                          list(signals), strip_prefix, scrub, notify or (lambda text: None),
                          drain_s)
    finally:
        if log is not None:
            log.close()


def _supervise(proc: subprocess.Popen[bytes], start: float, log: TextIO | None,
               timeout_s: float | None, grace_s: float,
               on_block: Callable[[Block], None] | None, on_tick: Callable[[float], None] | None,
               rules: list[SignalRule], strip: re.Pattern[str] | None,
               scrub: Callable[[str], str] | None, notify: Callable[[str], None],
               drain_s: float) -> ProcessResult:
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    tree = ProcessTree(proc.pid)
    tree.refresh()
    result = ProcessResult(rc=None, seconds=0.0)
    lock = threading.Lock()
    timers: list[threading.Timer] = []

    def send_rule(idx: int, lineno: int) -> None:
        rule = rules[idx]
        if proc.poll() is not None:
            return
        tree.signal(pgid, rule.signal)
        with lock:
            result.signals_sent.append({"signal": rule.signal.name, "line": lineno,
                                        "at_s": round(time.monotonic() - start, 3)})

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
    _enlarge_pipe(proc.stdout.fileno())
    reader = _Reader(proc.stdout.fileno(), log, scrub, strip, on_block, rules, fire)
    reader.thread.start()
    deadline = start + timeout_s if timeout_s else None
    interrupted = False
    next_refresh = start + TREE_REFRESH_S
    try:
        try:
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
                    notify(f"timeout after {timeout_s:g} s: SIGTERM to the process group, "
                           f"SIGKILL in {grace_s:g} s if it is still there")
                    _terminate(proc, tree, grace_s, notify)
                    break
        except KeyboardInterrupt:
            interrupted = True
            result.terminated_by = "interrupt"
            try:
                notify(f"interrupted: SIGTERM to the process group, SIGKILL in {grace_s:g} s "
                       f"(Ctrl-C again to kill it now)")
                _terminate(proc, tree, grace_s, notify)
            except KeyboardInterrupt:
                # A second Ctrl-C while waiting out the grace period: no more patience.
                tree.signal(pgid, signal.SIGKILL)
                proc.wait()
    finally:
        for timer in timers:
            timer.cancel()
        # The leader is gone; whatever it left behind, in its group or not, goes with it.
        tree.signal(pgid, signal.SIGKILL)
        if proc.returncode is None:
            proc.wait()
        _await_gone(pgid, tree, GROUP_GONE_S)
        reader.thread.join(drain_s)
        reader.stop.set()
        reader.thread.join()
        proc.stdout.close()
    result.rc = proc.returncode
    result.seconds = time.monotonic() - start
    result.lines = reader.lines
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


def _await_gone(pgid: int, tree: ProcessTree, timeout_s: float) -> bool:
    """Wait until what was killed above is reaped (by init, not us), so that on return nothing of
    the leg is left; True when it is gone."""
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) or tree.alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def _terminate(proc: subprocess.Popen[bytes], tree: ProcessTree, grace_s: float,
               notify: Callable[[str], None]) -> None:
    """SIGTERM the leg's processes, wait `grace_s` for the leader, then SIGKILL them all."""
    pgid = tree.leader
    tree.signal(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=max(grace_s, 0.0))
    except subprocess.TimeoutExpired:
        notify(f"still running {grace_s:g} s after SIGTERM: SIGKILL to the process group")
        tree.signal(pgid, signal.SIGKILL)
        proc.wait()
