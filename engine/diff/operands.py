"""One operand of a check's comparison, seen from the spec alone: its value where the spec's values give
it, the values it reads that a change moved, and which way a change of those values moves it whatever
the run holds (`sub(loss_at_step_1, values.drop)` rises as `drop` falls).

`strictness` lines two checks up comparison by comparison; this module answers, for one operand,
what the spec's values can say about it without a run.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import jmespath

from engine.diff.model import ABSENT
from engine.diff.phrases import ELLIPSIS
from engine.expr import functions
from engine.expr.trace import trace, unparse
from engine.text import compact


def number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def num(x: Any) -> str:
    """A number as a reader wants it: `0.4`, not `0.40000000000000036`."""
    if isinstance(x, float):
        return f"{x:.6g}"
    return compact(x, 60) if not isinstance(x, str) else json.dumps(x)


def parsed(text: str) -> dict | None:
    try:
        return jmespath.compile(text).parsed
    except Exception:  # validate refused it already; nothing to line up
        return None


def short(text: str, limit: int = 48) -> str:
    """A long operand by its end, where its name is: `…harvest.run_json.gc_full_s_max])`."""
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    cut = min((i for i in (tail.find("."), tail.find("(")) if i >= 0), default=-1)
    return ELLIPSIS + (tail[cut + 1 :] if 0 <= cut < limit // 2 else tail)


def static(node: dict, values: Mapping[str, Any]) -> Any:
    """An operand's value from the spec's values alone (literals, `values.x`, arithmetic of them);
    ABSENT when it reads the run."""
    if node["type"] == "literal":
        return node["value"]
    try:
        value, missing, _ = trace(unparse(node), {"values": dict(values)}, functions.OPTIONS, explain=False)
    except Exception:  # it needs the run (a function of missing data): unknown
        return ABSENT
    return ABSENT if missing else value


def values_read(node: dict) -> set[str]:
    """The names of the spec's values an operand reads (`values.loss_drop_min` -> `loss_drop_min`)."""
    try:
        paths = functions.root_paths(functions.compile_expr(unparse(node)))
    except Exception:  # an operand that cannot be read back reads nothing we can name
        return set()
    return {p[1] for p in paths if p[0] == "values" and len(p) > 1}


def moved_values(
    node: dict, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, other: dict | None = None
) -> list[tuple[str, Any, Any]]:
    """(name, old, new) of each value the operand reads (or `other`, its counterpart on the new side)
    whose value differs between the two sides."""
    if old is None or new is None:
        return []
    names = values_read(node) | (values_read(other) if other is not None else set())
    return [
        (name, old.get(name, ABSENT), new.get(name, ABSENT))
        for name in sorted(names)
        if old.get(name, ABSENT) != new.get(name, ABSENT)
    ]


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _both(a: int | None, b: int | None) -> int | None:
    """The direction of a sum whose terms move `a` and `b`: known when they agree or one stays put."""
    if a is None or b is None:
        return None
    if a == 0 or a == b:
        return b
    return a if b == 0 else None


def rise(a: dict, b: dict, old: Mapping[str, Any], new: Mapping[str, Any], depth: int = 0) -> int | None:
    """+1 when operand `b` (with the new values) is larger than `a` (with the old) whatever the run
    holds, -1 when smaller, 0 when the same, None when that depends on the run. Followed through
    `add` and `sub`, and `mul`/`div` by a constant: enough for a bound written as arithmetic of one run
    figure and the spec's values (`sub(let.step1, values.loss_drop_min)`)."""
    if depth > 20:
        return None
    sa, sb = static(a, old), static(b, new)
    if number(sa) and number(sb):
        return _sign(sb - sa)
    if a == b and not moved_values(a, old, new):
        return 0
    kids_a, kids_b = a.get("children") or [], b.get("children") or []
    same_call = a["type"] == b["type"] == "function_expression" and a.get("value") == b.get("value")
    if not same_call or len(kids_a) != 2 or len(kids_b) != 2:
        return None
    (xa, ya), (xb, yb) = kids_a, kids_b
    dx, dy = rise(xa, xb, old, new, depth + 1), rise(ya, yb, old, new, depth + 1)
    name = a["value"]
    if name == "add":
        return _both(dx, dy)
    if name == "sub":
        return _both(dx, None if dy is None else -dy)
    # A constant factor (or divisor) keeps the other operand's direction, or turns it round.
    if name in ("mul", "div") and dy == 0 and number(c := static(yb, new)) and c != 0 and dx is not None:
        return dx * _sign(c)
    if name == "mul" and dx == 0 and number(c := static(xb, new)) and c != 0 and dy is not None:
        return dy * _sign(c)
    return None
