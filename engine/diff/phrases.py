"""How a change reads: values, field names and expression changes as short phrases, shared by the
comparison (to group equal changes), the evidence review and the rendering."""

from __future__ import annotations

import difflib
import json
from typing import Any

from engine.diff.model import ABSENT
from engine.text import compact


def fmt(v: Any) -> str:
    """A value in a sentence: strings as they are, anything else as compact JSON."""
    if v is ABSENT or v is None:
        return "(none)"
    if isinstance(v, str):
        return v
    return compact(v, 120)


def display_field(fname: str) -> str:
    """`run.timeout_s` -> `timeout_s`: the step's kind is already on the line."""
    for prefix in ("run.", "collect."):
        if fname.startswith(prefix):
            return fname[len(prefix) :]
    return "paths" if fname == "remove" else fname


ELLIPSIS = "…"


def _pieces(text: str) -> tuple[list[str], list[Any]] | None:
    """An expression as its JMESPath tokens: each token's source text (with the space after it) and
    what it means (type and value), so `a==b` and `a == b` have the same tokens."""
    from jmespath.lexer import Lexer

    try:
        tokens = [t for t in Lexer().tokenize(text) if t["type"] != "eof"]
    except Exception:  # validate refused it already; the words will do
        return None
    # Token ends are unreliable in jmespath's lexer (a literal's is its start); the next start is not.
    starts = [t["start"] for t in tokens] + [len(text)]
    pieces = [text[starts[i] : starts[i + 1]] for i in range(len(tokens))]
    return pieces, [(t["type"], json.dumps(t["value"], sort_keys=True)) for t in tokens]


def _word_pieces(text: str) -> tuple[list[str], list[Any]]:
    split = text.split()
    return [w + " " for w in split], split


def _delta(a: tuple[list[str], list[Any]], b: tuple[list[str], list[Any]], context: int) -> str:
    (pa, ka), (pb, kb) = a, b
    out: list[str] = []
    ops = difflib.SequenceMatcher(a=ka, b=kb, autojunk=False).get_opcodes()
    if all(tag == "equal" for tag, *_ in ops):  # the same tokens, spaced otherwise: nothing to mark
        return "".join(pb).strip()
    for n, (tag, i1, i2, j1, j2) in enumerate(ops):
        if tag == "equal":
            run = pb[j1:j2]
            head = run[:context] if n > 0 else []
            tail = run[max(0, len(run) - context) :] if n < len(ops) - 1 else []
            if len(run) <= len(head) + len(tail) + 1:
                out.append("".join(run))
            else:
                gap = " " if head and tail else ""
                out.append("".join(head).rstrip() + gap + ELLIPSIS + gap + "".join(tail))
            continue
        old, new = "".join(pa[i1:i2]), "".join(pb[j1:j2])
        space = (new or old)[len((new or old).rstrip()) :]
        part = (f"[-{old.strip()}-]" if old.strip() else "") + (f"{{+{new.strip()}+}}" if new.strip() else "")
        out.append(part + space)
    return "".join(out).strip()


def expr_delta(old: str, new: str, context: int = 6) -> str:
    """The changed tokens of an expression in git's word-diff notation, `context` tokens either side:
    `…final_loss, [-`0.25`-]{+`0.5`+}) && abs(…` instead of two 500-character lines."""
    a, b = _pieces(old), _pieces(new)
    if a is None or b is None:
        return prose_delta(old, new)
    return _delta(a, b, context)


def prose_delta(old: str, new: str, context: int = 6) -> str:
    """The changed words of a sentence (a `why`), in the same notation as `expr_delta`."""
    return _delta(_word_pieces(old), _word_pieces(new), context)
