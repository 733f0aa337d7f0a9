"""Secrets: which names are secret, and the one way their text is kept out of anything printed or
stored (evidence, logs, the console, `engine plan`, `engine diff`). It masks what it is handed (text,
a document, the files under a directory) and holds no file or terminal of its own: a run's filter is
built from its plan (engine/spec/plan.py `masking`), and the run's record (engine/run/record.py) is
the one way out of a run, through it.

A secret is a value whose NAME looks like a credential (`hf_token`, `HF_TOKEN`, `apiKey`), in the
spec's values, the engine's environment or a step's `env`. Its text is replaced by `<redacted>`
wherever it occurs, not only where the name is.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote

from engine.secret_forms import FRAGMENT_MIN, Finders, char_spans, forms, merge, wide_forms

REDACTED = "<redacted>"
FILE_CHUNK = 1 << 20
# Inside the files legs wrote (checkpoints among them), a "secret" this short would match random
# bytes of a 1 GB safetensors file often enough to corrupt it; a real credential is far longer.
FILE_MIN_SECRET_LEN = FRAGMENT_MIN
# Shorter "secrets" (a token set to "1" in a test) would shred ordinary output if scrubbed; a real
# credential is never that short.
MIN_SECRET_LEN = 4
# A name is secret-looking when one of its `_`/`-`/camelCase parts ENDS in one of these words:
# hf_token, HF_TOKEN, apiKey, db_password are secret; tokens, tokens_consumed, keys are not.
_SECRET_PART = re.compile(r"(token|secret|key|password|passwd)$", re.IGNORECASE)


def is_secret(name: str) -> bool:
    """Names that look like credentials are never printed or stored."""
    parts = re.split(r"[_\-.]|(?<=[a-z0-9])(?=[A-Z])", name)
    return any(_SECRET_PART.search(p) for p in parts if p)


def secret_texts(values: Mapping[str, Any], secret_names: Iterable[str] = ()) -> list[str]:
    """The text of every secret in a table of values (numbers too: `--set api_key=123456` parses
    as an int, and the leg still prints its digits), and every credential in a URL any value holds
    (`--set repo=https://bob:PASS@host/x`, whatever the value is named)."""
    names = set(secret_names)
    named = [
        str(v)
        for k, v in values.items()
        if (k in names or is_secret(str(k))) and isinstance(v, (str, int, float)) and not isinstance(v, bool)
    ]
    return named + url_credentials(values)


# `scheme://` and the authority after it, up to its path, query or fragment (RFC 3986).
_AUTHORITY = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://([^/?#\s]*)")
# A user name alone (`https://<token>@github.com`) is taken for a credential from this length up; a
# shorter one is a login (`git@`, `alice@`), and masking it would shred ordinary output.
USER_TOKEN_MIN = 16


def _strings(obj: Any) -> Iterator[str]:
    """Every string in a JSON-like value, keys included."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, Mapping):
            stack += list(item.keys()) + list(item.values())
        elif isinstance(item, (list, tuple)):
            stack += list(item)


def url_credentials(obj: Any) -> list[str]:
    """The credentials in the userinfo of every URL in a value (its strings, nested ones too): a
    password (`https://bob:PASS@host`), as written and percent-decoded, and a user name alone of
    at least USER_TOKEN_MIN characters (a token)."""
    found: set[str] = set()
    for text in _strings(obj):
        if "://" not in text or "@" not in text:
            continue
        for match in _AUTHORITY.finditer(text):
            userinfo, at, _ = match.group(1).rpartition("@")
            user, colon, password = userinfo.partition(":")
            secret = password if colon else (user if len(user) >= USER_TOKEN_MIN else "")
            if at and secret:
                found |= {secret, unquote(secret)}
    return sorted(found)


class PlanSecrets(Protocol):
    values: Mapping[str, Any]
    secret_names: Iterable[str]
    steps: Iterable[Mapping[str, Any]]


class Mask(Protocol):
    """What masks a leg's output as it streams (a Scrubber): whole lines, and the head of a line
    cut at the line limit, whose end may hold the first part of a secret."""

    def scrub(self, text: str) -> str: ...

    def scrub_cut(self, text: str) -> str: ...


def _secret_set(secrets: Iterable[Any]) -> list[str]:
    """The texts long enough to be secrets, longest first."""
    return sorted({s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)


def _utf8(text: str) -> bytes:
    # surrogatepass: a lone surrogate (from a JSON `\ud800`) must not make scrubbing fail.
    return text.encode("utf-8", "surrogatepass")


def finder_for(secrets: Iterable[str], whole_min: int = MIN_SECRET_LEN) -> Finders:
    """The Finders of every form of every secret (engine/secret_forms.py)."""
    return Finders.of(_secret_set(secrets), whole_min)


class Scrubber:
    """Replaces every secret with `<redacted>` in text and in JSON-like objects: each secret in
    every form a leg may write it (JSON, repr, URL), and every piece of at least 8 bytes of one of
    those (a secret split by torchrun's tee header, a chunk or a line cut), as
    engine/secret_forms.py says. Overlapping occurrences are replaced as one span, so two secrets
    sharing characters cannot leave a piece of either behind."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = _secret_set(secrets)
        self.longest = len(self.secrets[0]) if self.secrets else 0
        texts = set().union(*(forms(s) for s in self.secrets))
        # A line cut inside a wide form (hex, base64) ends in its head too.
        texts |= {f.decode("ascii") for s in self.secrets for kind in wide_forms(s) for f in kind if f.isascii()}
        self.forms = sorted(texts, key=len, reverse=True)
        self.finder = finder_for(self.secrets)

    @classmethod
    def for_plan(cls, plan: PlanSecrets, environ: Mapping[str, str]) -> "Scrubber":
        """The secrets of a run: secret-named values, secret-named variables of `environ`
        (HF_TOKEN), secret-named entries of each step's `env`, and the credentials of every URL
        in any of these or in a step."""
        found = secret_texts(plan.values, plan.secret_names)
        found += [v for k, v in environ.items() if is_secret(k) and v]
        found += url_credentials(list(environ.values()))  # HTTPS_PROXY=http://user:PASS@proxy:3128
        for step in plan.steps:
            found += secret_texts((step.get("run") or {}).get("env") or {})
            found += url_credentials(step)  # a URL written in the spec itself
        return cls(found)

    def _replace(self, text: str, spans: list[tuple[int, int]]) -> str:
        """`text` with each (character) span replaced by REDACTED."""
        parts, last = [], 0
        for start, end in merge(spans):
            parts += [text[last:start], REDACTED]
            last = end
        parts.append(text[last:])
        return "".join(parts)

    def _char_spans(self, text: str) -> list[tuple[int, int]]:
        if text.isascii():  # searched as it is: a character is a byte
            return self.finder.ascii_text().spans(text)
        data = _utf8(text)
        spans = self.finder.spans(data)
        return char_spans(data, merge(spans)) if spans else spans

    def scrub(self, text: str) -> str:
        if not self.finder:
            return text
        spans = self._char_spans(text)
        return self._replace(text, spans) if spans else text

    def scrub_cut(self, text: str) -> str:
        """Scrub a head cut from a longer text (a line over the line limit): a secret straddling
        the cut leaves a PREFIX of itself at the end, and that prefix is redacted too, however short."""
        if not self.finder:
            return text
        spans = self._char_spans(text)
        for form in self.forms:
            for k in range(min(len(form) - 1, len(text)), 0, -1):
                if text.endswith(form[:k]):
                    spans.append((len(text) - k, len(text)))
                    break
        return self._replace(text, spans) if spans else text

    def scrub_obj(self, obj: Any) -> Any:
        """A copy with every string (keys included) scrubbed; numbers and booleans as they are."""
        if not self.secrets:
            return obj
        if isinstance(obj, str):
            return self.scrub(obj)
        if isinstance(obj, Mapping):
            return {self.scrub(str(k)): self.scrub_obj(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.scrub_obj(v) for v in obj]
        return obj


def mask(length: int) -> bytes:
    """What replaces `length` bytes of a secret inside a file: as many bytes, so the file keeps its
    size and every offset in it (a binary file stays a file of the same layout)."""
    return (REDACTED.encode() + b"*" * length)[:length] if length >= len(REDACTED) else b"*" * length


class OutOfTime(Exception):
    """The pass over the run dir reached its deadline in the middle of a file."""


class CopyFailed(OSError):
    """A file holds a secret, and its masked copy could not be written beside it (a read-only
    folder, a full disk)."""


def _extents(fd: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of the file's data: a hole (what was never written, zeros) is left out where the
    file system says where its holes are (SEEK_DATA), so a 16 GB sparse file costs its data only."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return [(0, size)] if size else []
    found, offset = [], 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, seek_data)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole is left
                break
            return [(0, size)]  # a file system without SEEK_DATA: all of it
        end = min(os.lseek(fd, start, seek_hole), size)
        if end <= start:
            break
        found.append((start, end))
        offset = end
    return found


def _blocks(fd: int, extents: list[tuple[int, int]], size: int, pad: int) -> Iterator[tuple[int, bytes, bool]]:
    """(offset, bytes, read) in file order: the data of each extent in chunks (read True), and the
    zeros of each hole within `pad` bytes of its edges (read False; a form of a secret may begin or
    end in zeros: UTF-16 holds some). A hole's middle cannot hold a form and is never read."""
    at = 0
    for start, end in extents + [(size, size)]:
        gap = start - at
        if gap > 2 * pad:
            yield from ((at, bytes(pad), False), (start - pad, bytes(pad), False)) if pad else ()
        elif gap > 0:
            yield at, bytes(gap), False
        os.lseek(fd, start, os.SEEK_SET)
        pos = start
        while pos < end:
            chunk = os.read(fd, min(FILE_CHUNK, end - pos))
            if not chunk:  # it shrank meanwhile
                return
            yield pos, chunk, True
            pos += len(chunk)
        at = max(at, end)


def _check_time(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise OutOfTime


def _search(
    fd: int, extents: list[tuple[int, int]], size: int, finder: Finders, deadline: float | None
) -> tuple[list[tuple[int, int]], bytes | None, int]:
    """Every span of a secret in the open file, the SHA-256 of its bytes (None for a file with holes:
    only a file read whole has one) and how many bytes were read: in chunks overlapping by the
    longest form (an occurrence across a chunk boundary is found whole), never whole."""
    overlap = finder.longest - 1
    spans: list[tuple[int, int]] = []
    digest = hashlib.sha256() if extents in ([(0, size)], []) else None
    tail, tail_end, read = b"", -1, 0
    for offset, chunk, from_disk in _blocks(fd, extents, size, max(overlap, 0)):
        _check_time(deadline)
        if digest is not None:
            digest.update(chunk)
        read += len(chunk) if from_disk else 0
        if offset != tail_end:  # after a hole's middle: nothing carries over
            tail = b""
        buf = tail + chunk
        base = offset - len(tail)
        spans += [(base + start, base + end) for start, end in finder.spans(buf)]
        tail, tail_end = (buf[-overlap:] if overlap > 0 else b""), offset + len(chunk)
    return merge(spans), (digest.digest() if digest is not None else None), read


def _digest(fd: int, size: int, deadline: float | None) -> bytes:
    """The SHA-256 of the open file's bytes (a file without holes)."""
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, FILE_CHUNK):
        _check_time(deadline)
        digest.update(chunk)
    return digest.digest()


def _copy_mode(out_fd: int, st: os.stat_result) -> int:
    """The mode of a file's masked copy, which is given the original's owner where the engine may
    (as root); where it may not, the copy is the engine's, and keeps no set-user-ID (set-group-ID)
    bit of another user (group): a leg's setuid file must never become the engine's."""
    mode = stat.S_IMODE(st.st_mode)
    try:
        os.fchown(out_fd, st.st_uid, st.st_gid)
    except OSError:
        pass
    mine = os.fstat(out_fd)
    if mine.st_uid != st.st_uid:
        mode &= ~stat.S_ISUID
    if mine.st_gid != st.st_gid:
        mode &= ~stat.S_ISGID
    return mode


def _replace_masked(
    path: str, fd: int, st: os.stat_result, extents: list[tuple[int, int]], spans: list[tuple[int, int]], pad: int
) -> None:
    """Write the file's bytes, masked, to a new file beside it, holes kept, and rename that over it
    (writing in place would write through a hard link into a file outside the run dir)."""
    directory, name = os.path.split(path)
    tmp_fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".masking", dir=directory or ".")
    try:
        first = 0
        for offset, data, from_disk in _blocks(fd, extents, st.st_size, pad):
            chunk = bytearray(data)
            while first < len(spans) and spans[first][1] <= offset:
                first += 1  # spans are sorted: the ones before this block are done
            at = first
            while at < len(spans) and spans[at][0] < offset + len(chunk):
                start, end = spans[at]
                lo, hi = max(start, offset), min(end, offset + len(chunk))
                chunk[lo - offset : hi - offset] = mask(end - start)[lo - start : hi - start]
                at += 1
            if from_disk or chunk != data:
                os.pwrite(tmp_fd, chunk, offset)
        os.ftruncate(tmp_fd, st.st_size)
        os.fchmod(tmp_fd, _copy_mode(tmp_fd, st))
        os.fsync(tmp_fd)
        os.close(tmp_fd)
        tmp_fd = -1
        os.replace(tmp, path)
    except BaseException:
        if tmp_fd >= 0:
            os.close(tmp_fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@dataclass
class FileCheck:
    """What one look at a file found."""

    masked: int  # spans of a secret masked in it
    digest: bytes | None  # the SHA-256 of what it holds now, when known (read whole, nothing masked)
    stat: os.stat_result | None  # the file looked at; None for what is not a regular file
    read: int  # bytes read from disk
    looked_ns: int  # the wall clock (ns) just before it was looked at


def mask_file(
    path: str | os.PathLike[str], finder: Finders, clean: bytes | None = None, deadline: float | None = None
) -> FileCheck:
    """Mask every secret `finder` finds in a regular file (a symlink is never followed) by replacing
    the file with a masked copy of the same size and holes. The decision is made on the file's
    bytes: a file whose bytes hash to `clean` (what it held when last found clean) is not searched
    again. OutOfTime past `deadline` (time.monotonic()), before anything is written."""
    # O_NOFOLLOW: a leg's symlink in the run dir must not make the engine read outside it.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(os.fspath(path), flags)
    try:
        looked = time.time_ns()
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return FileCheck(0, None, None, 0, looked)
        extents = _extents(fd, st.st_size)
        read = 0
        if clean is not None and extents in ([(0, st.st_size)], []):
            digest = _digest(fd, st.st_size, deadline)
            read = st.st_size
            if digest == clean:
                return FileCheck(0, clean, st, read, looked)
        spans, found, searched = _search(fd, extents, st.st_size, finder, deadline)
        if spans:
            try:
                _replace_masked(os.fspath(path), fd, st, extents, spans, max(finder.longest - 1, 0))
            except OSError as exc:
                raise CopyFailed(exc.errno, exc.strerror or str(exc)) from None
            found = None
        return FileCheck(len(spans), found, st, read + searched, looked)
    finally:
        os.close(fd)


# A file whose inode, size and times are what they were is not read again, unless it changed so soon
# before it was looked at that a later write could leave its times as they were (a file system's
# clock ticks coarsely: 1 s on some, 2 s on FAT).
RACY_NS = 2_000_000_000


@dataclass
class _Known:
    """A file found clean: what it was (device, inode, size, mtime, ctime) and its SHA-256."""

    signature: tuple[int, ...] | None
    digest: bytes | None
    settled: bool  # it had not changed for RACY_NS when it was looked at


def _signature(st: os.stat_result) -> tuple[int, ...]:
    # ctime cannot be set back by a leg (utime sets mtime and atime; ctime moves with every change).
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class TreeScrubber:
    """Masks secrets in every regular file under a directory (what legs wrote into the run dir:
    torchrun's per-rank logs keep the environment and the exception message), and in the names of
    its files and folders (a leg's `cache_<token>/` is renamed). A file is read when it is new or
    changed since it was found clean (its inode, size, mtime or ctime differ: ctime moves with every
    write and cannot be set back), and searched unless its bytes hash to what they were then: a
    leg can rewrite a file and put its size and mtime back, never its ctime or its SHA-256."""

    def __init__(self, root: str | os.PathLike[str], secrets: Iterable[str]) -> None:
        self.root = Path(root)
        self.finder = finder_for(secrets, FILE_MIN_SECRET_LEN)
        self.known: dict[str, _Known] = {}
        # Of the last pass: path (relative to the root) -> why it could not be checked, the names it
        # gave files and folders whose names held a secret, and what it cost.
        self.problems: dict[str, str] = {}
        self.renamed: list[str] = []
        self.seconds, self.files_read, self.bytes_read = 0.0, 0, 0

    def vouch(self, path: str | os.PathLike[str], sha256: bytes) -> None:
        """The engine wrote `path` itself, through a Scrubber: it is clean while its bytes hash
        to `sha256` (a leg that rewrites it changes that, and it is searched again)."""
        self.known[os.fspath(path)] = _Known(None, sha256, False)

    def _rel(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def scrub(self, deadline: float | None = None) -> list[str]:
        """Mask what is there now; the paths (relative to the root) of the files that held a secret.
        What could not be checked (unreadable, a folder that cannot be listed or written, or not
        reached by `deadline`, a time.monotonic()) is in `problems`."""
        self.problems, self.renamed = {}, []
        self.files_read = self.bytes_read = 0
        if not self.finder:
            return []
        started = time.monotonic()
        found: list[str] = []
        known: dict[str, _Known] = {}

        def unlisted(exc: OSError) -> None:
            self.problems[self._rel(str(exc.filename)) + "/"] = f"cannot list it: {exc.strerror or exc}"

        for dirpath, dirnames, filenames in os.walk(self.root, onerror=unlisted):  # never follows symlinks
            dirnames[:] = [self._clean_name(dirpath, name) for name in dirnames]
            for name in filenames:
                path = os.path.join(dirpath, self._clean_name(dirpath, name))
                if self._check(path, deadline, known):
                    found.append(self._rel(path))
        self.known = known
        self.seconds = time.monotonic() - started
        return found

    def _check(self, path: str, deadline: float | None, known: dict[str, _Known]) -> bool:
        """Look at one file (masking what it holds); True when it held a secret."""
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                return False
            before = self.known.get(path)
            if before is not None and before.settled and before.signature == _signature(st):
                known[path] = before
                return False
            checked = mask_file(path, self.finder, before.digest if before else None, deadline)
        except FileNotFoundError:
            return False
        except OutOfTime:
            self.problems[self._rel(path)] = "not checked: the pass over the run dir ran out of its time"
            return False
        except CopyFailed as exc:
            self.problems[self._rel(path)] = (
                f"it holds a secret, and its masked copy could not be written: {exc.strerror}"
            )
            return False
        except OSError as exc:
            self.problems[self._rel(path)] = exc.strerror or str(exc)
            return False
        self.files_read += 1
        self.bytes_read += checked.read
        if checked.stat is not None and not checked.masked:
            settled = checked.stat.st_ctime_ns + RACY_NS < checked.looked_ns
            known[path] = _Known(_signature(checked.stat), checked.digest, settled)
        return checked.masked > 0

    def _clean_name(self, directory: str, name: str) -> str:
        """`name`, or, when it holds a secret, the name the entry was renamed to (`<redacted>` for
        each piece, `-2`, `-3`, ... when taken)."""
        raw = os.fsencode(name)
        spans = merge(self.finder.spans(raw))
        if not spans:
            return name
        parts, last = [], 0
        for start, end in spans:
            parts += [raw[last:start], REDACTED.encode()]
            last = end
        base = os.fsdecode(b"".join(parts) + raw[last:])
        new, n = base, 1
        while os.path.lexists(os.path.join(directory, new)):
            n += 1
            new = f"{base}-{n}"
        try:
            os.rename(os.path.join(directory, name), os.path.join(directory, new))
        except OSError as exc:
            self.problems[self._rel(os.path.join(directory, base))] = (
                f"its name holds a secret and it could not be renamed: {exc.strerror or exc}"
            )
            return name
        self.renamed.append(self._rel(os.path.join(directory, new)))
        return new


def redact(values: Mapping[str, Any], secret_names: Iterable[str] = ()) -> dict[str, Any]:
    """A copy safe to print or store: secret names -> <redacted>, secret text inside other values too."""
    names = set(secret_names)
    scrubber = Scrubber(secret_texts(values, names))
    return {k: REDACTED if (k in names or is_secret(str(k))) else scrubber.scrub_obj(v) for k, v in values.items()}


def redact_text(text: str, values: Mapping[str, Any], secret_names: Iterable[str] = ()) -> str:
    """`text` with every secret value's text replaced by <redacted>."""
    return Scrubber(secret_texts(values, secret_names)).scrub(text)
