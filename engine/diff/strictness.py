"""Whether a changed check asks more or less of a run: tightened, loosened, unchanged, or cannot tell.

The two expressions are lined up comparison by comparison (they must have the same shape around
their comparisons). In each comparison the operand that did not move is what the run measured and
the one that moved is the bound: raising an upper bound (`x <= 13.6` -> `x <= 20`) or lowering a
lower one loosens the check, under `!` the other way round. The bounds' numbers come from a saved
run (the tracer's explain pairs of each side's evaluation) or, without one, from the spec's values.
On a saved run the outcomes come first: a run the old check passes and the new one fails shows the
new check is tighter there, whatever the expressions look like.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Mapping, Sequence

from engine.diff.model import ABSENT
from engine.diff.operands import moved_values, num, rise
from engine.diff.operands import number as _number
from engine.diff.operands import parsed as _parsed
from engine.diff.operands import short as _short
from engine.diff.operands import static as _static
from engine.expr import functions
from engine.expr.trace import MISSING, NOT_EVALUATED, unparse
from engine.text import code, compact
from engine.types import CheckResult

TIGHTENED, LOOSENED, UNCHANGED, UNKNOWN = "tightened", "loosened", "unchanged", "cannot tell"
RUN, NUMBERS, SPEC = "run", "numbers", "spec"
RETARGET = "an equality asks for another value: neither looser nor tighter"
SYMBOL = {"eq": "==", "ne": "!=", "lt": "<", "gt": ">", "lte": "<=", "gte": ">="}
_FLIP = {"lt": "gt", "lte": "gte", "gt": "lt", "gte": "lte", "eq": "eq", "ne": "ne"}
_UPPER, _LOWER = ("lt", "lte"), ("gt", "gte")  # `measured OP bound`: the bound caps / floors it
# Outcomes that do not fail a verdict: a check that moves a run from these to a failing one asks more.
_NOT_FAILING = ("PASS", "SKIPPED", "DISABLED")


@dataclass
class Operand:
    text: str
    value: str  # as a number reads ("" when not known)
    known: bool


@dataclass
class Bound:
    """One comparison of a check, with its operands' values where known."""

    text: str  # the comparison as written
    op: str  # lt lte gt gte eq ne
    left: Any = ABSENT
    right: Any = ABSENT
    left_text: str = ""
    right_text: str = ""

    def margin(self) -> float | None:
        """How far the measured value is inside the bound (negative: outside); comparisons of order only."""
        a, b = self.left, self.right
        if not (_number(a) and _number(b)):
            return None
        if self.op in _UPPER:
            return b - a
        if self.op in _LOWER:
            return a - b
        return None

    def operand(self, index: int | None) -> Operand:
        """One side of the comparison (0 left, 1 right): its text and, where known, its value."""
        value = self.left if index == 0 else self.right if index == 1 else ABSENT
        text = self.left_text if index == 0 else self.right_text if index == 1 else self.text
        return Operand(_short(text), num(value) if value is not ABSENT else "", value is not ABSENT)

    def phrase(self) -> str:
        """`13.2 <= 13.6`, each operand as its value where known, else as written."""
        left = num(self.left) if self.left is not ABSENT else _short(self.left_text)
        right = num(self.right) if self.right is not ABSENT else _short(self.right_text)
        return f"{left} {SYMBOL[self.op]} {right}"


@dataclass
class Move:
    """One comparison, old against new, and which way its bound moved."""

    old: Bound
    new: Bound
    direction: str  # TIGHTENED | LOOSENED | UNCHANGED | UNKNOWN
    why: str = ""  # for UNKNOWN: why the direction is not known
    retarget: bool = False  # UNKNOWN because an equality now asks for another value (not looser, not tighter)
    # (name, old, new) of each spec value the moved operand reads that changed: what moved the bound,
    # said in the spec's own terms where no run gives the bound's numbers.
    values: list[tuple[str, Any, Any]] = dc_field(default_factory=list)
    bound: int | None = None  # which operand moved (0 left, 1 right), where one did


@dataclass
class Shift:
    """What a changed check asks of a run, old against new (on a saved run when the outcomes are set)."""

    verdict: str  # TIGHTENED | LOOSENED | UNCHANGED | UNKNOWN
    why: str  # what made it so, in a phrase
    moves: list[Move] = dc_field(default_factory=list)
    old_outcome: str | None = None
    new_outcome: str | None = None
    # UNKNOWN only because equalities ask for other values now (`final_step == 120` -> `== 150`): a
    # different requirement, not a weaker one; anything else unknown may hide a loosening.
    retarget: bool = False
    # What the verdict rests on: RUN (a saved run both checks describe: its outcomes decide), NUMBERS
    # (operand values from a saved run of other legs: they place the bounds, the outcomes decide
    # nothing and are not kept), SPEC (the spec's values alone).
    basis: str = "spec"
    # What read the run before and now reads nothing of it, each in a phrase (`loss` is now the
    # literal 1.0): a gate that compares a constant passes or fails every run alike.
    pins: list[str] = dc_field(default_factory=list)

    @property
    def on_run(self) -> bool:
        return self.basis == RUN


# ---------------------------------------------------------------- lining the expressions up


def _pairs(a: dict, b: dict, polarity: int = 1) -> list[tuple[dict, dict, int]] | None:
    """Every comparison of `a` against its counterpart in `b`, with its polarity (1 as written, -1 under
    `!`, 0 inside anything else: a function, a projection, a pipe); None when the shapes differ
    anywhere outside a comparison."""
    if a["type"] == "comparator" and b["type"] == "comparator":
        return [(a, b, polarity)]
    kids_a, kids_b = a.get("children", []), b.get("children", [])
    if a["type"] != b["type"] or a.get("value") != b.get("value") or len(kids_a) != len(kids_b):
        return None
    inner = {"and_expression": polarity, "or_expression": polarity, "not_expression": -polarity}
    kid_polarity = inner.get(a["type"], 0)
    out: list[tuple[dict, dict, int]] = []
    for ka, kb in zip(kids_a, kids_b):
        if isinstance(ka, dict) and isinstance(kb, dict):
            sub = _pairs(ka, kb, kid_polarity)
            if sub is None:
                return None
            out += sub
        elif ka != kb:  # slice bounds and the like
            return None
    return out


def _terms(node: dict, kind: str) -> list[str]:
    """The operands of a chain of `&&` (or `||`) as canonical JSON, for comparing as multisets."""
    if node["type"] == kind:
        return [t for kid in node["children"] for t in _terms(kid, kind)]
    return [json.dumps(node, sort_keys=True)]


def _text_of(term: str) -> str:
    return unparse(json.loads(term))


def _by_terms(a: dict, b: dict) -> Shift | None:
    """A condition added to or dropped from a chain of `&&` / `||`: the one change of shape whose
    direction is certain (`a && b` asks more than `a`; `a || b` less)."""
    for kind, more in (("and_expression", TIGHTENED), ("or_expression", LOOSENED)):
        ta, tb = Counter(_terms(a, kind)), Counter(_terms(b, kind))
        if len(ta) + len(tb) <= 2 or ta == tb:
            continue
        less = LOOSENED if more == TIGHTENED else TIGHTENED
        word = "condition" if kind == "and_expression" else "alternative"
        if not ta - tb:
            added = ", ".join(code(_text_of(t)) for t in (tb - ta).elements())
            return Shift(more, f"adds the {word} {added}")
        if not tb - ta:
            dropped = ", ".join(code(_text_of(t)) for t in (ta - tb).elements())
            return Shift(less, f"drops the {word} {dropped}")
    return None


# ---------------------------------------------------------------- operand values


def explained(result: CheckResult | None) -> dict[str, Any]:
    """Sub-expression text -> its value, from a result's explain pairs (values cut short are left out)."""
    out: dict[str, Any] = {}
    for text, shown in (result or {}).get("explain") or []:
        if shown in (MISSING, NOT_EVALUATED):
            continue
        try:
            out[text] = json.loads(shown)
        except (TypeError, ValueError):
            continue
    return out


# ---------------------------------------------------------------- named sub-expressions written out


def _let_name(node: dict) -> str | None:
    """`x` for a `let.x` chain head (`let.x.y` too), else None."""
    kids = node.get("children") or []
    if (
        node["type"] == "subexpression"
        and len(kids) >= 2
        and kids[0].get("type") == "field"
        and kids[0].get("value") == "let"
        and kids[1].get("type") == "field"
    ):
        return kids[1]["value"]
    return None


def expand(node: dict, lets: Mapping[str, str], depth: int = 0) -> dict:
    """The expression with every `let.<name>` replaced by what it names, recursively: a check and its
    rewrite through `let:` then have the same tree, and bounds moved inside a let line up."""
    if not lets or depth > 20:  # validate refuses cycles; the depth only keeps a bad spec finite
        return node
    name = _let_name(node)
    if name is not None and name in lets:
        body = _parsed(lets[name])
        if body is None:
            return node
        body = expand(body, lets, depth + 1)
        rest = [expand(k, lets, depth) for k in node["children"][2:]]
        if not rest:
            return body
        # `a.b` is one subexpression of [a, b]: `let.x.c` with x = `a.b` must become [a, b, c] too.
        head = body["children"] if body["type"] == "subexpression" else [body]
        return {"type": "subexpression", "children": head + rest}
    kids = node.get("children")
    if not kids:
        return node
    return {**node, "children": [expand(k, lets, depth) if isinstance(k, dict) else k for k in kids]}


def _expanded_values(result: CheckResult | None, written: dict | None, lets: Mapping[str, str]) -> dict[str, Any]:
    """`explained`, keyed also by each operand's text with its lets written out (what `expand` gives)."""
    run = explained(result)
    if not lets or written is None:
        return run
    out = dict(run)
    for name, text in lets.items():
        body = _parsed(text)
        if body is not None and f"let.{name}" in run:
            out[unparse(expand(body, lets))] = run[f"let.{name}"]
    stack = [written]
    while stack:  # every sub-expression the explain pairs may name
        node = stack.pop()
        text = unparse(node)
        if text in run:
            out.setdefault(unparse(expand(node, lets)), run[text])
        stack += [k for k in node.get("children") or [] if isinstance(k, dict)]
    return out


# ---------------------------------------------------------------- operand values


def _value(node: dict, run: Mapping[str, Any], values: Mapping[str, Any] | None) -> Any:
    if node["type"] == "literal":
        return node["value"]
    text = unparse(node)
    if text in run:
        return run[text]
    return _static(node, values) if values is not None else ABSENT


# ---------------------------------------------------------------- one comparison


def _direction(op: str, b0: Any, b1: Any, op1: str, t0: str, t1: str, rises: int | None = None) -> tuple[str, str]:
    """Which way `measured OP b0` -> `measured OP1 b1` moved (one family of comparison, the bound moved).
    `rises`: which way the bound moves whatever the run holds (operands.rise), for a bound that reads
    the run and so has no value without one."""
    if op in ("eq", "ne"):
        if b0 is not ABSENT and b0 == b1 and op == op1:
            return UNCHANGED, ""
        return UNKNOWN, RETARGET
    if not (_number(b0) and _number(b1)) and rises is None:
        if b0 is ABSENT or b1 is ABSENT:
            return UNKNOWN, f"{code(_short(t0))} -> {code(_short(t1))} reads the run, and no saved run gives its value"
        return UNKNOWN, f"{code(_short(t0))} -> {code(_short(t1))}: not a number"
    upper = op in _UPPER
    same = rises == 0 if rises is not None else b0 == b1
    if same:
        if op == op1:
            return UNCHANGED, ""
        return (LOOSENED if op1 in ("lte", "gte") else TIGHTENED), ""
    raised = rises > 0 if rises is not None else b1 > b0
    return (LOOSENED if raised == upper else TIGHTENED), ""


def _mask(node: dict) -> Any:
    """An operand with its literals and `values.*` reads blanked alike: two operands with the same mask
    differ only in numbers a spec sets (`mul(x, `0.25`)` -> `mul(x, values.k)`), which is a bound that
    moved; the spec's values then say how far."""
    kids = node.get("children") or []
    is_value = node["type"] == "subexpression" and kids and kids[0].get("type") == "field"
    if node["type"] == "literal" or (is_value and kids[0].get("value") == "values"):
        return "constant"
    return [node["type"], node.get("value"), [_mask(k) if isinstance(k, dict) else k for k in kids]]


def _move(
    a: dict,
    b: dict,
    polarity: int,
    run_a: Mapping[str, Any],
    run_b: Mapping[str, Any],
    values_a: Mapping[str, Any] | None,
    values_b: Mapping[str, Any] | None,
) -> Move | None:
    """One comparison old -> new; None when nothing about it changed."""
    (la, ra), (lb, rb) = a["children"], b["children"]
    texts_a, texts_b = (unparse(la), unparse(ra)), (unparse(lb), unparse(rb))
    vals_a = (_value(la, run_a, values_a), _value(ra, run_a, values_a))
    vals_b = (_value(lb, run_b, values_b), _value(rb, run_b, values_b))
    old = Bound(unparse(a), a["value"], *vals_a, *texts_a)
    new = Bound(unparse(b), b["value"], *vals_b, *texts_b)

    def fixed(i: int, j: int) -> bool:
        va, vb = vals_a[i], vals_b[j]
        if va is ABSENT or vb is ABSENT:  # no value to compare: the same text reading the same values
            same_values = not moved_values(a["children"][i], values_a, values_b)
        else:
            same_values = va == vb
        return texts_a[i] == texts_b[j] and same_values

    op_a, op_b = a["value"], b["value"]
    same_operands = fixed(0, 0) and fixed(1, 1)
    if same_operands:
        if op_a == op_b:
            return None
        measured, bound = 0, 1
    elif fixed(0, 1) and fixed(1, 0):  # `a < b` -> `b > a`: the same comparison written the other way
        if _FLIP[op_b] == op_a:
            return None
        return Move(old, new, UNKNOWN, "its operands swapped sides and its comparison changed")
    elif fixed(0, 0):
        measured, bound = 0, 1
    elif fixed(1, 1):
        measured, bound = 1, 0
    else:
        return Move(old, new, UNKNOWN, f"both sides of {code(old.text)} changed")
    if not same_operands and _mask(a["children"][bound]) != _mask(b["children"][bound]):
        # More moved than a number: the side that moved compares something else now.
        return Move(
            old, new, UNKNOWN, f"what it compares with changed ({code(texts_a[bound])} -> {code(texts_b[bound])})"
        )
    if measured == 1:  # write it as `measured OP bound`
        op_a, op_b = _FLIP[op_a], _FLIP[op_b]
    family = {op: f for f in (_UPPER, _LOWER, ("eq",), ("ne",)) for op in f}
    if family[op_a] != family[op_b]:
        return Move(
            old, new, UNKNOWN, f"the comparison changed ({code(SYMBOL[a['value']])} -> {code(SYMBOL[b['value']])})"
        )
    if same_operands:  # only the comparison moved: `<` -> `<=` lets the bound itself pass
        if op_a in ("eq", "ne"):
            direction, why = UNKNOWN, f"{code(SYMBOL[a['value']])} -> {code(SYMBOL[b['value']])}"
        else:
            direction, why = (LOOSENED if op_b in ("lte", "gte") else TIGHTENED), ""
    else:
        node_a, node_b = a["children"][bound], b["children"][bound]
        known = _number(vals_a[bound]) and _number(vals_b[bound])
        rises = None if known or values_a is None or values_b is None else rise(node_a, node_b, values_a, values_b)
        direction, why = _direction(op_a, vals_a[bound], vals_b[bound], op_b, texts_a[bound], texts_b[bound], rises)
        moved = moved_values(node_a, values_a, values_b, node_b)
        if why == RETARGET:
            return Move(old, new, UNKNOWN, why, retarget=True, values=moved, bound=bound)
        done = _polarised(old, new, direction, why, polarity, moved)
        done.bound = bound
        return done
    return _polarised(old, new, direction, why, polarity)


def _polarised(old: Bound, new: Bound, direction: str, why: str, polarity: int, moved: list | None = None) -> Move:
    """The comparison's move as its check sees it: reversed under a `!` (polarity -1), unknown inside a
    function, a projection or a pipe (0)."""
    if direction in (TIGHTENED, LOOSENED) and polarity != 1:
        if polarity == 0:
            return Move(
                old,
                new,
                UNKNOWN,
                f"{code(new.text)} sits inside a function or projection, where its direction is not known",
                values=moved or [],
            )
        direction = LOOSENED if direction == TIGHTENED else TIGHTENED
    return Move(old, new, direction, why, values=moved or [])


# ---------------------------------------------------------------- a whole check


def reads(check: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Evidence paths a check's expr, when and lets read from the root (`values.x`, `steps.leg1...`)."""
    texts = [check.get("expr"), check.get("when"), *(check.get("let") or {}).values()]
    out: list[tuple[str, ...]] = []
    for text in texts:
        if isinstance(text, str):
            try:
                out += functions.root_paths(functions.compile_expr(text))
            except Exception:  # validate already refused bad expressions
                pass
    return out


def _same_expr(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    ta, tb = _parsed(a), _parsed(b)
    return ta == tb if ta is not None and tb is not None else a == b


def _when(old: Any, new: Any) -> tuple[str, str] | None:
    """A `when` added, dropped or changed: a check that is skipped on more runs asks less."""
    if _same_expr(old, new):
        return None
    if old is None:
        return LOOSENED, f"it is now skipped unless {code(new)}"
    if new is None:
        return TIGHTENED, f"it is no longer skipped when {code(old)} is not true"
    return UNKNOWN, f"its `when` changed ({code(old)} -> {code(new)})"


def _merge(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
    """Two parts of one change (its expr, its when) as one verdict; a known loosening stays one."""
    (va, wa), (vb, wb) = a, b
    if va == UNCHANGED or va == vb:
        return (vb, wb) if va == UNCHANGED else (va, f"{wa}; {wb}")
    if vb == UNCHANGED:
        return a
    if {va, vb} == {LOOSENED, TIGHTENED}:
        return UNKNOWN, f"{wa}, but {wb}"
    return (LOOSENED, f"{wa}; {wb}") if LOOSENED in (va, vb) else (UNKNOWN, f"{wa}; {wb}")


def _combine(moves: Sequence[Move]) -> tuple[str, str]:
    dirs = [m.direction for m in moves]
    loose = [m for m in moves if m.direction == LOOSENED]
    tight = [m for m in moves if m.direction == TIGHTENED]
    unknown = [m for m in moves if m.direction == UNKNOWN]
    if not moves or all(d == UNCHANGED for d in dirs):
        return UNCHANGED, "the same comparisons with the same bounds"
    if loose and tight:
        return UNKNOWN, f"it loosens {_bound_move(loose[0])} and tightens {_bound_move(tight[0])}"
    if loose:  # a loosened bound is a loosening whatever else is unknown
        return LOOSENED, "; ".join(_bound_move(m) for m in loose)
    if unknown:
        return UNKNOWN, unknown[0].why
    return TIGHTENED, "; ".join(_bound_move(m) for m in tight)


def _bound_move(m: Move) -> str:
    """`13.2 <= 13.6 -> 13.2 <= 20`: the comparison before and after, with values where known."""
    return f"{m.old.phrase()} -> {m.new.phrase()}"


def _by_outcomes(old: str, new: str) -> tuple[str, str] | None:
    """The verdict a run's two outcomes settle on their own."""
    if old == new:
        return None
    if old in _NOT_FAILING and new not in _NOT_FAILING:
        return TIGHTENED, f"this run passes the old check ({old}) and not the new one ({new})"
    if old not in _NOT_FAILING and new in _NOT_FAILING:
        return LOOSENED, f"this run fails the old check ({old}) and not the new one ({new})"
    if old == "PASS":  # PASS -> SKIPPED / DISABLED: the new check no longer asks this run anything
        return LOOSENED, f"the new check is {new} on this run, which the old one checked"
    if new == "PASS":
        return TIGHTENED, f"the new check checks this run, which the old one left {old}"
    return None


def shift(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    old_values: Mapping[str, Any] | None,
    new_values: Mapping[str, Any] | None,
    old_result: CheckResult | None = None,
    new_result: CheckResult | None = None,
    settle: bool = True,
) -> Shift:
    """Old check -> new check (their `expr`), with each side's values; with both results (the two
    evaluated on one saved run), the verdict on that run. `settle=False` when the run is not of the
    legs both checks read (they changed, in the change or since the run): its numbers still place
    the bounds, but how the old check fares on it says nothing of the new one."""
    on_run = old_result is not None and new_result is not None
    outcomes = (old_result["outcome"], new_result["outcome"]) if on_run else (None, None)
    lets_a, lets_b = old.get("let") or {}, new.get("let") or {}
    written_a, written_b = _parsed(old["expr"]), _parsed(new["expr"])
    moves: list[Move] = []
    if written_a is None or written_b is None:
        verdict, why = UNKNOWN, "an expression does not parse"
    else:
        # Compared with every `let.x` written out: a check rewritten through `let:` is the same check.
        a, b = expand(written_a, lets_a), expand(written_b, lets_b)
        run_a = _expanded_values(old_result, written_a, lets_a)
        run_b = _expanded_values(new_result, written_b, lets_b)
        pairs = _pairs(a, b)
        if pairs is None:
            by_terms = _by_terms(a, b)
            verdict, why = (
                (by_terms.verdict, by_terms.why)
                if by_terms
                else (UNKNOWN, "the expression changed shape, not only its bounds")
            )
        else:
            moves = [
                m for m in (_move(x, y, p, run_a, run_b, old_values, new_values) for x, y, p in pairs) if m is not None
            ]
            verdict, why = _combine(moves)
            if verdict == UNCHANGED and a != b:
                # Same comparisons, same bounds, but something else moved (a path, a function).
                verdict, why = UNKNOWN, "the expression changed outside its comparisons' bounds"
            elif verdict == UNCHANGED and (lets_a != lets_b or written_a != written_b):
                why = "the same expression once its `let:` names are written out"
    retarget = verdict == UNKNOWN and bool(moves) and all(m.retarget for m in moves if m.direction == UNKNOWN)
    when = _when(old.get("when"), new.get("when"))
    if when is not None:
        verdict, why = _merge((verdict, why), when)
        retarget = False
    if on_run and not settle:
        outcomes = (None, None)
    if on_run and settle:
        settled = _by_outcomes(*outcomes)
        if settled is not None:
            verdict, why = settled
            retarget = False
        elif verdict == UNKNOWN and outcomes[0] == outcomes[1]:
            why = f"{outcomes[0]} on this run before and after; {why}"
    basis = (RUN if settle else NUMBERS) if on_run else SPEC
    pinned = pins(old, new, new_values or {})
    return Shift(verdict, why, moves, *outcomes, retarget=retarget and verdict == UNKNOWN, basis=basis, pins=pinned)


# ---------------------------------------------------------------- what no longer reads the run

# Roots of the evidence a run writes; `values`, `mode` and `spec` are the spec's, the same on every run.
_RUN_ROOTS = ("steps", "state")


def _reads_run(text: Any, lets: Mapping[str, str], depth: int = 0) -> bool:
    """Whether an expression reads anything a run wrote (through the `let:` names it reads too); an
    expression that cannot be read counts as reading the run (nothing is claimed of it)."""
    parsed = _parsed(text) if isinstance(text, str) else None
    if parsed is None or depth > 20:
        return True
    stack = [parsed]
    while stack:  # `@` at the top reads the whole document
        node = stack.pop()
        if node.get("type") == "current":
            return True
        kids = [k for k in node.get("children") or [] if isinstance(k, dict)]
        if node.get("type") == "expref":
            continue
        # What a projection or a pipe applies to its left side's results is not read from the root.
        scoped = node.get("type") in ("projection", "value_projection", "filter_projection", "pipe")
        stack += kids[:1] if scoped else kids
    for path in functions.root_paths(functions.compile_expr(text)):
        if path[0] in _RUN_ROOTS:
            return True
        if path[0] == "let" and len(path) > 1 and path[1] in lets and _reads_run(lets[path[1]], lets, depth + 1):
            return True
    return False


def _run_paths(check: Mapping[str, Any]) -> set[tuple[str, ...]]:
    """The run's paths a check's expression and `let:` names read."""
    out: set[tuple[str, ...]] = set()
    for text in [check.get("expr"), *(check.get("let") or {}).values()]:
        if isinstance(text, str) and _parsed(text) is not None:
            out |= {p for p in functions.root_paths(functions.compile_expr(text)) if p[0] in _RUN_ROOTS}
    return out


def constant_text(text: str, values: Mapping[str, Any]) -> str:
    """What an expression that reads no run is: `the literal 1.0`, or its value from the spec's values."""
    parsed = _parsed(text)
    if parsed is not None and parsed["type"] == "literal":
        return f"the literal {json.dumps(parsed['value'])}"
    value = _static(parsed, values) if parsed is not None else ABSENT
    shown = code(_short(text, 80))
    return (
        f"{shown}, which reads no run" if value is ABSENT else f"{shown}, the spec's {compact(value, 60)} on every run"
    )


def pins(old: Mapping[str, Any], new: Mapping[str, Any], values: Mapping[str, Any]) -> list[str]:
    """Each `let:` name that read the run and now reads nothing of it (`loss` is now the literal 1.0),
    or else the whole expression, when it did and does not."""
    lets_a, lets_b = old.get("let") or {}, new.get("let") or {}
    read_before = _reads_run(old.get("expr"), lets_a)
    # What the old check read of the run and the new one does not: a new name pins only what it replaced
    # (`ceiling: values.loss_max` beside the run's loss pins nothing).
    dropped = _run_paths(old) - _run_paths(new)
    out = []
    for name, text in lets_b.items():
        before = lets_a.get(name)
        if (before is not None and _same_expr(before, text)) or _reads_run(text, lets_b):
            continue
        if bool(dropped) if before is None else _reads_run(before, lets_a):
            was = f" (it was {code(_short(before, 80))})" if isinstance(before, str) else ""
            out.append(f"{code(name)} is now {constant_text(text, values)}{was}")
    if not out and read_before and not _reads_run(new.get("expr"), lets_b):
        out.append(f"it no longer reads the run: its expression is {constant_text(new['expr'], values)}")
    return out
