"""How a change reads: values, field names and command lines as short phrases, shared by the
comparison (to group equal changes), the evidence review and the rendering."""
from __future__ import annotations

import difflib
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


def scalar_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, (str, int, float, bool)) for x in v)


def display_field(fname: str) -> str:
    """`run.timeout_s` -> `timeout_s`: the step's kind is already on the line."""
    for prefix in ("run.", "collect."):
        if fname.startswith(prefix):
            return fname[len(prefix):]
    return "paths" if fname == "remove" else fname


def argv_delta(old: Sequence[Any], new: Sequence[Any],
               code: Callable[[Any], str] = lambda t: f"`{t}`") -> str:
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
