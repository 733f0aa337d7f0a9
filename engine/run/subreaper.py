"""A leg's supervisor on Linux: a child subreaper between the engine and the leg.

The marker (engine/run/reaper.py) finds what a leg started only while it keeps its environment; a
daemon that double-forks, calls setsid() and re-executes itself with an empty environment carries
no trace of the leg at all. So each leg runs under this small program, which makes itself a child
subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`): every orphan of the leg, however it escaped, is
reparented to it instead of to init. It starts the leg's leader in a session of its own and waits.
When the leader exits, it SIGSTOPs then SIGKILLs every process still below it, reaps them, and exits
with the leader's status (a leader killed by SIGKILL makes it die by SIGKILL), so the engine sees the
leg's exit code. When the engine dies (SIGKILL included), its stdin, the write end of which only the
engine holds, reads EOF, and it does the same at once.

It carries no marker itself (the reaper kills the marked processes without waiting for it to finish)
and ignores SIGINT, SIGTERM and SIGHUP: signals meant for the leg go to the leader's group and the
leg's processes, never to it. It runs as `python -I -S FILE` and imports a few standard modules
(not subprocess: it forks and execs the leader itself, in a fraction of the start-up time), so no
import path, no environment and no site-packages can stop it from starting.

    python -I -S subreaper.py STATUS_FD MARKER_NAME MARKER_VALUE -- ARGV...

STATUS_FD receives one line and is closed: `pid N` (the leader runs), `exec ERRNO` (the leader's
program could not be executed: the engine raises that OSError, as subprocess would have) or
`prctl ERRNO`.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the supervisor itself never imports subprocess
    import subprocess

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
STATUS_TIMEOUT_S = 30.0  # an interpreter's start on a loaded machine
KILL_TIMEOUT_S = 10.0
POLL_S = 1.0

# Supervisor pid -> its leader's process group, for the legs running now: the engine's second Ctrl-C
# kills the leader's group and leaves the supervisor to take the rest down.
LEADERS: dict[int, int] = {}
_supported: bool | None = None


def _prctl(option: int, arg: object) -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        return ctypes.get_errno() or -1
    return 0


def supported() -> bool:
    """Whether legs run under a subreaper here: Linux, with prctl's child subreaper (3.4+)."""
    global _supported
    if _supported is None:
        _supported = False
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                _supported = _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(ctypes.c_int())) == 0
            except (OSError, AttributeError):
                _supported = False
    return _supported


def spawn(
    argv: Sequence[str], env: Mapping[str, str], cwd: str | os.PathLike[str] | None, marker: tuple[str, str]
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a leg in a session of its own, its stdout and stderr one pipe (`proc.stdout`), carrying
    `marker` in its environment: under a supervisor where one can run (Linux), else directly.
    Returns the Popen to wait for (the supervisor's, or the leader's) and the leader's process group.
    Raises what starting the command raised (FileNotFoundError for a missing program, ...)."""
    import subprocess

    if not supported():
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**env, marker[0]: marker[1]},
            cwd=cwd,
            start_new_session=True,
            bufsize=0,
        )
        return proc, proc.pid
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(write_fd), *marker, "--", *argv],
            stdin=subprocess.PIPE,  # the lifeline: only the engine holds its write end
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            pass_fds=(write_fd,),
            bufsize=0,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    try:
        status = _read_status(read_fd)
    finally:
        os.close(read_fd)
    word, _, value = status.partition(" ")
    if word == "pid" and value.isdigit():
        LEADERS[proc.pid] = int(value)
        return proc, int(value)
    output = _abandon(proc)
    if word == "exec" and value.isdigit():
        raise OSError(int(value), os.strerror(int(value)), argv[0])
    why = f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(int(value))}" if word == "prctl" else status
    raise OSError(f"the leg's supervisor did not start it: {why}" + (f"; its output ends: {output}" if output else ""))


def finished(proc: subprocess.Popen[bytes]) -> None:
    """The leg is over: forget it, and close the supervisor's lifeline."""
    LEADERS.pop(proc.pid, None)
    if proc.stdin is not None:
        proc.stdin.close()


def _read_status(fd: int) -> str:
    deadline = time.monotonic() + STATUS_TIMEOUT_S
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return f"no word from it within {STATUS_TIMEOUT_S:g} s"
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    text = data.decode("ascii", errors="replace").strip()
    return text or "it ended without a word"


def _abandon(proc: subprocess.Popen[bytes]) -> str:
    """The supervisor did not start the leg: reap it (stopped if it lingers); the end of its output."""
    import subprocess

    finished(proc)
    try:
        proc.wait(timeout=STATUS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    try:
        output = proc.stdout.read(65536) or b""
    except BlockingIOError:
        output = b""
    proc.stdout.close()
    return output.decode("utf-8", errors="replace").strip()[-2000:]


# ---------------------------------------------------------------- the supervisor itself


def _noop(signum: int, frame: object) -> None:
    """A handler, not SIG_IGN: an ignored signal would stay ignored in the leader after exec."""


def _reap() -> list[tuple[int, int]]:
    """Every child that has ended: (pid, wait status)."""
    done = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done.append((pid, status))


def _descendants(root: int) -> list[tuple[int, bytes]]:
    """(pid, state) of every process below `root`, from one pass over /proc."""
    children: dict[int, list[tuple[int, bytes]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append((int(entry), fields[0]))
        except (OSError, ValueError, IndexError):
            continue
    found: list[tuple[int, bytes]] = []
    stack = [root]
    while stack:
        for pid, state in children.get(stack.pop(), ()):
            found.append((pid, state))
            stack.append(pid)
    return found


def _children(me: int) -> list[int] | None:
    """Our children (orphans of the leg come to us), from the kernel's own list of them; None where
    it keeps none (a kernel without CONFIG_PROC_CHILDREN)."""
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as fh:
            return [int(pid) for pid in fh.read().split()]
    except (OSError, ValueError):
        return None


def _kill_descendants(wake: int) -> bool:
    """SIGKILL everything below us until a pass finds nothing, and reap it all; False when it was
    still finding processes after KILL_TIMEOUT_S (said on our output, which is the leg's log).

    Every process below us is a child of ours or below one, and what a killed child leaves comes to
    us (we are its subreaper): killing our children over and over reaches everything. A pass reads
    the kernel's list of our children (microseconds, where a walk of /proc takes milliseconds), so a
    chain that forks, setsid()s and exits in a loop cannot outrun it: a process SIGKILLed before its
    fork() completes makes no child (the kernel cancels a fork with a fatal signal pending)."""
    deadline = time.monotonic() + KILL_TIMEOUT_S
    me = os.getpid()
    while True:
        _reap()
        kids = _children(me)
        if kids is None:  # the slow way: the whole tree below us, from /proc
            kids = [pid for pid, state in _descendants(me) if state != b"Z"]
        if not kids:
            return True
        if time.monotonic() >= deadline:
            _say_left(kids)
            return False
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _nap(wake, 0.002)  # a child's death wakes us at once (SIGCHLD)


def _say_left(pids: list[int]) -> None:
    """The bound was hit: say so where the leg's output goes (its log, the console)."""
    line = (
        f"[specprobe: the leg's processes were still forking after {KILL_TIMEOUT_S:g} s of SIGKILL; "
        f"{len(pids)} left (pids {', '.join(map(str, pids[:10]))}); they may outlive the run]\n"
    )
    try:
        os.write(1, line.encode())
    except OSError:
        pass


def _nap(wake: int, seconds: float) -> None:
    """Until a child ends (a SIGCHLD woke us) or `seconds` pass."""
    if select.select([wake], [], [], seconds)[0]:
        _drain(wake)


def _drain(wake: int) -> None:
    try:
        while os.read(wake, 4096):
            pass
    except BlockingIOError:
        pass


def _wait_for(leader: int, wake: int) -> int | None:
    """The leader's wait status, or None when the engine went away first."""
    while True:
        for pid, status in _reap():
            if pid == leader:
                return status
        ready = select.select([0, wake], [], [], POLL_S)[0]
        if 0 in ready and not os.read(0, 4096):
            return None
        if wake in ready:
            _drain(wake)


def _exit_like(status: int | None) -> None:
    if status is None:
        os._exit(128 + signal.SIGKILL)
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # dying like the leader must not dump a core
    if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught, nor be given a handler
        signal.signal(-code, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
    os.kill(os.getpid(), -code)
    os._exit(128 - code)


def _report(fd: int, line: str) -> None:
    os.write(fd, (line + "\n").encode())
    os.close(fd)


def _start(command: list[str], env: dict[str, str], status_fd: int) -> int | None:
    """Fork and exec the leader in a session of its own, stdin from /dev/null; its pid, or None
    once the failure is reported (what subprocess would have raised, as an errno)."""
    error_r, error_w = os.pipe()  # close-on-exec: EOF on it means the exec happened
    pid = os.fork()
    if pid == 0:
        try:
            os.close(error_r)
            os.close(status_fd)
            os.setsid()
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            # As subprocess does: what Python ignores for itself, a program gets back as the default.
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execvpe(command[0], command, env)
        except BaseException as exc:  # nothing may return from here into the supervisor's code
            os.write(error_w, str(getattr(exc, "errno", None) or errno.ENOEXEC).encode())
        finally:
            os._exit(127)
    os.close(error_w)
    failed = b""
    while chunk := os.read(error_r, 64):
        failed += chunk
    os.close(error_r)
    if not failed:
        return pid
    os.waitpid(pid, 0)
    _report(status_fd, f"exec {int(failed)}")
    return None


def main(argv: list[str]) -> int:
    status_fd, name, value, sep, command = int(argv[0]), argv[1], argv[2], argv[3], argv[4:]
    assert sep == "--" and command
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _noop)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, _noop)
    failed = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if failed:
        _report(status_fd, f"prctl {failed if failed > 0 else 0}")
        return 125
    leader = _start(command, {**os.environ, name: value}, status_fd)
    if leader is None:
        return 127
    _report(status_fd, f"pid {leader}")
    status = _wait_for(leader, wake_r)
    _kill_descendants(wake_r)
    _exit_like(status)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
