"""The engine's size and time limits on what it reads, and the bounded readers that enforce them.

Every input the engine does not control (a spec, a leg's output, a collector's document, a saved
evidence file) is read through these, so a hostile or broken input costs a clear error, never a
traceback, a hang or the machine's memory. README.md's "Limits" table lists each one.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Callable

MiB = 1 << 20

# --- specs
SPEC_MAX_BYTES = 4 * MiB  # one spec file; the P4 specs are a few KB
SPEC_MAX_NODES = 100_000  # YAML nodes of one file once aliases are expanded (an alias bomb stops here)
SPEC_MAX_DEPTH = 50  # nesting of a spec's mappings and lists
VALUE_MAX_CHAIN = 100  # values resolving through values (`${a}` -> `${b}` -> ...)
FOR_EACH_MAX_ELEMENTS = 1000  # checks (or plot series) one `for_each` expands to
EXPANDED_CHECKS_MAX = 20_000  # checks (or plot series) of one mode once every `for_each` is expanded
EXPR_MAX_DEPTH = 100  # nesting of one JMESPath expression's syntax tree

# --- evaluating expressions
REGEX_TIMEOUT_S = 1.0  # one regex match of a spec's pattern (output rules, regex_match())
RANGE_MAX_TOTAL = 1_000_000  # elements all range() calls of one evaluation may make together
INT_MAX_BITS = 1024  # an arithmetic result (about 308 digits)

# --- a leg's output
LINE_MAX_CHARS = MiB  # one output line; the rest of a longer line is dropped, with CUT_MARKER
LOG_HEAD_BYTES = 32 * MiB  # a leg's log keeps its first LOG_HEAD_BYTES ...
LOG_TAIL_BYTES = 32 * MiB  # ... and (up to) its last LOG_TAIL_BYTES, with a marker line between
EVIDENCE_LINE_MAX_CHARS = 4096  # one line of a tail, failure lines or diagnostics in the evidence
CUT_MARKER = " [specprobe: line longer than 1 MiB, the rest of it dropped]"

# --- the run dir's files, checked for secrets after every step (engine/secrets.py TreeScrubber)
SCRUB_MIN_S = 120.0  # the pass after a step ends with the leg's timeout and grace, or this long from its start
SCRUB_SAY_S = 1.0  # a pass this long is said on the console (its time is in every step's `scrub_s`)

# --- JSON documents
JSON_MAX_DEPTH = 100  # harvested RUN_JSON, a collector's document
JSON_MAX_INT_DIGITS = 100
COLLECTOR_MAX_BYTES = 16 * MiB  # a collector's output (a command's stdout, a plugin's document)
JSON_FILE_MAX_BYTES = 64 * MiB  # the json_file collector's file
EVIDENCE_MAX_BYTES = 256 * MiB  # evidence.json read back by check/replay/diff
EVIDENCE_MAX_DEPTH = JSON_MAX_DEPTH + 20  # harvested documents sit a few levels down
REPLAY_LOG_MAX_BYTES = LOG_HEAD_BYTES + LOG_TAIL_BYTES + MiB  # a raw log `engine replay` reads


class LimitError(ValueError):
    """An input is over one of the limits above, or not what it must be (a FIFO for a file)."""


def read_regular_file(
    path: str | os.PathLike[str], max_bytes: int, what: str = "file", inside: str | os.PathLike[str] | None = None
) -> bytes:
    """The bytes of a REGULAR file of at most `max_bytes`: a FIFO would block the engine forever
    and /dev/zero never ends, so neither is opened for reading. With `inside` (a saved run's
    folder), the file must also be inside that folder once every symlink is resolved: a bundle's
    `logs/leg.log` that links to /proc/self/environ would hand the engine's environment to whatever
    it writes next. OSError for an unreadable file."""
    # O_NONBLOCK: opening a FIFO with no writer must not block before fstat can refuse it.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    target = os.fspath(path)
    if inside is not None:
        target = inside_path(path, inside, what)
        # What was resolved is opened without following a link, should one appear there meanwhile.
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(target, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LimitError(f"{path}: not a regular file ({_kind(st.st_mode)}); a {what} must be one")
        if st.st_size > max_bytes:
            raise LimitError(f"{path}: {st.st_size:,} bytes, over the {_size(max_bytes)} limit of a {what}")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:  # it grew while being read
                raise LimitError(f"{path}: over the {_size(max_bytes)} limit of a {what}")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def inside_path(path: str | os.PathLike[str], root: str | os.PathLike[str], what: str = "file") -> str:
    """`path` with every symlink resolved; LimitError when that is not inside `root` (itself
    resolved: the folder the user named may be a link)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    if not under(Path(real), Path(top)):
        raise LimitError(f"{path}: resolves to {real}, outside {root}; a {what} must be a file inside it")
    return real


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """True for a regular file (symlinks followed); never opens it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n:,} bytes"


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > JSON_MAX_INT_DIGITS:
        raise LimitError(f"an integer of {len(text.lstrip('-')):,} digits (limit {JSON_MAX_INT_DIGITS})")
    return int(text)


def json_depth(value: Any, stop_at: int = 10_000) -> int:
    """Nesting depth of a JSON-like value (a scalar is 0), without recursion; it stops looking
    past `stop_at` (a structure that contains itself is infinitely deep)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, (list, tuple)):
            depth += 1
            deepest = max(deepest, depth)
            if depth > stop_at:
                return deepest
            stack.extend((child, depth) for child in item if isinstance(child, (dict, list, tuple)))
    return deepest


class DuplicateKey(ValueError):
    """A JSON object that names one key twice: which of its values the writer meant is not for the
    engine to guess (Python's json keeps the last one, silently)."""


def _unique_keys(object_hook: Callable[[dict], Any] | None) -> Callable[[list[tuple[str, Any]]], Any]:
    def build(pairs: list[tuple[str, Any]]) -> Any:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj:
                first, again = (cut_text(json.dumps(v, default=str), 60) for v in (obj[key], value))
                raise DuplicateKey(f"duplicate key {json.dumps(key)} in one object ({first}, then {again})")
            obj[key] = value
        return obj if object_hook is None else object_hook(obj)

    return build


def loads_json(
    text: str | bytes, max_depth: int = JSON_MAX_DEPTH, object_hook: Callable[[dict], Any] | None = None
) -> Any:
    """json.loads for documents the engine did not write: ValueError (json.JSONDecodeError for bad
    syntax, DuplicateKey for an object that names a key twice, LimitError for a limit) instead of a
    RecursionError, a 5,000-digit integer or a value silently dropped."""
    try:
        value = json.loads(text, parse_int=_parse_int, object_pairs_hook=_unique_keys(object_hook))
    except RecursionError:
        raise LimitError(f"nested deeper than the interpreter can parse (limit {max_depth} levels)") from None
    depth = json_depth(value, max_depth)
    if depth > max_depth:
        raise LimitError(f"nested more than {max_depth} levels deep")
    return value


def check_json_value(value: Any, max_bytes: int, what: str) -> None:
    """A value the engine will store as JSON (a plugin collector's result): LimitError when it is
    too deep or too big, ValueError/TypeError when it is not JSON at all."""
    depth = json_depth(value, JSON_MAX_DEPTH)
    if depth > JSON_MAX_DEPTH:
        raise LimitError(f"{what} is nested more than {JSON_MAX_DEPTH} levels deep")
    size = len(json.dumps(value))
    if size > max_bytes:
        raise LimitError(f"{what} is {size:,} bytes of JSON (limit {_size(max_bytes)})")


def cut_text(text: str, limit: int = EVIDENCE_LINE_MAX_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f" [cut: {len(text) - limit:,} more characters]"


def under(path: Path, root: Path) -> bool:
    """Is `path` strictly inside `root` (both absolute and resolved)?"""
    return path != root and root in path.parents
