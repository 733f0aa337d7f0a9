"""How a change reads: values, field names and command lines as short phrases, shared by the
comparison (to group equal changes), the evidence review and the rendering."""

from __future__ import annotations

import difflib
import json
import re
from typing import Any, Callable, Sequence

from engine.checks import compact
from engine.diff.model import ABSENT


def words(text: Any) -> Any:
    """Prose compared and shown by its words: reflowing a YAML string changes nothing."""
    return " ".join(text.split()) if isinstance(text, str) else text


def fmt(v: Any) -> str:
    """A value in a sentence: strings as they are, anything else as compact JSON."""
    if v is ABSENT or v is None:
        return "(none)"
    if isinstance(v, str):
        return v
    return compact(v, 120)


def code(text: str) -> str:
    """A code span that survives backticks inside (JMESPath literals are written `0.25`): fenced
    with one backtick more than the longest run inside, as Markdown wants; plain text reads it too."""
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def scalar_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, (str, int, float, bool)) for x in v)


def display_field(fname: str) -> str:
    """`run.timeout_s` -> `timeout_s`: the step's kind is already on the line."""
    for prefix in ("run.", "collect."):
        if fname.startswith(prefix):
            return fname[len(prefix) :]
    return "paths" if fname == "remove" else fname


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


ELLIPSIS = "…"


def _pieces(text: str) -> tuple[list[str], list[Any]] | None:
    """An expression as its JMESPath tokens: each token's source text (with the space after it) and
    what it means (type and value), so `a==b` and `a == b` have the same tokens."""
    from jmespath.lexer import Lexer

    try:
        tokens = [t for t in Lexer().tokenize(text) if t["type"] != "eof"]
    except Exception:  # noqa: BLE001 - validate refused it already; the words will do
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
