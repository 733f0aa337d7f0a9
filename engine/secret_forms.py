"""A secret as it gets written: its encoded FORMS and their FRAGMENTS, and finding them in a text.

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

Some encodings spend more than one byte on each byte of the secret: hex (2), UTF-16 (2), base64
(4 per 3) and a percent-encoding of every byte (3). A piece of one of those is masked from
WIDE_FRAGMENT (11) bytes (`wide_forms`): 8 bytes of the secret in base64, 5.5 in hex or UTF-16, so
that a hash in a log (hex) or a run of 16-bit token ids (UTF-16-like bytes) does not match a piece
by chance. Base64 depends on where the secret falls in the encoded stream: each of the three
alignments has a form of its own, the characters that only the secret's bits make (in the standard
and the URL-safe alphabet).

Finding them costs a few passes of C code over the input: every byte that occurs in no form of
the pass's secrets is mapped to 0, and a fragment can only lie in a run of at least 8 non-zero
bytes (`translate` + `find`). Only such runs are looked at closely: each 8-byte window in one set
lookup, and a long run (a 3 MiB line of `x` when a secret holds an `x`) only around the anchors
(a 4-byte piece of a form, one every 5 bytes of it) made of the bytes the run holds. `Finder`
says how the passes are chosen; bench/engine_bench.py times them.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, quote_plus

FRAGMENT_MIN = 8
# Candidate runs up to this long are checked window by window; longer ones around anchors only.
SHORT_RUN = 256
# Up to this many words, one C-speed `find` per word; past it, one trie-shaped regex.
FEW_WORDS = 16
# A pass's bytes: one random 40-character token holds about 28 distinct ones.
ALPHABET_MAX = 40
MAX_PASSES = 8
# The pass over every secret's bytes gives up past this many candidate runs, plus one per 16 KiB.
DENSE_RUNS = 64
DENSE_PER = 16 << 10
# After it gave up, it rests for this many inputs (the next blocks of a leg's output are alike).
UNION_RESTS = 16


def _json(text: str, ascii_only: bool) -> str:
    return json.dumps(text, ensure_ascii=ascii_only)[1:-1]


def _quoted_bodies(quoted: str) -> set[str]:
    """repr()/ascii() bodies in both of Python's quote styles: `quoted` is the repr of a text with
    `'"` appended (so it is '-quoted, with ' escaped, and ends in the 3 characters `\\'"`)."""
    single = quoted[quoted.index(quoted[-1]) + 1 : -4]
    # In a "-quoted repr (a text holding ' but no "), a ' stands unescaped.
    return {single, single.replace("\\'", "'")}


def _python_forms(text: str) -> set[str]:
    """The text inside repr(), ascii() and the repr of its UTF-8 bytes, either quote style."""
    found = _quoted_bodies(repr(text + "'\""))
    found |= _quoted_bodies(ascii(text + "'\""))
    found |= _quoted_bodies(repr(text.encode("utf-8", "surrogatepass") + b"'\""))
    return found


def forms(secret: str) -> set[str]:
    """Every way the engine or a leg may write `secret`: as it is; in JSON (`\\u00f6` or UTF-8);
    in Python's repr() and ascii() of a text or of its UTF-8 bytes; percent-encoded (URL path and
    query, `%C3%B6` or `%c3%b6`); and each of those once more inside JSON or a repr. A secret of letters, digits and
    `_-` has one form: itself."""
    quoted = {quote(secret, safe=""), quote_plus(secret, safe="")}
    quoted |= {re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), q) for q in quoted}  # `%c3%b6` too
    first = {secret, _json(secret, True), _json(secret, False)} | quoted
    first |= _python_forms(secret)
    second = set()
    for form in first:
        second |= {_json(form, True), _json(form, False)} | _python_forms(form)
    return first | second


# The shortest piece of a wide form that is masked (see the module's text): 8 bytes of base64.
WIDE_FRAGMENT = -(-FRAGMENT_MIN * 4 // 3)


def _base64_forms(data: bytes) -> set[str]:
    """The characters of base64 that only `data`'s bits make, at each of the 3 alignments it can
    start at in an encoded stream, in the standard and the URL-safe alphabet."""
    found = set()
    for skip in range(3):
        bits_from, bits_to = 8 * skip, 8 * (skip + len(data))
        first, end = -(-bits_from // 6), bits_to // 6  # the characters wholly inside the secret's bits
        text = base64.b64encode(b"\0" * skip + data).decode("ascii")[first:end]
        if text:
            found |= {text, text.replace("+", "-").replace("/", "_")}
    return found


def wide_forms(secret: str) -> list[set[bytes]]:
    """The forms of `secret` whose characters carry less than a byte of it each, by the bytes they
    are made of (a pass each: hex digits are not base64's letters): hex (either case), UTF-16
    (either byte order), base64 at every alignment, and `%XX` of every byte."""
    data = secret.encode("utf-8", "surrogatepass")
    return [
        {data.hex().encode(), data.hex().upper().encode()},
        {secret.encode("utf-16-le", "surrogatepass"), secret.encode("utf-16-be", "surrogatepass")},
        {f.encode() for f in _base64_forms(data)},
        {"".join(f"%{b:02X}" for b in data).encode(), "".join(f"%{b:02x}" for b in data).encode()},
    ]


def _trie(words: Iterable[bytes], text: bool) -> re.Pattern[Any]:
    """A regex matching any of `words` (the longest where several start at one place), shaped as
    their trie, so that thousands of words cost one branch per byte rather than one try per word;
    a str pattern with `text` (the words are then ASCII)."""
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

    source = pattern(trie)
    return re.compile(source.decode("ascii") if text else source, re.DOTALL)


class _Words:
    """Every occurrence of any of a set of strings, overlapping ones too."""

    def __init__(self, words: Iterable[Any], text: bool) -> None:
        self.words = sorted(set(words), key=len, reverse=True)
        raw = [w.encode("ascii") if text else w for w in self.words]
        self.regex = _trie(raw, text) if len(self.words) > FEW_WORDS else None

    def find(self, data: Any, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
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


class _Pass:
    """One translate-and-find pass: the bytes (or, over ASCII text, the characters) of a group of
    forms, and their anchors."""

    def __init__(self, forms: list[Any], text: bool, fragment: int = FRAGMENT_MIN) -> None:
        self.text = text
        self.alphabet = sorted({c for f in forms for c in f})
        if text:  # str.translate of ASCII text: as fast as bytes.translate, and nothing to encode
            self.table: Any = "".join("\1" if chr(c) in self.alphabet else "\0" for c in range(128))
        else:
            self.table = bytes(1 if b in self.alphabet else 0 for b in range(256))
        # Every window of `fragment` bytes of a form holds one of its anchors whole.
        self.anchor_len = fragment // 2
        step = fragment - self.anchor_len + 1
        self.anchors = {f[i : i + self.anchor_len] for f in forms for i in range(0, len(f) - self.anchor_len + 1, step)}
        self._words: dict[frozenset[Any], _Words] = {}  # by what a run lacks: long runs repeat
        # A byte every piece of every form holds (UTF-16's zero, the `%` of `%XX`): input without it
        # holds none of them, and the pass is skipped after one C-speed `in`.
        self.needs = _needed(forms, fragment)

    def anchors_in(self, data: Any, start: int, end: int) -> _Words:
        """The anchors made only of what the run holds: in a run of one repeated byte (a long line
        of `x`) that is usually none, and nothing is searched."""
        held = _held(data[start:end])
        absent = frozenset() if held is None else frozenset(c for c in self.alphabet if c not in held)
        if absent not in self._words:
            if len(self._words) >= 8:
                self._words.clear()
            self._words[absent] = _Words((a for a in self.anchors if absent.isdisjoint(a)), self.text)
        return self._words[absent]


def _held(run: Any, most: int = 8) -> set[Any] | None:
    """The bytes (characters) a long run is made of, found by deleting one after the other, each
    at C speed; None past `most` of them (then it could hold any anchor)."""
    held: set[Any] = set()
    while run and len(held) < most:
        held.add(run[0])
        run = run.replace(run[:1], run[:0])
    return None if run else held


def _needed(forms: Iterable[Any], fragment: int) -> Any:
    """A byte (character) in every window of `fragment` of every form (in a shorter form, found
    whole, anywhere), or None: one the form holds with no stretch of `fragment` without it."""
    common: set[Any] | None = None
    for form in forms:
        if not form:
            return None
        unit = (lambda c: bytes([c])) if isinstance(form, bytes) else (lambda c: c)
        candidates = set(form[:fragment]) if common is None else common
        common = {c for c in candidates if c in form and max(map(len, form.split(unit(c)))) < fragment}
        if not common:
            return None
    return min(common) if common else None


def _passes(groups: list[list[Any]], text: bool, fragment: int) -> list[_Pass]:
    """The narrow passes: secrets whose bytes fit in ALPHABET_MAX together share one, unless one
    of them needs a byte the other lacks (`_Pass.needs`); past MAX_PASSES, the last pass takes the rest."""
    groups = [g for g in groups if g]
    needs = {id(g): _needed(g, fragment) for g in groups}
    groups.sort(key=lambda g: (str(needs[id(g)]), sorted({c for f in g for c in f})))
    merged: list[list[Any]] = []
    alphabets: list[set[Any]] = []
    needed: list[Any] = []
    for group in groups:
        alphabet = {c for f in group for c in f}
        alike = bool(merged) and needs[id(group)] == needed[-1]
        if merged and ((alike and len(alphabets[-1] | alphabet) <= ALPHABET_MAX) or len(merged) == MAX_PASSES):
            merged[-1] += group
            alphabets[-1] |= alphabet
        else:
            merged.append(list(group))
            alphabets.append(alphabet)
            needed.append(needs[id(group)])
    return [_Pass(group, text, fragment) for group in merged]


def _ascii_pieces(form: bytes, fragment: int) -> list[bytes]:
    """What of a form can occur in ASCII text: all of it, or its ASCII stretches long enough to
    hold a fragment (a shorter stretch is no form of its own, to be found whole)."""
    if form.isascii():
        return [form]
    return [piece for piece in re.split(rb"[\x80-\xff]+", form) if len(piece) >= fragment]


class Finder:
    """Where any form of any secret, or a fragment of at least `fragment` (FRAGMENT_MIN) bytes of
    one, occurs in a byte string (or, from `ascii_text()`, in a str of ASCII). `groups` holds each
    secret's forms. Forms shorter than `fragment` are found whole, and only from `whole_min` bytes
    up (shorter ones are not treated as secrets at all).

    One pass over the bytes of every form is tried first: in binary data (a checkpoint) runs of 8
    such bytes are rare, and one pass is all it costs. In text, where the letters and digits of a
    few secrets make every longer word a candidate, it gives up after a few candidates per 16 KiB
    and the narrow passes (one per secret, or per group of secrets with few bytes between them)
    take over, each finding few candidates, and the next inputs go to them straight."""

    def __init__(
        self,
        groups: Iterable[Iterable[bytes]],
        whole_min: int = FRAGMENT_MIN,
        text: bool = False,
        fragment: int = FRAGMENT_MIN,
    ) -> None:
        kept = [[f for f in set(group) if len(f) >= whole_min] for group in groups]
        self.groups, self.whole_min, self.fragment = kept, whole_min, fragment
        convert: Callable[[bytes], Any] = (lambda f: f.decode("ascii")) if text else (lambda f: f)
        forms = {f for group in kept for f in group}
        self.longest = max(map(len, forms), default=0)
        n = fragment
        self.short = _Words((convert(f) for f in forms if len(f) < n), text)
        long = [[convert(f) for f in group if len(f) >= n] for group in kept]
        self.grams = {f[i : i + n] for group in long for f in group for i in range(len(f) - n + 1)}
        self.passes = _passes(long, text, n)
        self.union = _Pass([f for group in long for f in group], text, n) if len(self.passes) > 1 else None
        self._union_rests = 0  # inputs left before the pass over all bytes is tried again
        self.run, self.zero = ("\1" * n, "\0") if text else (b"\1" * n, b"\0")
        self._ascii: Finder | None = None

    def __bool__(self) -> bool:
        return bool(self.grams or self.short.words)

    def ascii_text(self) -> "Finder":
        """The same finder for a str of ASCII: what of each form ASCII can hold."""
        if self._ascii is None:
            groups = [[p for f in group for p in _ascii_pieces(f, self.fragment)] for group in self.groups]
            self._ascii = Finder(groups, self.whole_min, text=True, fragment=self.fragment)
        return self._ascii

    def spans(self, data: Any) -> list[tuple[int, int]]:
        """(start, end) of every occurrence, unmerged and unsorted."""
        spans = self.short.find(data) if self.short.words else []
        if self.union is not None and self._union_rests == 0:
            found = self._scan(data, self.union, DENSE_RUNS + len(data) // DENSE_PER)
            if found is not None:
                return spans + found
            # Text stays text: the next inputs go straight to the narrow passes.
            self._union_rests = UNION_RESTS
        elif self._union_rests:
            self._union_rests -= 1
        for one in self.passes:
            if one.needs is None or one.needs in data:
                spans += self._scan(data, one) or []
        return spans

    def _scan(self, data: Any, one: _Pass, most: int | None = None) -> list[tuple[int, int]] | None:
        """The spans in the runs of the pass's bytes; None past `most` runs (too dense to pay off)."""
        found: list[tuple[int, int]] = []
        flags = data.translate(one.table)
        start = flags.find(self.run)
        while start >= 0:
            if most is not None:
                most -= 1
                if most < 0:
                    return None
            end = flags.find(self.zero, start)
            end = len(data) if end < 0 else end
            n = self.fragment
            if end - start <= SHORT_RUN:
                windows: Iterable[int] = range(start, end - n + 1)
            else:
                windows = self._near_anchors(data, start, end, one)
            found += [(p, p + n) for p in windows if data[p : p + n] in self.grams]
            start = flags.find(self.run, end)
        return found

    def _near_anchors(self, data: Any, start: int, end: int, one: _Pass) -> list[int]:
        """The windows of a long run that hold an anchor of the pass's forms: a fragment's windows
        all do, and they are few where no fragment is."""
        windows: set[int] = set()
        n = self.fragment
        for at, _ in one.anchors_in(data, start, end).find(data, start, end):
            windows.update(range(max(start, at - (n - one.anchor_len)), min(at, end - n) + 1))
        return sorted(windows)


class Finders:
    """Finders as one: a secret's plain forms, whose 8-byte pieces are masked, and its wide forms,
    whose pieces must be longer (`wide_forms`), each in a Finder of its fragment length."""

    def __init__(self, finders: Iterable[Finder]) -> None:
        self.finders = [f for f in finders if f]
        self.longest = max((f.longest for f in self.finders), default=0)
        self._ascii: Finders | None = None

    @classmethod
    def of(cls, secrets: Iterable[str], whole_min: int) -> "Finders":
        """Every form of every secret: the wide ones of a secret of at least FRAGMENT_MIN characters
        (a shorter one's hex would be a few digits, found in every hash)."""
        secrets = list(secrets)
        plain = [[f.encode("utf-8", "surrogatepass") for f in forms(s)] for s in secrets]
        # One group per kind of every secret (the hex of all of them is one alphabet, one pass).
        kinds: list[list[bytes]] = [[], [], [], []]
        for secret in (s for s in secrets if len(s) >= FRAGMENT_MIN):
            for kind, found in zip(kinds, wide_forms(secret)):
                kind += sorted(found)
        return cls([Finder(plain, whole_min), Finder(kinds, whole_min, fragment=WIDE_FRAGMENT)])

    def __bool__(self) -> bool:
        return bool(self.finders)

    def ascii_text(self) -> "Finders":
        """The same finders for a str of ASCII."""
        if self._ascii is None:
            self._ascii = Finders(f.ascii_text() for f in self.finders)
        return self._ascii

    def spans(self, data: Any) -> list[tuple[int, int]]:
        """(start, end) of every occurrence, unmerged and unsorted."""
        found: list[tuple[int, int]] = []
        for finder in self.finders:
            found += finder.spans(data)
        return found


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
