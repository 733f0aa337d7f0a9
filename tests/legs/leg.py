"""A scriptable leg for the engine's tests: each argument is an action, run in order.

text            print the text
@sleep:S        sleep S seconds
@rc:N           exit with rc N (at that point)
@env:NAME       print NAME=<value of env var NAME>
@repeat:N:TEXT  print TEXT N times, with {i} replaced by the index
@pidfile:PATH   write this process's pid to PATH
@spawn:PATH     start a background grandchild that sleeps 300 s, its pid written to PATH
@ignore_term    ignore SIGTERM from here on
@stderr:TEXT    print TEXT on stderr
@raw:HEX        write raw bytes (hex) to stdout
@forever        sleep until killed
@await:PATH     wait until PATH exists (a test creates it once it has seen what it waits for)
@daemon:PATH    double-fork a setsid() daemon (stdio closed) that sleeps 300 s, its pid in PATH
@daemon_noenv:PATH  like @daemon, but the daemon re-executes itself with an EMPTY environment:
                nothing in it says whose it is
@environ_of:PATH  wait for PATH (a pid), then print ENVIRON_BYTES=<size of that process's environment>
@on_term:ACTION on SIGTERM, do ACTION (and carry on)
@orphan:PATH    run a child that forks a grandchild and exits at once: the grandchild (setsid,
                300 s, its pid in PATH) is an orphan in a session of its own before anyone can
                see it as ours; the leg goes on once PATH is written
@line:N:AT:TEXT print one line of N characters: TEXT at offset AT, 'x' around it
@append:PATH:TEXT append TEXT and a newline to the file PATH (how often a leg ran, a document it wrote)
@tee_split:NAME:AT[:PATH]  print env var NAME's value in one line the way torchrun's --tee copies a
                line the rank is still writing: the first AT characters with a "[default0]:" header,
                flushed, then the rest with a header of its own (in the middle of the value); with
                PATH, the same text is also appended to that file
"""

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable


def main(actions: list[str]) -> int:
    for action in actions:
        name, colon, arg = action.partition(":")
        do = ACTIONS.get(name + colon)  # `@sleep:` takes an argument, `@forever` none
        if do is None:
            print(action, flush=True)
            continue
        rc = do(arg)
        if rc is not None:
            return rc
    return 0


def _repeat(arg: str) -> None:
    count, text = arg.split(":", 1)
    write = sys.stdout.write
    for i in range(int(count)):
        write(text.replace("{i}", str(i)) + "\n")
    sys.stdout.flush()


def _write(path: str, text: str, mode: str = "w") -> None:
    with open(path, mode) as fh:
        fh.write(text)


def _spawn(path: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    _write_whole(path, str(child.pid))


def _raw(hex_text: str) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(bytes.fromhex(hex_text))
    sys.stdout.buffer.flush()


def _environ_of(path: str) -> None:
    pid = _wait_for_pid(path)
    with open(f"/proc/{pid}/environ", "rb") as fh:
        print(f"ENVIRON_BYTES={len(fh.read())}", flush=True)


def _orphan(path: str) -> None:
    subprocess.run([sys.executable, __file__, "@fork_and_exit:" + path], check=True)
    # The orphan's pid is on disk before the leg goes on (or ends and takes it along): a test
    # always has a pid to look for, however loaded the machine.
    _wait_for_pid(path)


def _fork_and_exit(path: str) -> None:
    if os.fork() == 0:
        os.setsid()  # out of the group too: only the marker still says whose it is
        _write_pid_and_sleep(path)
    os._exit(0)


def _line(arg: str) -> None:
    size, at, text = arg.split(":", 2)
    rest = int(size) - int(at) - len(text)
    sys.stdout.write("x" * int(at) + text + "x" * rest + "\n")
    sys.stdout.flush()


def _append(arg: str) -> None:
    path, text = arg.split(":", 1)
    _write(path, text + "\n", "a")


def _on_sigterm(handler: Any) -> None:
    signal.signal(signal.SIGTERM, handler)


def _forever(_: str) -> None:
    while True:
        time.sleep(1)


def _await(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)


def _wait_for_pid(path: str) -> int:
    _await(path)
    with open(path) as fh:
        return int(fh.read())


def _write_whole(path: str, text: str) -> None:
    """Write beside PATH, then rename: a test that waits for PATH to exist never reads it empty."""
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def _write_pid_and_sleep(path: str) -> None:
    _write_whole(path, str(os.getpid()))
    time.sleep(300)
    os._exit(0)


def tee_split(name: str, at: str, path: str | None = None) -> None:
    value, cut = os.environ[name], int(at)
    pieces = [f"[default0]:logging in with {value[:cut]}", f"[default0]:{value[cut:]} as the rank\n"]
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()  # two writes, as tail_log makes them
        if path:
            with open(path, "a") as fh:
                fh.write(piece)


def daemon(path: str, clear_env: bool = False) -> None:
    """The classic double fork: the daemon is in a session of its own, its parent is gone; with
    `clear_env` it then becomes a fresh program with no environment at all."""
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            if clear_env:
                os.execve(sys.executable, [sys.executable, __file__, "@pid_and_sleep:" + path], {})
            _write_pid_and_sleep(path)
        os._exit(0)
    os.waitpid(first, 0)


# Each action, by its name (with the colon when it takes an argument): what it does with the argument.
# A handler that returns an int ends the leg with that rc.
ACTIONS: dict[str, Callable[[str], int | None]] = {
    "@sleep:": lambda arg: time.sleep(float(arg)),
    "@rc:": int,
    "@env:": lambda name: print(f"{name}={os.environ.get(name, '')}", flush=True),
    "@repeat:": _repeat,
    "@pidfile:": lambda path: _write_whole(path, str(os.getpid())),
    "@spawn:": _spawn,
    "@ignore_term": lambda _: _on_sigterm(signal.SIG_IGN),
    "@stderr:": lambda text: print(text, file=sys.stderr, flush=True),
    "@raw:": _raw,
    "@daemon:": daemon,
    "@daemon_noenv:": lambda path: daemon(path, clear_env=True),
    "@environ_of:": _environ_of,
    "@on_term:": lambda then: _on_sigterm(lambda signum, frame: main([then])),
    "@pid_and_sleep:": _write_pid_and_sleep,
    "@orphan:": _orphan,
    "@fork_and_exit:": _fork_and_exit,
    "@line:": _line,
    "@append:": _append,
    "@tee_split:": lambda arg: tee_split(*arg.split(":", 2)),
    "@await:": _await,
    "@forever": _forever,
}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
