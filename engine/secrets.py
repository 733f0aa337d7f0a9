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

import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from engine.secret_forms import FRAGMENT_MIN, Finder, char_spans, forms, merge

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
    as an int, and the leg still prints its digits)."""
    names = set(secret_names)
    return [
        str(v)
        for k, v in values.items()
        if (k in names or is_secret(str(k))) and isinstance(v, (str, int, float)) and not isinstance(v, bool)
    ]


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


def finder_for(secrets: Iterable[str], whole_min: int = MIN_SECRET_LEN) -> Finder:
    """The Finder of every form of every secret (engine/secret_forms.py)."""
    return Finder([[_utf8(f) for f in forms(s)] for s in _secret_set(secrets)], whole_min)


class Scrubber:
    """Replaces every secret with `<redacted>` in text and in JSON-like objects: each secret in
    every form a leg may write it (JSON, repr, URL), and every piece of at least 8 bytes of one of
    those (a secret split by torchrun's tee header, a chunk or a line cut), as
    engine/secret_forms.py says. Overlapping occurrences are replaced as one span, so two secrets
    sharing characters cannot leave a piece of either behind."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = _secret_set(secrets)
        self.longest = len(self.secrets[0]) if self.secrets else 0
        by_secret = [forms(s) for s in self.secrets]
        self.forms = sorted(set().union(*by_secret), key=len, reverse=True)
        self.finder = Finder([[_utf8(f) for f in group] for group in by_secret], MIN_SECRET_LEN)

    @classmethod
    def for_plan(cls, plan: PlanSecrets, environ: Mapping[str, str]) -> "Scrubber":
        """The secrets of a run: secret-named values, secret-named variables of `environ`
        (HF_TOKEN) and secret-named entries of each step's `env`."""
        found = secret_texts(plan.values, plan.secret_names)
        found += [v for k, v in environ.items() if is_secret(k) and v]
        for step in plan.steps:
            found += secret_texts((step.get("run") or {}).get("env") or {})
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


def _digest(fd: int) -> bytes:
    """The SHA-256 of the open file's bytes from where it stands."""
    digest = hashlib.sha256()
    while chunk := os.read(fd, FILE_CHUNK):
        digest.update(chunk)
    return digest.digest()


def _file_spans(fd: int, finder: Finder) -> tuple[list[tuple[int, int]], bytes]:
    """Every span of a secret in the open file, and the SHA-256 of its bytes: read in chunks that
    overlap by the longest form (an occurrence across a chunk boundary is found whole), never whole."""
    overlap = finder.longest - 1
    spans: list[tuple[int, int]] = []
    digest = hashlib.sha256()
    offset, tail = 0, b""
    while chunk := os.read(fd, FILE_CHUNK):
        digest.update(chunk)
        buf = tail + chunk
        base = offset - len(tail)
        spans += [(base + start, base + end) for start, end in finder.spans(buf)]
        offset += len(chunk)
        tail = buf[-overlap:] if overlap > 0 else b""
    return merge(spans), digest.digest()


def _replace_masked(path: str, fd: int, mode: int, spans: list[tuple[int, int]]) -> bytes:
    """Write the file's bytes, masked, to a new file beside it and rename that over it (writing in
    place would write through a hard link into a file outside the run dir); the SHA-256 of what
    it holds now."""
    directory, name = os.path.split(path)
    tmp_fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".masking", dir=directory or ".")
    digest = hashlib.sha256()
    try:
        with os.fdopen(tmp_fd, "wb") as out:
            os.lseek(fd, 0, os.SEEK_SET)
            offset, first = 0, 0
            while chunk := bytearray(os.read(fd, FILE_CHUNK)):
                while first < len(spans) and spans[first][1] <= offset:
                    first += 1  # spans are sorted: the ones before this chunk are done
                at = first
                while at < len(spans) and spans[at][0] < offset + len(chunk):
                    start, end = spans[at]
                    lo, hi = max(start, offset), min(end, offset + len(chunk))
                    chunk[lo - offset : hi - offset] = mask(end - start)[lo - start : hi - start]
                    at += 1
                out.write(chunk)
                digest.update(chunk)
                offset += len(chunk)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return digest.digest()


def mask_file(path: str | os.PathLike[str], finder: Finder, clean: bytes | None = None) -> tuple[int, bytes | None]:
    """Mask every secret `finder` finds in a regular file (a symlink is never followed) by
    replacing the file with a masked copy of the same size: (spans masked, the SHA-256 of the file
    as it is left; None for what is not a regular file). The decision is made on the file's bytes:
    a file whose bytes hash to `clean` (what it held when last found clean) is not searched again."""
    # O_NOFOLLOW: a leg's symlink in the run dir must not make the engine read outside it.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(os.fspath(path), flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return 0, None
        if clean is not None:
            if _digest(fd) == clean:
                return 0, clean
            os.lseek(fd, 0, os.SEEK_SET)
        spans, digest = _file_spans(fd, finder)
        if spans:
            digest = _replace_masked(os.fspath(path), fd, stat.S_IMODE(st.st_mode), spans)
        return len(spans), digest
    finally:
        os.close(fd)


class TreeScrubber:
    """Masks secrets in every regular file under a directory (what legs wrote into the run dir:
    torchrun's per-rank logs keep the environment and the exception message). Every file is read
    on every call, and searched unless its bytes hash to what they were when it was last found
    clean: a leg can rewrite a file and put its size and times back, never its SHA-256."""

    def __init__(self, root: str | os.PathLike[str], secrets: Iterable[str]) -> None:
        self.root = Path(root)
        self.finder = finder_for(secrets, FILE_MIN_SECRET_LEN)
        self.clean: dict[str, bytes] = {}
        # "<path>: <why>" for each file that could not be checked (unreadable, or its folder
        # not writable for the masked copy); the caller says so.
        self.problems: list[str] = []

    def vouch(self, path: str | os.PathLike[str], sha256: bytes) -> None:
        """The engine wrote `path` itself, through a Scrubber: it is clean while its bytes hash
        to `sha256` (a leg that rewrites it changes that, and it is searched again)."""
        self.clean[os.fspath(path)] = sha256

    def scrub(self) -> list[str]:
        """Mask what is there now; the paths (relative to the root) of the files that held a
        secret. A file that cannot be checked is listed in `problems`."""
        if not self.finder:
            return []
        found = []
        for dirpath, _dirnames, filenames in os.walk(self.root):  # never follows symlinks
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    if not stat.S_ISREG(os.lstat(path).st_mode):
                        continue
                    masked, digest = mask_file(path, self.finder, self.clean.get(path))
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    self.problems.append(f"{os.path.relpath(path, self.root)}: {exc.strerror or exc}")
                    continue
                if digest is not None:
                    self.clean[path] = digest
                if masked:
                    found.append(os.path.relpath(path, self.root))
        return found


def redact(values: Mapping[str, Any], secret_names: Iterable[str] = ()) -> dict[str, Any]:
    """A copy safe to print or store: secret names -> <redacted>, secret text inside other values too."""
    names = set(secret_names)
    scrubber = Scrubber(secret_texts(values, names))
    return {k: REDACTED if (k in names or is_secret(str(k))) else scrubber.scrub_obj(v) for k, v in values.items()}


def redact_text(text: str, values: Mapping[str, Any], secret_names: Iterable[str] = ()) -> str:
    """`text` with every secret value's text replaced by <redacted>."""
    return Scrubber(secret_texts(values, secret_names)).scrub(text)
