"""Secrets: which names are secret, and the one way their text is kept out of anything printed or
stored (evidence, logs, the console, `engine plan`, `engine diff`).

A secret is a value whose NAME looks like a credential (`hf_token`, `HF_TOKEN`, `apiKey`), in the
spec's values, the engine's environment or a step's `env`. Its text is replaced by `<redacted>`
wherever it occurs, not only where the name is.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

REDACTED = "<redacted>"
# Up to this many secrets, one C-speed `in` per secret finds them; past it, one trie-shaped regex
# does (5,000 secret values scrubbed one by one over every stored string took half a minute).
FEW_SECRETS = 16
FILE_CHUNK = 1 << 20
# Inside the files legs wrote (checkpoints among them), a "secret" this short would match random
# bytes of a 1 GB safetensors file often enough to corrupt it; a real credential is far longer.
FILE_MIN_SECRET_LEN = 8
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


def _trie_regex(words: Iterable[str]) -> re.Pattern[str]:
    """A regex matching any of `words`, shaped as their trie (one branch per character, longest
    first), wrapped in a lookahead so that overlapping occurrences are all found."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def pattern(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + pattern(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return re.compile(f"(?=({pattern(trie)}))")


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class Scrubber:
    """Replaces every literal secret text with `<redacted>` in text and in JSON-like objects.

    Every occurrence of every secret is found (overlapping ones too) and the union of their spans
    is replaced, so two secrets sharing characters cannot leave a piece of either behind."""

    def __init__(self, secrets: Iterable[str]) -> None:
        unique = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LEN}
        # Longest first, so a secret that contains another is replaced whole.
        self.secrets = sorted(unique, key=len, reverse=True)
        self.longest = len(self.secrets[0]) if self.secrets else 0
        self._many = _trie_regex(self.secrets) if len(self.secrets) > FEW_SECRETS else None

    @classmethod
    def for_plan(cls, plan: PlanSecrets, environ: Mapping[str, str]) -> "Scrubber":
        """The secrets of a run: secret-named values, secret-named variables of `environ`
        (HF_TOKEN) and secret-named entries of each step's `env`."""
        found = secret_texts(plan.values, plan.secret_names)
        found += [v for k, v in environ.items() if is_secret(k) and v]
        for step in plan.steps:
            found += secret_texts((step.get("run") or {}).get("env") or {})
        return cls(found)

    def _spans(self, text: str) -> list[tuple[int, int]]:
        spans: list[tuple[int, int]] = []
        if self._many is not None:
            for m in self._many.finditer(text):
                spans.append((m.start(), m.start() + len(m.group(1))))
            return spans
        for secret in self.secrets:
            pos = text.find(secret)
            while pos >= 0:
                spans.append((pos, pos + len(secret)))
                pos = text.find(secret, pos + 1)
        return spans

    def _replace(self, text: str, spans: list[tuple[int, int]]) -> str:
        if not spans:
            return text
        parts, last = [], 0
        for start, end in _merge(spans):
            parts += [text[last:start], REDACTED]
            last = end
        parts.append(text[last:])
        return "".join(parts)

    def scrub(self, text: str) -> str:
        if not self.secrets:
            return text
        if self._many is None and not any(secret in text for secret in self.secrets):
            return text  # the common case, at C speed
        return self._replace(text, self._spans(text))

    def scrub_cut(self, text: str) -> str:
        """Scrub a head cut from a longer text (a line over the line limit): a secret straddling
        the cut leaves a PREFIX of itself at the end, and that prefix is redacted too."""
        spans = self._spans(text) if self.secrets else []
        for secret in self.secrets:
            for k in range(min(len(secret) - 1, len(text)), 0, -1):
                if text.endswith(secret[:k]):
                    spans.append((len(text) - k, len(text)))
                    break
        return self._replace(text, spans)

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


def mask(secret: bytes) -> bytes:
    """What replaces a secret inside a file: as long as the secret, so the file keeps its size
    and every offset in it (a binary file stays a file of the same layout)."""
    n = len(secret)
    return (REDACTED.encode() + b"*" * n)[:n] if n >= len(REDACTED) else b"*" * n


def mask_file(path: str | os.PathLike[str], secrets: Iterable[bytes]) -> int:
    """Overwrite every occurrence of every secret in a regular file with `mask()`, in place;
    the number of occurrences masked. The file is read in chunks that overlap by the longest
    secret, so an occurrence across a chunk boundary is found too, and never read whole."""
    wanted = sorted({s for s in secrets if len(s) >= FILE_MIN_SECRET_LEN}, key=len, reverse=True)
    if not wanted:
        return 0
    overlap = len(wanted[0]) - 1
    hits: list[tuple[int, bytes]] = []
    # O_NOFOLLOW: a leg's symlink in the run dir must not make the engine write outside it.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(os.fspath(path), flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0
        offset, tail = 0, b""
        while True:
            chunk = os.read(fd, FILE_CHUNK)
            if not chunk:
                break
            buf = tail + chunk
            base = offset - len(tail)
            for secret in wanted:
                pos = buf.find(secret)
                while pos >= 0:
                    # An occurrence inside the overlap was already found in the previous chunk.
                    if pos + len(secret) > len(tail):
                        hits.append((base + pos, secret))
                    pos = buf.find(secret, pos + 1)
            offset += len(chunk)
            tail = buf[-overlap:] if overlap else b""
    finally:
        os.close(fd)
    if not hits:
        return 0
    fd = os.open(os.fspath(path), os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        for at, secret in hits:
            os.pwrite(fd, mask(secret), at)
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(hits)


class TreeScrubber:
    """Masks secrets in every regular file under a directory (what legs wrote into the run dir:
    torchrun's per-rank logs keep the environment and the exception message). A file unchanged
    since it was last found clean is not read again."""

    def __init__(self, root: str | os.PathLike[str], secrets: Iterable[str]) -> None:
        self.root = Path(root)
        self.secrets = [s.encode("utf-8") for s in Scrubber(secrets).secrets]
        self.clean: dict[str, tuple[int, int, int]] = {}

    def scrub(self) -> list[str]:
        """Mask what is there now; the paths (relative to the root) of the files that held a
        secret. A file that cannot be read is skipped (it cannot be shown either)."""
        if not self.secrets:
            return []
        found = []
        for dirpath, _dirnames, filenames in os.walk(self.root):  # never follows symlinks
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                key = (st.st_size, st.st_mtime_ns, st.st_ino)
                if self.clean.get(path) == key:
                    continue
                try:
                    if mask_file(path, self.secrets):
                        found.append(os.path.relpath(path, self.root))
                        st = os.lstat(path)
                        key = (st.st_size, st.st_mtime_ns, st.st_ino)
                except OSError:
                    continue
                self.clean[path] = key
        return found


def redact(values: Mapping[str, Any], secret_names: Iterable[str] = ()) -> dict[str, Any]:
    """A copy safe to print or store: secret names -> <redacted>, secret text inside other values too."""
    names = set(secret_names)
    scrubber = Scrubber(secret_texts(values, names))
    return {k: REDACTED if (k in names or is_secret(str(k))) else scrubber.scrub_obj(v) for k, v in values.items()}


def redact_text(text: str, values: Mapping[str, Any]) -> str:
    """`text` with every secret value's text replaced by <redacted>."""
    return Scrubber(secret_texts(values)).scrub(text)
