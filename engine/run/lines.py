"""Finding the few lines a rule cares about in a block of a leg's output, at C speed.

A leg may print a million lines; rules (harvest markers, echo prefixes, failure patterns, progress,
signal rules) care about a handful. A `Block` holds consecutive lines as one string, so a substring
search over it finds the candidates; only those are split out, prefix-stripped and matched.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from engine import limits

try:  # the regex parser is private; without it rules still work, only the fast path is lost
    import re._constants as _sre_constants
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - other Python versions
    _sre_constants = _sre_parse = None  # type: ignore[assignment]


class Pattern:
    """A spec's regex, matched with a time limit: a catastrophic pattern (`(a|aa)+$`) on a long
    line would otherwise hold the reader thread, and with it the engine's own timeout and signals,
    for hours. The `regex` engine releases the interpreter while it works and gives up after
    `limits.REGEX_TIMEOUT_S`; the pattern then stops matching anything for the rest of the leg and
    `error` says why, for the step to fail with it."""

    def __init__(self, text: str, where: str = "pattern") -> None:
        self.pattern = text
        self.where = where
        import regex  # imported on first use: `engine check` never needs it

        try:
            self.compiled = regex.compile(text)
        except (regex.error, ValueError, OverflowError, RecursionError) as exc:
            raise ValueError(f"{where} {text!r}: {exc}") from None
        try:
            self.plain: re.Pattern[str] | None = re.compile(text)  # for required_literal only
        except (re.error, ValueError, OverflowError, RecursionError):
            self.plain = None
        self.groupindex = self.compiled.groupindex
        self.error: str | None = None

    def _gave_up(self, line: str) -> None:
        self.error = (
            f"{self.where} {self.pattern!r} gave up after {limits.REGEX_TIMEOUT_S:g} s on a "
            f"line of {len(line):,} characters (catastrophic backtracking?); it matched "
            f"nothing after that"
        )

    def search(self, line: str) -> Any:
        if self.error is not None:
            return None
        try:
            return self.compiled.search(line, timeout=limits.REGEX_TIMEOUT_S, concurrent=True)
        except TimeoutError:
            self._gave_up(line)
            return None

    def sub(self, repl: str, line: str, count: int = 0) -> str:
        if self.error is not None:
            return line
        try:
            return self.compiled.sub(repl, line, count=count, timeout=limits.REGEX_TIMEOUT_S, concurrent=True)
        except TimeoutError:
            self._gave_up(line)
            return line


class Block:
    """Consecutive complete output lines as one string (raw, scrubbed, no final newline).

    Rules look for the few lines they care about with C-speed substring searches over `text`
    (see `find_lines`); a line is split out and prefix-stripped only when a rule needs it, so a
    leg printing a million lines costs a handful of str.find calls per chunk, not a million
    Python-level iterations.
    """

    __slots__ = ("text", "count", "first_lineno", "strip", "_lines")

    def __init__(
        self, text: str, count: int, first_lineno: int, strip: Pattern | re.Pattern[str] | None = None
    ) -> None:
        self.text = text
        self.count = count
        self.first_lineno = first_lineno  # 1-based number of the first line in the whole capture
        self.strip = strip
        self._lines: list[str] | None = None

    @classmethod
    def from_lines(cls, lines: Sequence[str], first_lineno: int = 1) -> "Block":
        """A block of lines that are already prefix-stripped."""
        block = cls("\n".join(lines), len(lines), first_lineno)
        block._lines = list(lines)
        return block

    def stripped(self, raw: str) -> str:
        return self.strip.sub("", raw, count=1) if self.strip is not None else raw

    @property
    def lines(self) -> list[str]:
        """Every line, prefix-stripped (materialised on first use only)."""
        if self._lines is None:
            raw = self.text.split("\n")
            self._lines = [self.stripped(line) for line in raw] if self.strip else raw
        return self._lines

    def tail(self, n: int) -> list[str]:
        if n <= 0:
            return []
        if self._lines is not None:
            return self._lines[-n:]
        return [self.stripped(line) for line in self.text.rsplit("\n", n)[-n:]]

    def find_lines(self, literals: Sequence[str]) -> Iterator[tuple[int, str]]:
        """(line number, stripped line) of each line whose raw text contains any of `literals`,
        in order. A superset of the lines whose STRIPPED text does: callers verify."""
        text = self.text
        starts: set[int] = set()
        for literal in literals:
            if not literal:
                continue
            pos = text.find(literal)
            while pos >= 0:
                start = text.rfind("\n", 0, pos) + 1
                starts.add(start)
                end = text.find("\n", pos)
                if end < 0:
                    break
                pos = text.find(literal, end + 1)
        index, last = 0, 0
        for start in sorted(starts):
            index += text.count("\n", last, start)
            last = start
            end = text.find("\n", start)
            yield self.first_lineno + index, self.stripped(text[start : end if end >= 0 else None])

    def find_last_line(self, literal: str) -> Iterator[tuple[int, str]]:
        """(line number, stripped line) of the lines containing `literal`, last first (the latest
        progress line is wanted). A line's number is counted from the end: only the text after it."""
        text = self.text
        pos = text.rfind(literal)
        while pos >= 0:
            start = text.rfind("\n", 0, pos) + 1
            end = text.find("\n", pos)
            after = text.count("\n", end) if end >= 0 else 0
            yield self.first_lineno + self.count - 1 - after, self.stripped(text[start : end if end >= 0 else None])
            if start == 0:
                return
            pos = text.rfind(literal, 0, start - 1)


class LineMatcher:
    """A per-line regex with the cheapest safe way of finding its lines in a Block."""

    def __init__(self, pattern: Pattern | re.Pattern[str]) -> None:
        self.pattern = pattern
        plain = pattern.plain if isinstance(pattern, Pattern) else pattern
        self.literal = required_literal(plain) if plain is not None else None

    def first(self, block: Block) -> tuple[int, str] | None:
        """The first (line number, stripped line) of the block the pattern matches."""
        search = self.pattern.search
        if self.literal is not None:
            candidates: Iterator[tuple[int, str]] | Sequence[tuple[int, str]] = block.find_lines([self.literal])
        else:
            candidates = ((block.first_lineno + i, line) for i, line in enumerate(block.lines))
        for lineno, line in candidates:
            if search(line) is not None:
                return lineno, line
        return None

    def last(self, block: Block) -> tuple[int, Any] | None:
        """(line number, match) of the last line of the block that the pattern matches."""
        search = self.pattern.search
        if self.literal is not None:
            lines: Iterator[tuple[int, str]] = block.find_last_line(self.literal)
        else:
            lines = ((block.first_lineno + i, line) for i, line in reversed(list(enumerate(block.lines))))
        for lineno, line in lines:
            found = search(line)
            if found is not None:
                return lineno, found
        return None


def required_literal(pattern: re.Pattern[str]) -> str | None:
    """The longest literal text every match of `pattern` contains, or None if there is none (or
    the regex is case-insensitive). Used only to find candidate lines fast; verified after."""
    if pattern.flags & re.IGNORECASE or _sre_parse is None:
        return None
    try:
        items = _sre_parse.parse(pattern.pattern, pattern.flags).data
    except Exception:  # an internal parser change must only cost speed, never correctness
        return None
    best, run = "", []
    for op, arg in items:
        if op is _sre_constants.LITERAL:
            run.append(chr(arg))
            continue
        if len(run) > len(best):
            best = "".join(run)
        run = []
    if len(run) > len(best):
        best = "".join(run)
    return best or None
