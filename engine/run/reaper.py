"""The reaper: a small process that outlives the engine, so that no leg ever does.

A process group misses what a leg starts in a session of its own (torchrun's ranks, a double-forked
`setsid` daemon), and a process tree misses a child whose parent exited before the tree was read.
So every leg carries a MARKER, an environment variable its whole descendance inherits, and the
engine starts one reaper (`Reaper.get()`) holding the write end of a pipe to the reaper's stdin.
When that pipe closes, however the engine ended (a SIGKILL included), the reaper stops, then kills,
every process carrying the marker, and masks the secrets left in the run directories it was told
of (torchrun's per-rank logs): nothing of the run keeps running, and nothing of it keeps a secret.

The engine waits for the reaper's one `ready` line before it starts a leg: a reaper that cannot
start (its import root wrong after a move, a broken interpreter) is an error naming why, with its
output, never a run with no guard at all.

Run as `python -m engine.run.reaper MARKER_NAME`; it reads one JSON object per line on stdin:
`{"scrub": DIR, "secrets": [...]}` (mask these in DIR at the end) and `{"done": DIR}` (the engine
scrubbed DIR itself). Secrets travel through the pipe, never through argv or the environment,
where any process could read them.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets as random
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import psutil

MARKER_PREFIX = "SPECPROBE_LEG_"
REAP_TIMEOUT_S = 10.0
REAP_POLL_S = 0.05
READY = b"specprobe reaper ready\n"
# An interpreter's start on a loaded 2-core machine; a reaper slower than this is not a guard.
READY_TIMEOUT_S = 30.0
OUTPUT_KEPT = 4096  # bytes of a failed reaper's output shown in the error


class ReaperUnavailable(RuntimeError):
    """The reaper process did not start; no leg may run unguarded."""


def marked(name: str, value: str | None = None) -> list[psutil.Process]:
    """Every live process whose environment has `name` (= `value` when given). A process of
    another user, or one that exited meanwhile, is skipped: it cannot be ours."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if name in env and (value is None or env[name] == value):
            found.append(proc)
    return found


def kill_marked(name: str, value: str | None = None, timeout_s: float = REAP_TIMEOUT_S) -> list[int]:
    """SIGSTOP, then SIGKILL, every process carrying the marker, until none is left (a stopped
    process cannot fork another, so a forking leg cannot outrun this); the pids signalled."""
    deadline = time.monotonic() + timeout_s
    killed: list[int] = []
    while True:
        procs = marked(name, value)
        if not procs:
            return killed
        for action in ("suspend", "kill"):
            for proc in procs:
                try:
                    getattr(proc, action)()  # psutil checks the pid is still that process
                except (psutil.Error, OSError):
                    pass
        killed += [p.pid for p in procs if p.pid not in killed]
        if time.monotonic() >= deadline:
            return killed
        psutil.wait_procs(procs, timeout=REAP_POLL_S)


class Reaper:
    """The engine's side: the marker its legs carry, and the pipe whose closing the reaper waits
    for. One per engine process (a forked child gets its own)."""

    _instance: "Reaper | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.name = f"{MARKER_PREFIX}{self.pid}_{random.token_hex(4)}"
        self._legs = itertools.count(1)
        env = dict(os.environ)
        # The reaper must find `engine` wherever the engine was imported from.
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.run.reaper", self.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            close_fds=True,
            # Its own session: a Ctrl-C or a kill of the engine's process group must not take the
            # reaper down before it has done its work.
            start_new_session=True,
        )
        assert self.proc.stdin is not None
        self._pipe: IO[bytes] = self.proc.stdin
        self._await_ready()

    def _await_ready(self) -> None:
        """Return once the reaper said `ready`; else stop it and raise ReaperUnavailable with why
        and the end of what it printed (an import error's traceback)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + READY_TIMEOUT_S
        got, why = b"", ""
        while READY not in got:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.proc.kill()
                why = f"it did not say it was ready within {READY_TIMEOUT_S:g} s (stopped)"
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                why = f"it ended before it was ready (exit code {self.proc.wait()})"
                break
            got = (got + chunk)[-(OUTPUT_KEPT + len(READY)) :]
        self.proc.stdout.close()
        if not why:
            return
        self.proc.wait()
        self._pipe.close()
        output = got.decode("utf-8", errors="replace").strip()[-OUTPUT_KEPT:]
        raise ReaperUnavailable(
            f"the reaper ({sys.executable} -m engine.run.reaper) did not start: {why}"
            + (f"; its output ends: {output}" if output else "; it printed nothing")
        )

    @classmethod
    def get(cls) -> "Reaper":
        with cls._lock:
            if cls._instance is None or cls._instance.pid != os.getpid() or cls._instance.proc.poll() is not None:
                cls._instance = cls()
            return cls._instance

    def marker(self) -> tuple[str, str]:
        """(variable, value) for a new leg: the value tells this leg from the engine's others."""
        return self.name, str(next(self._legs))

    def _send(self, message: dict) -> None:
        try:
            self._pipe.write((json.dumps(message) + "\n").encode())
            self._pipe.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise RuntimeError(f"the reaper process (pid {self.proc.pid}) is gone: {exc}") from None

    def scrub_at_end(self, directory: str | os.PathLike[str], secret_texts: list[str]) -> None:
        """Should the engine die, mask these secrets in every file under `directory`."""
        if secret_texts:
            self._send({"scrub": str(directory), "secrets": secret_texts})

    def scrubbed(self, directory: str | os.PathLike[str]) -> None:
        """The engine masked `directory` itself at the end of its run."""
        self._send({"done": str(directory)})


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].startswith(MARKER_PREFIX):
        print("usage: python -m engine.run.reaper SPECPROBE_LEG_<id>", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # Imported before `ready`: an import that fails must fail the start, not the cleanup.
    from engine.secrets import TreeScrubber

    os.write(1, READY)
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):  # the engine stops reading after `ready`
        os.dup2(devnull, fd)
    os.close(devnull)
    dirs: dict[str, list[str]] = {}
    for line in sys.stdin.buffer:  # until the engine's end of the pipe closes
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and isinstance(message.get("scrub"), str):
            dirs[message["scrub"]] = [s for s in message.get("secrets") or [] if isinstance(s, str)]
        elif isinstance(message, dict) and isinstance(message.get("done"), str):
            dirs.pop(message["done"], None)
    kill_marked(argv[0])
    if dirs:
        for directory, texts in dirs.items():
            try:
                TreeScrubber(directory, texts).scrub()
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
