"""How much of a run a check looks at: a check rewritten from every logged loss to the last one still
passes the same runs that have a good last loss, and neither its bounds nor its outcome on a saved run
say that it now reads 1 value where it read 20. Counted on the saved run, both sides alike: the scalars
the run gives to the check's outermost comparisons and calls (`let:` names written out)."""

from __future__ import annotations

from typing import Any, Mapping

from engine.diff.operands import parsed
from engine.diff.strictness import expand
from engine.expr import functions
from engine.expr.trace import unparse

# Roots of what a run wrote (`values`, `mode` and `spec` are the spec's, the same on every run).
_RUN_ROOTS = ("steps", "state")


def _operands(node: dict, out: dict[str, dict]) -> None:
    """The operands of the outermost comparisons and calls of `node`, through `&&`, `||` and `!`."""
    kind = node.get("type")
    kids = [k for k in node.get("children") or [] if isinstance(k, dict)]
    if kind in ("and_expression", "or_expression", "not_expression"):
        for kid in kids:
            _operands(kid, out)
    elif kind in ("comparator", "function_expression"):
        for kid in kids:
            if kid.get("type") != "expref":
                out.setdefault(unparse(kid), kid)
    else:
        out.setdefault(unparse(node), node)


def _leaves(value: Any) -> int:
    if isinstance(value, list):
        return sum(_leaves(v) for v in value)
    if isinstance(value, dict):
        return sum(_leaves(v) for v in value.values())
    return 0 if value is None else 1


def compared(check: Mapping[str, Any], doc: Mapping[str, Any]) -> int | None:
    """How many values of the run `check` compares on `doc` (a saved run with its side's values); None
    when its expression cannot be read or evaluated there."""
    tree = parsed(check["expr"]) if isinstance(check.get("expr"), str) else None
    if tree is None:
        return None
    operands: dict[str, dict] = {}
    _operands(expand(tree, check.get("let") or {}), operands)
    total = 0
    for text in operands:
        try:
            compiled = functions.compile_expr(text)
            if not any(p[0] in _RUN_ROOTS for p in functions.root_paths(compiled)):
                continue
            total += _leaves(functions.search(compiled, doc))
        except Exception:  # an operand the run cannot give: nothing to count
            return None
    return total


def narrowed(
    old: Mapping[str, Any], new: Mapping[str, Any], old_doc: Mapping[str, Any], new_doc: Mapping[str, Any]
) -> str | None:
    """`it now compares 1 value of the run where it compared 20`, when the new check reads fewer."""
    before, after = compared(old, old_doc), compared(new, new_doc)
    if before is None or after is None or after >= before:
        return None
    noun = "value" if after == 1 else "values"
    return f"it now compares {after} {noun} of the run where it compared {before}"
