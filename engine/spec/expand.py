"""`${x}` spliced into a check's JMESPath, and `for_each`: a check (or a plot's series) declared once
for every element of a list of values.

A check's JMESPath is text until the plan: `${x}` is replaced by a value that may only stand for a
name (a step, a collect step) or an integer (a slice bound), so that splicing can never change what
the expression means. `for_each: {leg: "values.stops"}` reads a list from the values (JMESPath over
`values`, at plan time) and makes one ordinary check of each element, named `NAME[leg=LABEL]`: a
scalar element labels itself; an object element is labelled by its field named like the variable
(`{leg: leg1, stop: 10}` -> `[leg=leg1]`), and its fields are read as `${leg.stop}`.

Problems are `(spec path, message)` pairs; the caller locates them (`Spec.error`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from jmespath import exceptions as jexc

from engine import limits
from engine.expr import functions
from engine.spec.values import UnknownVariable, refs, substitute, unknown_message
from engine.text import compact

Problem = tuple[tuple, str]

# What `${x}` may stand for in JMESPath: a name or an integer; anything else could change its meaning.
_SPLICEABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# An expansion's label: what a check name can carry between `[var=` and `]`, in every report.
_LABEL = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
LABEL_MAX = 64
# `${x}`, `${x.field}`; `$${...}` is escaped (left to the value splicer, which unescapes it).
_REF = re.compile(r"(\$?)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?\}")


def templated(text: str) -> bool:
    """Does the text hold a `${x}` or `${x.field}` (escaped `$${` aside)?"""
    return any(not m.group(1) for m in _REF.finditer(text))


def spliceable(value: Any) -> bool:
    return (isinstance(value, str) and bool(_SPLICEABLE.match(value))) or (
        isinstance(value, int) and not isinstance(value, bool)
    )


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True)
class Element:
    """One element of a `for_each` list, bound to its variable."""

    var: str
    item: Any
    label: str

    def name(self, family: str) -> str:
        return f"{family}[{self.var}={self.label}]"

    def value(self, field: str | None) -> Any:
        """What `${var}` (field None) or `${var.field}` stands for; ValueError naming the problem."""
        if field is None:
            return self.item[self.var] if isinstance(self.item, dict) else self.item
        if not isinstance(self.item, dict):
            raise ValueError(f"${{{self.var}.{field}}}: the element {compact(self.item, 60)} is not an object")
        if field not in self.item:
            known = ", ".join(self.item)
            raise ValueError(f"${{{self.var}.{field}}}: the element has no field {field!r} (its fields: {known})")
        return self.item[field]


def _label(var: str, item: Any) -> tuple[str | None, str]:
    """(label, "") or (None, why the element cannot name an expansion)."""
    if isinstance(item, dict):
        if var not in item:
            fields = ", ".join(item) or "none"
            return None, f"an object element is named by its field {var!r}, which it lacks (its fields: {fields})"
        if isinstance(item[var], (dict, list)):
            return None, f"its field {var!r} is {compact(item[var], 40)}: a name or an integer names an expansion"
        item = item[var]
    if isinstance(item, bool) or item is None or isinstance(item, float):
        return (
            None,
            f"{compact(item)} cannot name a check: an element is a name, an integer, or an object with a {var!r} field",
        )
    if isinstance(item, list):
        return None, f"a list cannot name a check: an element is a name, an integer, or an object with a {var!r} field"
    text = str(item)
    if len(text) > LABEL_MAX or not _LABEL.match(text):
        return None, (
            f"{compact(text, 40)} cannot name a check: a label is 1 to {LABEL_MAX} letters, digits, "
            f"'_', '.' or '-', starting with a letter, digit or '_'"
        )
    return text, ""


def _root_problem(chain: tuple[str, ...], values: Mapping[str, Any]) -> str | None:
    """Why a for_each list may not read `chain`: it reads the values, by name, and nothing else."""
    if chain[0] != "values":
        return f"{'.'.join(chain)}: the list is read from the values, as values.NAME"
    if len(chain) > 1 and chain[1] not in values:
        return unknown_message(chain[1], values, ref=False)
    return None


def elements(
    for_each: Mapping[str, str], values: Mapping[str, Any], path: tuple
) -> tuple[list[Element], list[Problem]]:
    """The elements of `for_each: {var: JMESPath over values}`, each with its label; or the problems
    (`path` is where the `for_each` is written). An empty list is refused: it would assert nothing."""
    ((var, text),) = for_each.items()
    where = path + (var,)
    if var in values:
        return [], [(where, f"for_each variable {var!r} is also a value: ${{{var}}} would mean two things; rename it")]
    bad = functions.problems(text)
    if bad:
        return [], [(where, msg) for msg in bad]
    parsed = functions.compile_expr(text)
    for chain in functions.root_paths(parsed):
        problem = _root_problem(chain, values)
        if problem:
            return [], [(where, f"for_each {var}: {text!r} reads {problem}")]
    try:
        items = functions.search(parsed, {"values": dict(values)})
    except (jexc.JMESPathError, TypeError, ValueError, OverflowError) as e:
        return [], [(where, f"for_each {var}: {text!r} failed: {' '.join(str(e).split())}")]
    if not isinstance(items, list):
        return [], [(where, f"for_each {var}: {text!r} is {compact(items, 80)}, not a list")]
    if not items:
        return [], [(where, f"for_each {var}: {text!r} is an empty list: the check would assert nothing")]
    if len(items) > limits.FOR_EACH_MAX_ELEMENTS:
        return [], [
            (
                where,
                f"for_each {var}: {text!r} has {len(items):,} elements; one for_each expands to at most "
                f"{limits.FOR_EACH_MAX_ELEMENTS:,} checks",
            )
        ]
    out: list[Element] = []
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for n, item in enumerate(items):
        label, why = _label(var, item)
        if label is None:
            problems.append(
                (where, f"for_each {var}: element {n} ({compact(item, 60)}) cannot name an expansion: {why}")
            )
        elif label in seen:
            problems.append(
                (
                    where,
                    f"for_each {var}: elements {seen[label]} and {n} both name [{var}={label}]; "
                    f"each expansion needs a name of its own",
                )
            )
        else:
            seen[label] = n
            out.append(Element(var, item, label))
    return ([], problems) if problems else (out, [])


def _length(for_each: Any, values: Mapping[str, Any], memo: dict[str, int]) -> int:
    """How many expansions a `for_each` makes (1 for none, or for one `elements` will refuse)."""
    if not isinstance(for_each, Mapping) or len(for_each) != 1:
        return 1
    ((_, text),) = for_each.items()
    if not isinstance(text, str):
        return 1
    if text not in memo:
        try:
            items = functions.search(functions.compile_expr(text), {"values": dict(values)})
        except (jexc.JMESPathError, TypeError, ValueError, OverflowError):
            items = None
        memo[text] = len(items) if isinstance(items, list) and items else 1
    return memo[text]


def over_limit(
    declared: Iterable[tuple[tuple, Any]], values: Mapping[str, Any], what: tuple[str, str] = ("checks", "check")
) -> Problem | None:
    """Before anything is expanded: the problem when the declarations (the spec path of each, and
    its `for_each` or None) expand to more than limits.EXPANDED_CHECKS_MAX together, named at the
    `for_each` that passes the limit, with the total they would reach. Only the lists' lengths are
    read: 3,000 checks over a list of 1,000 cost 3,000 lookups here, not 3 million expansions."""
    memo: dict[str, int] = {}
    counts = [(path, for_each, _length(for_each, values, memo) if for_each else 1) for path, for_each in declared]
    total = sum(n for _, _, n in counts)
    if total <= limits.EXPANDED_CHECKS_MAX:
        return None
    running = 0
    for path, for_each, n in counts:
        running += n
        if running > limits.EXPANDED_CHECKS_MAX:
            where = path + ("for_each",) if for_each else path
            return (
                where,
                f"the {what[0]} expand to {total:,} in mode {values.get('mode')!r}, over the limit of "
                f"{limits.EXPANDED_CHECKS_MAX:,} (this one, {n:,} of them, passes it): each expansion is "
                f"a {what[1]} in every report; fewer for_each lists, or shorter ones",
            )
    return None  # pragma: no cover - the total is over, so one of them passes it


def bind(text: str, element: Element | None, splice: bool) -> str:
    """`${var}` and `${var.field}` of `element` replaced; other `${x}` left for the values. With
    `splice` (JMESPath) what replaces them must be a name or an integer; else their text (prose, a
    label). ValueError names the reference that cannot be bound."""

    def one(m: re.Match) -> str:
        escaped, head, field = m.groups()
        if escaped:
            return m.group(0)
        if element is None or head != element.var:
            if field is not None:
                mine = f"this check's is {element.var!r}" if element else "this one has none"
                raise ValueError(f"${{{head}.{field}}}: only a for_each variable has fields, and {mine}")
            return m.group(0)
        value = element.value(field)
        if not splice:
            return _as_text(value)
        if not spliceable(value):
            ref = f"${{{head}.{field}}}" if field else f"${{{head}}}"
            raise ValueError(
                f"{ref} is {compact(value, 60)}: in an expression, ${{x}} may only stand for a name or an "
                f"integer (it is spliced into the text)"
            )
        return str(value)

    return _REF.sub(one, text)


def splice(
    text: str, values: Mapping[str, Any], path: tuple, element: Element | None = None, owner: str = ""
) -> tuple[str, Problem | None]:
    """`${x}` in a JMESPath text replaced: the `for_each` element's references first, then values, each
    of which must be a name or an integer. `owner` (an expansion's name) leads a message about it."""
    try:
        text = bind(text, element, splice=True)
    except ValueError as e:
        return text, (path, f"in {owner}: {e}" if owner else str(e))
    for name in dict.fromkeys(refs(text)):
        if name not in values:
            return text, (path, unknown_message(name, values))
        if not spliceable(values[name]):
            return text, (
                path,
                f"${{{name}}} is {compact(values[name], 60)}: in a check, ${{x}} may only stand for "
                f"a name or an integer (it is spliced into the expression); read other "
                f"values as values.{name}",
            )
    try:
        return str(substitute(text, values, path)), None
    except UnknownVariable as e:  # pragma: no cover - every name was looked up above
        return text, (path, unknown_message(e.name, values))
