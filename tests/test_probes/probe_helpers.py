"""Running the probe drivers for real, as the tests of tests/test_probes do.

A driver session runs in this process (its ``main(argv)``, the stop step in ``SPECPROBE_STOP_AT_STEP``, its stdout
captured): transformers, Lightning and accelerate are imported once for all the sessions instead of once per
session, which would cost ~10 s of CPU each. The 2-rank DCP loop runs as two forked processes joined by gloo, each a
real rank with its own output file, which a test can SIGKILL at a line like a signal rule does.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import probes.emit
from probes.emit import SESSION_MARKER, STEP_MARKER, STOP_ENV, STOP_MARKER


@dataclass
class Session:
    """What one training session printed."""

    lines: list[str]
    rc: int | None = 0
    error: BaseException | None = None

    def marked(self, marker: str) -> list[dict[str, Any]]:
        return [json.loads(line[len(marker) :]) for line in self.lines if line.startswith(marker)]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.marked(STEP_MARKER)

    @property
    def session(self) -> dict[str, Any]:
        (doc,) = self.marked(SESSION_MARKER)
        return doc

    @property
    def stop(self) -> dict[str, Any] | None:
        found = self.marked(STOP_MARKER)
        return found[-1] if found else None


@dataclass
class Run:
    """The sessions of one run, in order, and its output folder."""

    out: Path
    sessions: list[Session] = field(default_factory=list)
    after_first: dict[str, Any] = field(default_factory=dict)  # what a test looked at between the sessions

    def by_step(self) -> dict[int, dict[str, Any]]:
        """Each step's line; a step a later session trained again replaces the earlier one."""
        return {s["step"]: s for session in self.sessions for s in session.steps}


def first_difference(run: dict[int, dict], reference: dict[int, dict], keys: Sequence[str]) -> tuple | None:
    """(step, key, run's value, reference's value) of the first step where they differ; None when none does."""
    for step in sorted(set(run) | set(reference)):
        a, b = run.get(step), reference.get(step)
        if a is None or b is None:
            return (step, "missing", a, b)
        for key in keys:
            if a.get(key) != b.get(key):
                return (step, key, a.get(key), b.get(key))
    return None


@contextlib.contextmanager
def stop_env(stop: int | None) -> Iterator[None]:
    old = os.environ.pop(STOP_ENV, None)
    if stop is not None:
        os.environ[STOP_ENV] = str(stop)
    try:
        yield
    finally:
        os.environ.pop(STOP_ENV, None)
        if old is not None:
            os.environ[STOP_ENV] = old


def in_process(main: Callable[[list[str]], int], argv: list[str], stop: int | None = None) -> Session:
    """One session of a driver in this process; an exception it raises is kept, as a crashed leg's would be."""
    probes.emit.new_session()
    buf = io.StringIO()
    with stop_env(stop), contextlib.redirect_stdout(buf):
        try:
            rc, error = main(argv), None
        except Exception as exc:  # the driver's own failure is what some tests are about
            rc, error = 1, exc
    return Session(buf.getvalue().splitlines(), rc, error)


def split_run(main: Callable, out: Path, stop: int, args: Sequence[str] = ()) -> Run:
    """Session 1 stopped by the probe at ``stop``, then session 2 resumed to the horizon."""
    base = ["--output-dir", str(out), *args]
    return Run(out, [in_process(main, base, stop), in_process(main, [*base, "--resume"])])


def whole_run(main: Callable, out: Path, args: Sequence[str] = ()) -> Run:
    return Run(out, [in_process(main, ["--output-dir", str(out), *args])])


# ---- the 2-rank DCP loop -------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, argv: list[str], stop: int | None, out: str) -> None:
    fd = os.open(out, os.O_WRONLY | os.O_TRUNC)  # made by dcp_session before the fork
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    # the test runner's own stream objects are inherited with the fork: the rank writes to its file instead
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    os.environ.pop(STOP_ENV, None)
    if stop is not None:
        os.environ[STOP_ENV] = str(stop)
    probes.emit.new_session()
    from probes.drivers import dcp_loop

    try:
        rc = dcp_loop.main(argv)
    except BaseException:
        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def dcp_session(
    argv: list[str], stop: int | None = None, kill_on: str | None = None, timeout_s: float = 120
) -> Session:
    """One 2-rank session; with ``kill_on``, both ranks are SIGKILLed once rank 0 prints a line starting with it."""
    ctx = multiprocessing.get_context("fork")
    port = _free_port()
    outs = [Path(argv[argv.index("--output-dir") + 1]) / f".rank{r}.{time.monotonic_ns()}.out" for r in range(2)]
    outs[0].parent.mkdir(parents=True, exist_ok=True)
    for out in outs:  # before the fork: a loaded machine may start a rank after the first look for the kill line
        out.touch()
    procs = [ctx.Process(target=_rank_main, args=(r, 2, port, argv, stop, str(outs[r]))) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    if kill_on is not None:
        while time.monotonic() < deadline and not any(
            line.startswith(kill_on) for line in outs[0].read_text(errors="replace").splitlines()
        ):
            if all(not p.is_alive() for p in procs):
                break
            time.sleep(0.05)
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join()
    lines = outs[0].read_text(errors="replace").splitlines()
    rank1 = outs[1].read_text(errors="replace")
    return Session(lines + [f"[rank1] {line}" for line in rank1.splitlines()], procs[0].exitcode)


def copy_checkpoint(src: Path, dst: Path) -> Path:
    """A private copy of a shared checkpoint (file or folder) for a test to change."""
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    return dst
