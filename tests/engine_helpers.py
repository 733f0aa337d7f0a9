"""Shared helpers for tests that drive the engine: one `engine` command's result, the spec files tests write,
and the scriptable leg (tests/legs/leg.py).

Import as `from engine_helpers import ...` (pytest puts tests/ on sys.path). The fixtures that run the engine,
`engine` (in this process) and `engine_process` (a real program), are in tests/test_engine/conftest.py and
call `in_process` and `as_process` here.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LEG = str(Path(__file__).parent / "legs" / "leg.py")
ENGINE = (sys.executable, "-m", "engine.cli")
# A hang guard for an engine program, not a deadline: what a test asserts on its time it measures itself.
HANG_S = 300
RAN_CHECK = {"name": "ran", "why": "the leg ran", "expr": "steps.leg.rc == `0`"}


@dataclass
class Ran:
    """What one `engine` command did: its exit code and what it printed on each stream."""

    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out}--- stderr\n{self.err}"


# The fixtures' type: engine(*args, cwd=, env=, expect=) -> Ran.
Engine = Callable[..., Ran]


def expecting(ran: Ran, expect: int | None) -> Ran:
    """`ran`, its exit code asserted to be `expect` (both streams shown when it is not); None asserts nothing."""
    if expect is not None:
        assert ran.code == expect, ran
    return ran


def in_process(
    args: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    cwd: Path | None = None,
    env: Mapping[str, str | None] | None = None,
) -> Ran:
    """`engine ARGS` run by `engine.cli.main` in this process, in `cwd`, with `env` set (None unsets) for this
    call only; an exception escaping it fails the test, as a traceback would."""
    from engine.cli import main

    capsys.readouterr()  # what the test printed before is not the engine's
    before = _process_state()
    with monkeypatch.context() as patch:
        if cwd is not None:
            patch.chdir(cwd)
        for name, value in (env or {}).items():
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        code = main(list(args))
    ran = Ran(int(code), *capsys.readouterr())
    after = _process_state()
    left = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert not left, f"engine {' '.join(args)} left this process changed for the tests after it: {left}\n{ran}"
    return ran


def _process_state() -> dict[str, object]:
    """What an in-process run must leave as it found it."""
    return {
        "SIGINT": signal.getsignal(signal.SIGINT),
        "SIGTERM": signal.getsignal(signal.SIGTERM),
        "stdout": sys.stdout,
        "stderr": sys.stderr,
        "cwd": os.getcwd(),
        **{f"${name}": value for name, value in os.environ.items()},
    }


def as_process(
    args: tuple[str, ...],
    cwd: Path | None = None,
    env: Mapping[str, str | None] | None = None,
    environ: Mapping[str, str] | None = None,
    command: tuple[str, ...] = ENGINE,
    timeout: float = HANG_S,
    preexec: Callable[[], None] | None = None,
) -> Ran:
    """`engine ARGS` as a program: `command` (python -m engine.cli by default) in `cwd`, its environment
    `environ` (by default this process's, importing this checkout) with `env` over it (None unsets);
    `preexec` runs in the child before it starts (a resource limit)."""
    full = dict(os.environ, PYTHONPATH=str(ROOT)) if environ is None else dict(environ)
    for name, value in (env or {}).items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    if preexec is not None:
        # A process under a file-size limit must not write the bytecode every other process reads: CPython
        # renames a .pyc into place even when the limit cut its write short, and each later import of that
        # module, in any test, then fails with "marshal data too short".
        full["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [*command, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout, preexec_fn=preexec
    )
    return Ran(done.returncode, done.stdout, done.stderr)


def engine_started(*args: str, cwd: Path, **popen: Any) -> subprocess.Popen[str]:
    """`engine ARGS` started as a program in `cwd`, both streams piped unless `popen` says otherwise: for a
    test that signals it, or reads and closes its output, while it runs."""
    how: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    return subprocess.Popen([*ENGINE, *args], cwd=cwd, env=dict(os.environ, PYTHONPATH=str(ROOT)), **how)


# For engine_started: an engine killed from outside, its output not read, in a session of its own (as a
# scheduler would start it; a SIGKILL reaches it alone, not the test).
QUIET = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}


def write_spec(path: Path, spec: str | dict[str, Any] | list[dict[str, Any]], /, **top: Any) -> Path:
    """Write a spec file; its path. YAML text is written as it is (a test about the text: its lines, its
    layout, a value YAML reads its own way); a whole document (a dict) as YAML. A list of steps becomes a
    document: version 1, the name `probe`, a budget of 1000 s, no values, the check that the step `leg` exited
    0, each replaced by what `top` gives."""
    if isinstance(spec, str):
        assert not top, "a spec given as text takes no fields"
        path.write_text(spec)
        return path
    if isinstance(spec, dict):
        assert not top, "a spec given as a whole document takes no fields"
        doc = spec
    else:
        doc = {"version": 1, "name": "probe", "budget_s": 1000, "values": {}, "steps": spec, "checks": [RAN_CHECK]}
        doc.update(top)
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=100_000))
    return path


def leg(*actions: str, name: str = "leg", timeout_s: float = 60, **run: Any) -> dict[str, Any]:
    """A step running tests/legs/leg.py with `actions` (see that file), under the spec's `python`."""
    return {"name": name, "run": {"argv": ["${python}", LEG, *actions], "timeout_s": timeout_s, **run}}


def python_leg(code: str, *args: str, name: str = "leg", timeout_s: float = 60, **run: Any) -> dict[str, Any]:
    """A step running `python -c CODE ARGS` under the spec's `python`."""
    return {"name": name, "run": {"argv": ["${python}", "-c", code, *args], "timeout_s": timeout_s, **run}}


def no_traceback(ran: Ran) -> None:
    """The engine said what went wrong in words, not with a traceback."""
    assert "Traceback" not in ran.out + ran.err, ran


def file_size_limit(size: int) -> Callable[[], None]:
    """For a child process: its files may not grow past `size` bytes (RLIMIT_FSIZE)."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


def evidence_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "evidence.json").read_text())


# A secret the engine's tests hand to legs and look for everywhere afterwards.
TOKEN = "hf_HOSTILE_TOKEN_5b7c9d1e3f"


def mask(n: int) -> str:
    """What a run-dir file holds where n bytes of a secret were."""
    return ("<redacted>" + "*" * n)[:n] if n >= 10 else "*" * n


def files_holding(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


RANKS = str(Path(__file__).parent / "legs" / "ranks.py")


def torchrun_leg(*args: str, timeout_s: int = 120) -> dict[str, Any]:
    """A step running tests/legs/ranks.py with `args` under real torchrun: 2 ranks, their output teed and
    logged under the run dir, which the diagnostics read when the leg fails."""
    launch = "-m torch.distributed.run --nproc_per_node=2 --redirects 3 --tee 3 --log-dir ${run_dir}/tlogs"
    run = {
        "argv": ["${python}", *launch.split(), RANKS, *args],
        "timeout_s": timeout_s,
        "grace_s": 5,
        "env": {"OMP_NUM_THREADS": "1"},
        "output": {"strip_prefix": r"^\[(?:default|rank|worker)\d*\]:\s*"},
        "on_failure": {"diagnostics": {"dir": "${run_dir}/tlogs"}},
    }
    return {"name": "leg", "run": run}


def git(repo: Path, *args: str) -> str:
    """`git ARGS` in `repo` as a fixed author, whatever the machine's git configuration; its output."""
    who = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com"}
    env = {**os.environ, **who, "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    command = ["git", "-c", "commit.gpgsign=false", *args]
    return subprocess.run(command, cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


# What the spec fuzzers put together into spec texts: YAML's punctuation, anchors and scalars, and the
# keys of a step. Each fuzzer adds the pieces of its own aim.
YAML_PIECES = [
    "---\n",
    "version: 1\n",
    "steps:\n",
    "checks:\n",
    "values:\n",
    "modes:\n",
    "- ",
    "  ",
    "run: ",
    "argv: ",
    "remove: ",
    "collect: ",
    "{",
    "}",
    "[",
    "]",
    ", ",
    ": ",
    "&a ",
    "*a",
    "`1`",
    "'",
    '"',
    "\t",
    "\n",
    "eval: ",
    "!!python/object:os.system",
    "? ",
]
