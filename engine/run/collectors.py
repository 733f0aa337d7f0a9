"""Collector plugins: functions that read some state and return it as JSON for `doc["state"]`.

Built-ins: `json_file` {path} and `command` {argv, timeout_s, env}. Others come from the
`specprobe.collectors` entry-point group; each entry point loads `collect(args, context) -> dict`.
Built-ins win a name clash, so an installed package cannot silently change their meaning.

A plugin runs in this process, on a thread of its own, for at most its step's `collect.timeout_s`
(`defaults.PLUGIN_COLLECT_TIMEOUT_S` when the spec gives none): a plugin that blocks (a read from a FIFO,
a server that never answers) would otherwise hold the run forever and its verdict would never be written.
Past the bound the step fails naming the collector and the bound, and the run goes on; the thread, which
Python cannot stop, is left to end with the engine (it is a daemon thread).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from functools import partial
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from engine import defaults, limits
from engine.run.lines import Block
from engine.run.process import run_command
from engine.run.record import LegLog, RecordError

GROUP = "specprobe.collectors"

Collector = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]


class CollectorError(Exception):
    """A collector could not produce its document; the message says which and why."""


def _resolve(path: str | os.PathLike[str], context: Mapping[str, Any]) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = Path(context.get("cwd") or os.getcwd()) / p
    return p


def collect_json_file(args: Mapping[str, Any], context: Mapping[str, Any]) -> Any:
    if "path" not in args:
        raise CollectorError("json_file: missing argument 'path'")
    path = _resolve(args["path"], context)
    try:
        text = limits.read_regular_file(path, limits.JSON_FILE_MAX_BYTES, "collected JSON file").decode("utf-8")
    except FileNotFoundError:
        raise CollectorError(f"json_file: {path}: no such file") from None
    except limits.LimitError as exc:
        raise CollectorError(f"json_file: {exc}") from None
    except UnicodeDecodeError as exc:
        raise CollectorError(f"json_file: {path}: not UTF-8 (byte {exc.start})") from None
    except (OSError, ValueError) as exc:
        raise CollectorError(f"json_file: {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return limits.loads_json(text)
    except json.JSONDecodeError as exc:
        raise CollectorError(f"json_file: {path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except ValueError as exc:
        raise CollectorError(f"json_file: {path}: {exc}") from None


def _parse_command_output(lines: list[str]) -> Any:
    """The last non-empty line as JSON, else the whole output (a pretty-printed document)."""
    non_empty = [line for line in lines if line.strip()]
    if not non_empty:
        raise ValueError("no output")
    try:
        return limits.loads_json(non_empty[-1])
    except json.JSONDecodeError:
        pass
    try:
        return limits.loads_json("\n".join(lines))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"neither the last line nor the whole output is JSON ({exc.msg}); last line: {non_empty[-1][:200]!r}"
        ) from None


def collect_command(args: Mapping[str, Any], context: Mapping[str, Any]) -> Any:
    argv = args.get("argv")
    if not isinstance(argv, (list, tuple)) or not argv:
        raise CollectorError("command: 'argv' must be a non-empty list")
    argv = [str(a) for a in argv]
    timeout = float(args.get("timeout_s", defaults.COMMAND_COLLECT_TIMEOUT_S))
    env = {str(k): str(v) for k, v in (args.get("env") or {}).items()}
    lines: list[str] = []
    kept = [0]

    def keep(block: Block) -> None:
        # A document is at most COLLECTOR_MAX_BYTES; past that only the line count goes on.
        kept[0] += len(block.text) + 1
        if kept[0] <= limits.COLLECTOR_MAX_BYTES:
            lines.extend(block.lines)

    grace = float(args.get("grace_s", defaults.COMMAND_COLLECT_GRACE_S))
    leg_log = context.get("leg_log")
    result = run_command(
        argv,
        env=env,
        cwd=context.get("cwd"),
        timeout_s=timeout,
        grace_s=grace,
        log=leg_log() if leg_log is not None else None,
        on_block=keep,
    )
    shown = " ".join(argv)
    if result.error:
        raise CollectorError(f"command {shown!r}: {result.error}")
    if result.timed_out:
        raise CollectorError(f"command {shown!r}: timed out after {timeout:g} s")
    if kept[0] > limits.COLLECTOR_MAX_BYTES:
        raise CollectorError(
            f"command {shown!r} printed {kept[0]:,} characters, over the "
            f"{limits.COLLECTOR_MAX_BYTES // limits.MiB} MiB limit of a collected "
            f"document"
        )
    if result.rc != 0:
        last = next((line for line in reversed(lines) if line.strip()), "")
        raise CollectorError(f"command {shown!r} exited with rc {result.rc}; last line: {last[:200]!r}")
    try:
        return _parse_command_output(lines)
    except ValueError as exc:
        raise CollectorError(f"command {shown!r} (rc 0): {exc}") from None


BUILTINS: dict[str, Collector] = {"json_file": collect_json_file, "command": collect_command}


def _plugins() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP) if ep.name not in BUILTINS}


def known_collectors() -> list[str]:
    return sorted(set(BUILTINS) | set(_plugins()))


def _load(name: str) -> Collector:
    if name in BUILTINS:
        return BUILTINS[name]
    plugin = _plugins().get(name)
    if plugin is None:
        raise CollectorError(f"unknown collector {name!r}; known: {', '.join(known_collectors())}")
    try:
        func = plugin.load()
    except Exception as exc:
        raise CollectorError(
            f"collector {name!r}: cannot load entry point {plugin.value!r}: {type(exc).__name__}: {exc}"
        ) from None
    if not callable(func):
        raise CollectorError(f"collector {name!r}: entry point {plugin.value!r} is not callable")
    return func


def context_of(
    step: str, run_dir: Path, log_path: Path, mask: Callable[[Any], Any], leg_log: Callable[[], LegLog]
) -> dict[str, Any]:
    """The context a collector of a run's step is handed (`collect` says what each key holds)."""
    return {
        "cwd": os.getcwd(),
        "run_dir": str(run_dir),
        "step": step,
        "log_path": str(log_path),
        "scrub": mask,
        "leg_log": leg_log,
    }


def collect(
    name: str, args: Mapping[str, Any] | None, context: Mapping[str, Any], timeout_s: float | None = None
) -> Any:
    """Run collector `name`; its JSON-serialisable result, or CollectorError saying why not. A plugin
    gets at most `timeout_s` seconds (default `defaults.PLUGIN_COLLECT_TIMEOUT_S`; module docstring).

    `context` carries `cwd`, `run_dir`, `step`, `log_path`, `scrub` (the run's secret filter: text,
    or a JSON-like document, masked) and `leg_log` (opens the step's log at `log_path`, masked,
    through the run's record: what a collector that runs a command writes its output into).
    """
    func = _load(name)
    call = partial(func, dict(args or {}), context)
    try:
        if name in BUILTINS:  # each bounds itself: a command by its own timeout, a JSON file by its size
            result = call()
        else:
            result = _within(call, defaults.PLUGIN_COLLECT_TIMEOUT_S if timeout_s is None else timeout_s, name)
    except (CollectorError, RecordError):  # RecordError: the run's own record failed, not the collector
        raise
    except Exception as exc:
        raise CollectorError(f"collector {name!r} failed: {type(exc).__name__}: {exc}") from None
    try:
        limits.check_json_value(result, limits.COLLECTOR_MAX_BYTES, "its document")
    except limits.LimitError as exc:
        raise CollectorError(f"collector {name!r}: {exc}") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise CollectorError(f"collector {name!r} returned a value that is not JSON: {exc}") from None
    return result


def _within(call: Callable[[], Any], timeout_s: float, name: str) -> Any:
    """`call()` on a daemon thread, waited for at most `timeout_s` seconds; what it returned or raised, or
    CollectorError naming the collector and the bound when it is still running then."""
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["result"] = call()
        except BaseException as exc:  # handed to the caller's thread, raised there
            done["error"] = exc

    worker = threading.Thread(target=run, name=f"collector-{name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise CollectorError(
            f"collector {name!r} did not finish within {timeout_s:g} s (its step's collect.timeout_s, default "
            f"{defaults.PLUGIN_COLLECT_TIMEOUT_S:g} s): abandoned, the run goes on without its document. Something "
            "it reads may block (a FIFO, a server that does not answer); raise collect.timeout_s if it is only slow"
        )
    if "error" in done:
        raise done["error"]
    return done["result"]
