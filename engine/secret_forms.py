"""A secret as it gets written: its encoded FORMS and their FRAGMENTS, and finding them in bytes.

A leg rarely prints a secret only as it is. A JSON document escapes its quotes, backslashes and
non-ASCII letters (`\\"`, `\\\\`, `\\u00f6`), Python's repr() and ascii() escape them their own way
(an environment dump is a dict's repr), a URL percent-encodes them, and a JSON document may hold
any of these once more (torchrun's error file holds the traceback's text). `forms()` lists them.

And a secret can arrive in pieces. torchrun's `--tee` copies a rank's log file with readline()
while the rank is still writing it: a long line comes out as two, each with its own `[default0]:`
header, and the header can fall inside a secret (`...hf_HOST[default0]:ILE_TOKEN...`); a line cut
at the engine's line limit or a reader's chunk boundary splits one too. Neither piece is the secret.

So the rule: every piece of at least FRAGMENT_MIN (8) bytes of any form is masked wherever it
occurs, and a form shorter than that only whole. Why 8: a piece that long of a credential does not
occur in ordinary output by chance (a secret made of words costs its own 8-letter pieces, no
more), while what can stay unmasked beside a split is at most 7 bytes of the secret, on each side:
of a Hugging Face token (37 characters) at least 30 stay unknown, far beyond guessing.

Finding them is one pass of C code over the bytes in the common case: every byte that occurs in
no form is mapped to 0, and a fragment can only lie in a run of at least 8 non-zero bytes
(`bytes.translate` + `bytes.find`). Only such runs are looked at closely: each 8-byte window in
one set lookup, and a long run (a 3 MiB line of `x` when a secret holds an `x`) only around the
places where an anchor (a 4-byte piece of a form, one every 5 bytes of it) occurs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

FRAGMENT_MIN = 8
# Every 8-byte window of a form holds one of its anchors whole: a 4-byte piece every 5 bytes.
ANCHOR_LEN = FRAGMENT_MIN // 2
ANCHOR_STEP = FRAGMENT_MIN - ANCHOR_LEN + 1
# Candidate runs up to this long are checked window by window; longer ones around anchors only.
SHORT_RUN = 256
# Up to this many words, one C-speed `find` per word; past it, one trie-shaped regex.
FEW_WORDS = 16


def _json(text: str, ascii_only: bool) -> str:
    return json.dumps(text, ensure_ascii=ascii_only)[1:-1]


def _quoted_bodies(quoted: str, suffix: int) -> set[str]:
    """repr()/ascii() bodies in both of Python's quote styles: `quoted` is the repr of a text with
    `'"` appended (so it is '-quoted, with ' escaped); `suffix` is how long the escaped `\\'"` is."""
    single = quoted[quoted.index(quoted[-1]) + 1 : -1 - suffix]
    # In a "-quoted repr (a text holding ' but no "), a ' stands unescaped.
    return {single, single.replace("\\'", "'")}


def _python_forms(text: str) -> set[str]:
    """The text inside repr(), ascii() and the repr of its UTF-8 bytes, either quote style."""
    found = _quoted_bodies(repr(text + "'\""), 3)
    found |= _quoted_bodies(ascii(text + "'\""), 3)
    found |= _quoted_bodies(repr(text.encode("utf-8", "surrogatepass") + b"'\""), 3)
    return found


def forms(secret: str) -> set[str]:
    """Every way the engine or a leg may write `secret`: as it is; in JSON (`\\u00f6` or UTF-8);
    in Python's repr() and ascii() of a text or of its UTF-8 bytes; percent-encoded (URL path and
    query); and each of those once more inside JSON or a repr. A secret of letters, digits and
    `_-` has one form: itself."""
    first = {secret, _json(secret, True), _json(secret, False), quote(secret, safe=""), quote_plus(secret, safe="")}
    first |= _python_forms(secret)
    second = set()
    for form in first:
        second |= {_json(form, True), _json(form, False)} | _python_forms(form)
    return first | second


def _trie(words: Iterable[bytes]) -> re.Pattern[bytes]:
    """A regex matching any of `words` (the longest where several start at one place), shaped as
    their trie, so that thousands of words cost one branch per byte rather than one try per word."""
    trie: dict[int, Any] = {}
    for word in words:
        node = trie
        for byte in word:
            node = node.setdefault(byte, {})
        node[-1] = {}

    def pattern(node: dict[int, Any]) -> bytes:
        branches = [re.escape(bytes([b])) + pattern(child) for b, child in sorted(node.items()) if b >= 0]
        if not branches:
            return b""
        body = branches[0] if len(branches) == 1 else b"(?:" + b"|".join(branches) + b")"
        return b"(?:" + body + b")?" if -1 in node else body

    return re.compile(pattern(trie), re.DOTALL)


class _Words:
    """Every occurrence of any of a set of byte strings, overlapping ones too."""

    def __init__(self, words: Iterable[bytes]) -> None:
        self.words = sorted(set(words), key=len, reverse=True)
        self.regex = _trie(self.words) if len(self.words) > FEW_WORDS else None

    def find(self, data: bytes, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
        end = len(data) if end is None else end
        found: list[tuple[int, int]] = []
        if self.regex is not None:
            match = self.regex.search(data, start, end)
            while match:
                found.append(match.span())
                match = self.regex.search(data, match.start() + 1, end)
            return found
        for word in self.words:
            pos = data.find(word, start, end)
            while pos >= 0:
                found.append((pos, pos + len(word)))
                pos = data.find(word, pos + 1, end)
        return found


class Finder:
    """Where any form of any secret, or a fragment of at least FRAGMENT_MIN bytes of one, occurs in
    a byte string. Forms shorter than FRAGMENT_MIN are found whole, and only from `whole_min` bytes
    up (shorter ones are not treated as secrets at all)."""

    def __init__(self, forms: Iterable[bytes], whole_min: int = FRAGMENT_MIN) -> None:
        forms = {f for f in forms if len(f) >= whole_min}
        long = [f for f in forms if len(f) >= FRAGMENT_MIN]
        self.longest = max(map(len, forms), default=0)
        self.short = _Words(f for f in forms if len(f) < FRAGMENT_MIN)
        self.grams = {f[i : i + FRAGMENT_MIN] for f in long for i in range(len(f) - FRAGMENT_MIN + 1)}
        self._anchors = {f[i : i + ANCHOR_LEN] for f in long for i in range(0, len(f) - ANCHOR_LEN + 1, ANCHOR_STEP)}
        self._anchor_words: _Words | None = None  # built on the first long run
        alphabet = {b for f in long for b in f}
        self.table = bytes(1 if b in alphabet else 0 for b in range(256))
        self.run = b"\1" * FRAGMENT_MIN

    def __bool__(self) -> bool:
        return bool(self.grams or self.short.words)

    def spans(self, data: bytes) -> list[tuple[int, int]]:
        """(start, end) of every occurrence, unmerged and unsorted."""
        spans = self.short.find(data) if self.short.words else []
        if not self.grams:
            return spans
        flags = data.translate(self.table)
        start = flags.find(self.run)
        while start >= 0:
            end = flags.find(b"\0", start)
            end = len(data) if end < 0 else end
            spans += self._in_run(data, start, end)
            start = flags.find(self.run, end)
        return spans

    def _in_run(self, data: bytes, start: int, end: int) -> list[tuple[int, int]]:
        if end - start <= SHORT_RUN:
            windows: Iterable[int] = range(start, end - FRAGMENT_MIN + 1)
        else:
            windows = self._near_anchors(data, start, end)
        grams, n = self.grams, FRAGMENT_MIN
        return [(p, p + n) for p in windows if data[p : p + n] in grams]

    def _near_anchors(self, data: bytes, start: int, end: int) -> list[int]:
        """The windows of a long run that hold an anchor: a fragment's windows all do, and they are
        few where no fragment is."""
        if self._anchor_words is None:
            self._anchor_words = _Words(self._anchors)
        windows: set[int] = set()
        for at, _ in self._anchor_words.find(data, start, end):
            windows.update(range(max(start, at - (FRAGMENT_MIN - ANCHOR_LEN)), min(at, end - FRAGMENT_MIN) + 1))
        return sorted(windows)


def merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans with the overlapping and touching ones joined."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def char_spans(data: bytes, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merged byte spans of `data` (a text's UTF-8) as spans of the text's characters, each widened
    to whole characters (a fragment's edge can fall inside a multi-byte one)."""
    out: list[tuple[int, int]] = []
    byte_at = char_at = 0
    for start, end in spans:
        while start > 0 and 0x80 <= data[start] < 0xC0:
            start -= 1
        while end < len(data) and 0x80 <= data[end] < 0xC0:
            end += 1
        start = max(start, byte_at)
        char_at += len(data[byte_at:start].decode("utf-8", "surrogatepass"))
        first = char_at
        char_at += len(data[start:end].decode("utf-8", "surrogatepass"))
        byte_at = end
        if out and first <= out[-1][1]:
            out[-1] = (out[-1][0], char_at)
        else:
            out.append((first, char_at))
    return out
