"""Values as text in a sentence: compact JSON cut to a length, prose by its words, a code span,
the token-level change of a command line and the fields that differ between two definitions. Pure
functions, used by every stage that words a value."""

from __future__ import annotations

import difflib
import json
import re
from typing import Any, Callable, Mapping, Sequence

VALUE_CUT = 240

# What a spec's or a leg's text must not do to the person reading it. Bidirectional controls
# (embeddings, overrides, isolates and marks) reorder what follows, so a reviewer reads other text
# than the file holds; C1 controls are invisible, or a terminal's CSI. XML, HTML and Markdown carry
# both, so every report escapes them.
_HIDING = {c: f"\\x{c:02x}" for c in range(0x80, 0xA0)}
_HIDING.update({c: f"\\u{c:04x}" for c in [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]})
# On a terminal, escape sequences also clear the screen, set the window title or write the
# clipboard, and other control bytes move the cursor.
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F]} | _HIDING


def printable(text: str) -> str:
    """`text` with every control character (newline and tab excepted) and every bidirectional
    control shown as an escape (`\\x1b`, `\\u202e`)."""
    return text.translate(_CONTROLS)


def unhidden(text: str) -> str:
    """`text` with the characters that make it read otherwise (bidirectional and C1 controls)
    shown as escapes; for XML, which cannot carry the other control characters at all."""
    return text.translate(_HIDING)


def compact(value: Any, limit: int = VALUE_CUT) -> str:
    """Compact JSON for a value, cut at ``limit`` characters."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compact_pair(old: Any, new: Any, limit: int = VALUE_CUT) -> tuple[str, str]:
    """Two values as compact JSON, each cut to ``limit`` around their first difference: cut at the
    start, two long values that differ near their end (a hash in a map of hashes) would read the same."""
    a, b = compact(old, 10**9), compact(new, 10**9)
    if len(a) <= limit and len(b) <= limit:
        return a, b
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(at - limit // 3, 0)

    def cut(text: str) -> str:
        piece = text[start : start + limit]
        return ("..." if start else "") + piece + ("..." if start + limit < len(text) else "")

    return cut(a), cut(b)


def words(text: Any) -> Any:
    """Prose compared and shown by its words: reflowing a YAML string changes nothing."""
    return " ".join(text.split()) if isinstance(text, str) else text


def code(text: str) -> str:
    """A code span that survives backticks inside (JMESPath literals are written `0.25`): fenced
    with one backtick more than the longest run inside, as Markdown wants; plain text reads it too."""
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# What Markdown (GitHub's) reads as markup inside a line: escapes, code spans, emphasis, links and
# images (`[`...`]`), table cells, strikethrough. `(`, `)` and `!` are markup only after a `]`.
_MARKUP = re.compile(r"([\\`*_\[\]|~])")


def markdown_text(text: Any) -> str:
    """`text` as plain text inside a line of Markdown, never as markup: `&`, `<` and `>` as HTML
    entities (no tag or comment reaches the page: `<img src=x>` shows as written), every character
    Markdown reads as markup backslash-escaped (no link, image, emphasis, code span or table cell
    break), line breaks as spaces. What a leg printed reaches a PR comment as text only."""
    text = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKUP.sub(r"\\\1", " ".join(text.splitlines()))


def markdown_code(text: Any) -> str:
    """`text` as a code span on one line of a Markdown table (`code`, with `|` escaped as GitHub's
    tables want even inside a span)."""
    return code(" ".join(str(text).splitlines())).replace("|", "\\|")


def scalar_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, (str, int, float, bool)) for x in v)


def argv_delta(old: Sequence[Any], new: Sequence[Any], code: Callable[[Any], str] = lambda t: f"`{t}`") -> str:
    """Token-level change of a command line: `--stop-after-steps 10` -> `--stop-after-steps 20`."""
    a, b = [str(x) for x in old], [str(x) for x in new]
    parts = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        # The flag in front of a changed argument says what the argument is.
        if tag == "replace" and i1 > 0 and a[i1 - 1].startswith("-"):
            i1, j1 = i1 - 1, j1 - 1
        if tag == "replace":
            parts.append(f"{code(' '.join(a[i1:i2]))} -> {code(' '.join(b[j1:j2]))}")
        elif tag == "delete":
            parts.append(f"removed {code(' '.join(a[i1:i2]))}")
        else:
            after = f" after {code(a[i1 - 1])}" if i1 > 0 else " at the start"
            parts.append(f"added {code(' '.join(b[j1:j2]))}{after}")
    return "; ".join(parts)


def utc_second(at: Any) -> str:
    """A stored UTC time (`2026-12-01T02:27:13.123456Z`) to the second, as reports show it; one
    that was not recorded says so."""
    if not isinstance(at, str) or not at:
        return "an unrecorded time"
    return re.sub(r"\.\d+Z$", "Z", at)


_ABSENT = "<absent>"


def flatten(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> dotted keys; lists and empty mappings are leaves."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two step definitions."""
    a, b = flatten(old), flatten(new)
    return sorted(k for k in set(a) | set(b) if a.get(k, _ABSENT) != b.get(k, _ABSENT))


def describe_change(key: str, old: Any, new: Any) -> str:
    """One changed field of a step: a command line as the tokens that moved (as `engine diff`
    shows it), anything else as its old and new values around where they differ."""
    if scalar_list(old) and scalar_list(new):
        return f"{key}: {argv_delta(old, new)}"
    a, b = compact_pair(old, new, 100)
    return f"{key}: {a} -> {b}"


def definition_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Each field that differs between two definitions, worded by `describe_change`
    (`run.argv: `hello` -> `bonjour``); a field only one side has reads as `<absent>` on the other."""
    a, b = flatten(old), flatten(new)
    return [describe_change(k, a.get(k, _ABSENT), b.get(k, _ABSENT)) for k in changed_keys(old, new)]
