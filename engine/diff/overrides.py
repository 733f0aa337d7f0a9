"""Values a change hands to the environment: `env: {SPECPROBE_CEILING: loss_ceiling}` lets whoever runs
the spec set `loss_ceiling`, and with it every gate that reads it or a value made from it, with nothing
in the spec for a reviewer to see. `engine review` asks approval for each such mapping added or
pointed at another value."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from engine.diff.model import ABSENT, Change
from engine.expr import functions
from engine.spec.values import iter_refs


def _uses(raw: Any) -> set[str]:
    """The values one definition reads: its `${x}`, the roots of its `eval`, what it switches on."""
    if isinstance(raw, Mapping) and set(raw) == {"eval"} and isinstance(raw["eval"], str):
        try:
            return {p[0] for p in functions.root_paths(functions.compile_expr(raw["eval"]))}
        except Exception:  # validate refused it already
            return set()
    if isinstance(raw, Mapping) and set(raw) == {"switch", "cases"}:
        return {str(raw["switch"])} | {n for n, _ in iter_refs(raw["cases"])}
    return {n for n, _ in iter_refs(raw)}


def dependents(data: Mapping[str, Any], name: str) -> set[str]:
    """`name` and every value made from it, however far (its definition in `values:` or any mode's)."""
    blocks = [data.get("values") or {}] + [m for m in (data.get("modes") or {}).values() if isinstance(m, Mapping)]
    uses: dict[str, set[str]] = {}
    for block in blocks:
        for value, raw in block.items() if isinstance(block, Mapping) else []:
            uses.setdefault(str(value), set()).update(_uses(raw))
    out, grew = {name}, True
    while grew:
        more = {v for v, reads in uses.items() if reads & out} - out
        out |= more
        grew = bool(more)
    return out


def handed_over(changes: Iterable[Change]) -> list[tuple[str, str, str]]:
    """(variable, value, where) for each `env:` entry this change added or pointed at another value."""
    return [
        (c.subject.removeprefix("env."), str(c.new), c.where)
        for c in changes
        if c.section == "spec" and c.subject.startswith("env.") and c.new is not ABSENT and c.new != c.old
    ]


def gates_reading(plans: Iterable[Any], names: set[str], reads: Any) -> list[str]:
    """The gates of `plans` that read any of `names` (`values.<name>`), in the spec's order."""
    out: dict[str, None] = {}
    for plan in plans:
        for check in plan.checks:
            if (check.get("severity") or "gate") != "gate" or check.get("disabled"):
                continue
            if any(p[0] == "values" and len(p) > 1 and p[1] in names for p in reads(check)):
                out.setdefault(check["name"])
    return list(out)
