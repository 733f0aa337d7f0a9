"""How YAML reads a scalar otherwise than it is written, said in words (or "" when it reads as written).

A plain or quoted scalar written over several lines has each line break between two written lines
folded into a space: `owner/name` and `--delete-everything` on two lines become one argument. YAML
1.1 reads `010` as 8 (octal) and `12:30` as 750 (base 60). A spec's loader records this for every
value (engine/spec/load.py `Mark.misread`); validation refuses it where the value reaches a leg. What
the author spelled out stays: a block scalar (`|` keeps line breaks, `>` folds on purpose), an empty
line inside a quoted scalar (a line break, as a YAML emitter writes one), a quoted number.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import yaml

_OCTAL = re.compile(r"[-+]?0[0-7_]+")
_LINE_BREAK = re.compile(r"\r\n|[\n\r\x85\u2028\u2029]")
FOLDED = (
    "written over several lines without `|` or `>`: YAML folds each line break into a space; write it on "
    "one line, or as a block scalar (`|` keeps the line breaks, `>-` folds them on purpose)"
)


def source_lines(text: str) -> Callable[[int, int], list[str]]:
    """(first, last) -> those lines of `text` (0-based, as YAML counts lines), split once, on first use."""
    lines: list[str] = []

    def get(first: int, last: int) -> list[str]:
        if not lines:
            lines.extend(_LINE_BREAK.split(text))
        return lines[first : last + 1]

    return get


def _folds(node: yaml.ScalarNode, lines: Callable[[int, int], list[str]]) -> bool:
    """Whether a line break of the scalar's source sits between two written lines (folded into a
    space); a break next to an empty line is a line break, one after `\\` in double quotes nothing."""
    parts = lines(node.start_mark.line, node.end_mark.line)
    if len(parts) < 2:
        return False
    parts[0] = parts[0][node.start_mark.column :]
    parts[-1] = parts[-1][: node.end_mark.column]
    escaped = node.style == '"'
    return any(a.strip() and b.strip() and not (escaped and a.endswith("\\")) for a, b in zip(parts, parts[1:]))


def misread(node: yaml.Node, lines: Callable[[int, int], list[str]] | None) -> str:
    """How YAML reads this node otherwise than written, with how to write what is meant; ""."""
    if not isinstance(node, yaml.ScalarNode) or node.style not in (None, "", '"', "'"):  # libyaml: '' is plain
        return ""
    if node.end_mark.line > node.start_mark.line and lines is not None and _folds(node, lines):
        return FOLDED
    if node.style not in (None, ""):
        return ""
    if node.tag.endswith((":int", ":float")) and ":" in node.value:
        return f"YAML 1.1 reads {node.value} as a base-60 number; quote it ('{node.value}') to mean the text"
    if node.tag.endswith(":int") and _OCTAL.fullmatch(node.value):
        return f"YAML 1.1 reads {node.value} as an octal number; quote it ('{node.value}') to mean the text"
    return ""
