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
@daemon:PATH    double-fork a setsid() daemon (stdio closed) that sleeps 300 s, its pid in PATH
@daemon_noenv:PATH  like @daemon, but the daemon re-executes itself with an EMPTY environment:
                nothing in it says whose it is
@environ_of:PATH  wait for PATH (a pid), then print ENVIRON_BYTES=<size of that process's environment>
@on_term:ACTION on SIGTERM, do ACTION (and carry on)
@orphan:PATH    run a child that forks a grandchild and exits at once: the grandchild (setsid,
                300 s, its pid in PATH) is an orphan in a session of its own before anyone can
                see it as ours; the leg goes on once PATH is written
@line:N:AT:TEXT print one line of N characters: TEXT at offset AT, 'x' around it
"""

import os
import signal
import subprocess
import sys
import time


def main(actions: list[str]) -> int:
    for action in actions:
        if action.startswith("@sleep:"):
            time.sleep(float(action[7:]))
        elif action.startswith("@rc:"):
            return int(action[4:])
        elif action.startswith("@env:"):
            print(f"{action[5:]}={os.environ.get(action[5:], '')}", flush=True)
        elif action.startswith("@repeat:"):
            count, text = action[8:].split(":", 1)
            write = sys.stdout.write
            for i in range(int(count)):
                write(text.replace("{i}", str(i)) + "\n")
            sys.stdout.flush()
        elif action.startswith("@pidfile:"):
            _write_whole(action[9:], str(os.getpid()))
        elif action.startswith("@spawn:"):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            _write_whole(action[7:], str(child.pid))
        elif action == "@ignore_term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif action.startswith("@stderr:"):
            print(action[8:], file=sys.stderr, flush=True)
        elif action.startswith("@raw:"):
            sys.stdout.flush()
            sys.stdout.buffer.write(bytes.fromhex(action[5:]))
            sys.stdout.buffer.flush()
        elif action.startswith("@daemon:"):
            daemon(action[8:])
        elif action.startswith("@daemon_noenv:"):
            daemon(action[14:], clear_env=True)
        elif action.startswith("@environ_of:"):
            pid = _wait_for_pid(action[12:])
            with open(f"/proc/{pid}/environ", "rb") as fh:
                print(f"ENVIRON_BYTES={len(fh.read())}", flush=True)
        elif action.startswith("@on_term:"):
            then = action[9:]
            signal.signal(signal.SIGTERM, lambda signum, frame, then=then: main([then]))
        elif action.startswith("@pid_and_sleep:"):
            _write_pid_and_sleep(action[15:])
        elif action.startswith("@orphan:"):
            subprocess.run([sys.executable, __file__, "@fork_and_exit:" + action[8:]], check=True)
            # The orphan's pid is on disk before the leg goes on (or ends and takes it along): a test
            # always has a pid to look for, however loaded the machine.
            _wait_for_pid(action[8:])
        elif action.startswith("@fork_and_exit:"):
            if os.fork() == 0:
                os.setsid()  # out of the group too: only the marker still says whose it is
                _write_pid_and_sleep(action[15:])
            os._exit(0)
        elif action.startswith("@line:"):
            size, at, text = action[6:].split(":", 2)
            rest = int(size) - int(at) - len(text)
            sys.stdout.write("x" * int(at) + text + "x" * rest + "\n")
            sys.stdout.flush()
        elif action == "@forever":
            while True:
                time.sleep(1)
        else:
            print(action, flush=True)
    return 0


def _wait_for_pid(path: str) -> int:
    while not os.path.exists(path):
        time.sleep(0.01)
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
