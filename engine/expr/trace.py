"""Expressions traced over a document: the JMESPath interpreter that checks and plots share.

Python's jmespath returns ``None`` both for an absent key and for an explicit ``null``, and projections
silently drop nulls, so a plain ``search`` cannot tell "the run said null" from "the run never said".
``trace`` evaluates with a TreeInterpreter that records every lookup on a value that lacks the key (the
missing paths) and remembers the values of comparator operands, ``&&``/``||``/``!`` operands and function
calls, so that a failing check can show *why*. ``unparse`` writes a syntax tree back as text, the way
those sub-expressions are named. A check's named sub-expressions (``let: {first2: "..."}``) are read as
``let.first2`` and evaluated on first read.

An absent path is missing data (the check is NO_DATA), with one exception: a path whose absence the
document itself records (``trace(absent=...)``: a harvest rule no line matched), compared with the
literal null, is a question about that absence and gets its answer. Explain shows ``<absent>`` for
an absent path, never ``null``, which is a value. A comparison function's explain text names where it
differs (engine/expr/series.py), and its operands are shown around that position.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Collection, Iterable, Mapping

import jmespath
from jmespath.visitor import TreeInterpreter

from engine.expr import series
from engine.expr.functions import evaluation, member
from engine.text import compact, compact_pair

NOT_EVALUATED = "not evaluated"
# How explain shows a path the document does not have (jmespath would say null, which is a value).
MISSING = "<absent>"

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PATHS = ("field", "subexpression", "index_expression")  # a plain path: what `== `null`` may ask about
_OPS = {"eq": "==", "ne": "!=", "lt": "<", "gt": ">", "lte": "<=", "gte": ">="}


# ---------------------------------------------------------------- the document checks see


def check_document(evidence: Mapping[str, Any]) -> dict:
    """The evidence without ``checks``/``verdict``, as plain JSON types (tuples -> lists, etc.)."""
    doc = {k: v for k, v in evidence.items() if k not in ("checks", "verdict")}
    # A JSON round-trip is the simplest way to guarantee exactly what a saved evidence.json
    # would give `engine check` later: live runs and re-checks must see the same document.
    return json.loads(json.dumps(doc, default=str))


# ---------------------------------------------------------------- paths and rendering

COMPUTED = "(computed value)"


def _key_text(key: Any) -> str:
    if key is COMPUTED:
        return key
    if isinstance(key, int):
        return f"[{key}]"
    return key if _IDENT.match(key) else json.dumps(key)


def path_text(parts: Iterable[Any]) -> str:
    """``["steps", "leg1", "losses", "10", 0]`` -> ``steps.leg1.losses."10"[0]``."""
    out = ""
    for part in parts:
        text = _key_text(part)
        out += text if (text.startswith("[") or not out) else "." + text
    return out


# Binding strength used only to decide where the unparser needs parentheses.
_PREC = {
    "pipe": 1,
    "or_expression": 2,
    "and_expression": 3,
    "comparator": 5,
    "not_expression": 6,
    "projection": 8,
    "value_projection": 8,
    "filter_projection": 8,
    "flatten": 8,
}


def _prec(node: dict) -> int:
    if node["type"] == "subexpression":  # `a.b[*].c` binds like its trailing projection
        return min(10, _prec(node["children"][-1]))
    return _PREC.get(node["type"], 10)


def _wrap(node: dict, minimum: int) -> str:
    text = unparse(node)
    return f"({text})" if _prec(node) < minimum else text


def _left(node: dict) -> str:
    """Render the operand of a postfix form (``x[0]``, ``x[*]``, ``x.*``); identity is implicit."""
    return "" if node["type"] == "identity" else _wrap(node, 10)


def _suffix(node: dict) -> str:
    """Render the right-hand side of a projection: nothing, ``[..]`` or ``.rest``."""
    if node["type"] == "identity":
        return ""
    text = unparse(node)
    return text if text.startswith("[") else "." + text


def _bracket(node: dict) -> str:
    if node["type"] == "index":
        return f"[{node['value']}]"
    start, stop, step = (("" if c is None else str(c)) for c in node["children"])
    return f"[{start}:{stop}" + (f":{step}]" if step else "]")


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "`" + json.dumps(value, separators=(",", ":")) + "`"


def _subexpression(node: dict) -> str:
    # A projection after a dot (`a.b[*].c`) swallows the rest of the chain, so one that
    # the AST ends early must close a parenthesised group: `(a.b[*].c).d`.
    kids = node["children"]
    text = _wrap(kids[0], 10)
    for i, kid in enumerate(kids[1:], start=1):
        text += "." + unparse(kid)
        if i < len(kids) - 1 and _prec(kid) < 10:
            text = f"({text})"
    return text


def _projection(node: dict) -> str:
    left, right = node["children"]
    if left["type"] == "flatten" or (left["type"] == "index_expression" and left["children"][-1]["type"] == "slice"):
        head = unparse(left)  # `a[]` and `a[1:2]` are projections by themselves
    else:
        head = _left(left) + "[*]"
    return head + _suffix(right)


def _value_projection(node: dict) -> str:
    left = _left(node["children"][0])
    return (left + ".*" if left else "*") + _suffix(node["children"][1])


def _filter_projection(node: dict) -> str:
    left, right, condition = node["children"]
    return _left(left) + "[?" + unparse(condition) + "]" + _suffix(right)


def _infix(node: dict, op: str, left: int, right: int) -> str:
    """``a <op> b``, each side parenthesised when it binds looser than its minimum."""
    kids = node["children"]
    return f"{_wrap(kids[0], left)} {op} {_wrap(kids[1], right)}"


def _listed(node: dict) -> str:
    return ", ".join(unparse(k) for k in node.get("children", []))


# One renderer per jmespath node type: the minimums passed to _wrap/_infix are _PREC's levels.
_RENDER: dict[str, Callable[[dict], str]] = {
    "field": lambda n: _key_text(n["value"]),
    "current": lambda n: "@",
    "identity": lambda n: "@",
    "literal": lambda n: _literal(n["value"]),
    "subexpression": _subexpression,
    "index_expression": lambda n: _left(n["children"][0]) + "".join(_bracket(k) for k in n["children"][1:]),
    "projection": _projection,
    "value_projection": _value_projection,
    "filter_projection": _filter_projection,
    "flatten": lambda n: _left(n["children"][0]) + "[]",
    "comparator": lambda n: _infix(n, _OPS[n["value"]], 6, 6),
    "or_expression": lambda n: _infix(n, "||", 2, 3),
    "and_expression": lambda n: _infix(n, "&&", 3, 4),
    "pipe": lambda n: _infix(n, "|", 1, 2),
    "not_expression": lambda n: "!" + _wrap(n["children"][0], 6),
    "expref": lambda n: "&" + _wrap(n["children"][0], 6),
    "function_expression": lambda n: n["value"] + "(" + _listed(n) + ")",
    "multi_select_list": lambda n: "[" + _listed(n) + "]",
    "multi_select_dict": lambda n: "{" + _listed(n) + "}",  # its children are key_val_pairs
    "key_val_pair": lambda n: f"{_key_text(n['value'])}: {unparse(n['children'][0])}",
}


def unparse(node: dict) -> str:
    """Render a jmespath AST node back to expression text (parenthesised only where needed)."""
    render = _RENDER.get(node["type"])
    if render is None:
        raise ValueError(f"unknown jmespath node type {node['type']!r}")
    return render(node)


# ---------------------------------------------------------------- the tracing interpreter


def index_paths(doc: Any) -> dict[int, tuple]:
    """id(container) -> its path in the document, for naming missing lookups."""
    paths: dict[int, tuple] = {}
    stack: list[tuple[Any, tuple]] = [(doc, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            paths[id(value)] = path
            stack.extend((v, path + (k,)) for k, v in value.items())
        elif isinstance(value, list):
            paths[id(value)] = path
            stack.extend((v, path + (i,)) for i, v in enumerate(value))
    return paths


def _explained_nodes(node: dict) -> list[dict]:
    """Nodes whose value explain shows, in reading order. Per-element parts (projection bodies,
    filter conditions, exprefs) run many times, so they are shown as a whole, not inside."""
    found: list[dict] = []

    def walk(n: dict) -> None:
        kind, kids = n["type"], n.get("children", [])
        if kind in ("comparator", "and_expression", "or_expression", "not_expression"):
            for kid in kids:
                if kid["type"] != "literal":
                    found.append(kid)
                walk(kid)
        elif kind == "function_expression":
            found.append(n)
            for kid in kids:
                if kid["type"] not in ("literal", "expref", "current"):
                    found.append(kid)
                walk(kid)
        elif kind in ("projection", "value_projection", "filter_projection"):
            walk(kids[0])
        elif kind in (
            "subexpression",
            "index_expression",
            "pipe",
            "flatten",
            "multi_select_list",
            "multi_select_dict",
            "key_val_pair",
        ):
            for kid in kids:
                if isinstance(kid, dict):
                    walk(kid)

    walk(node)
    unique: dict[int, dict] = {}
    for n in found:
        unique.setdefault(id(n), n)
    return list(unique.values())


class _Lets(dict):
    """`let.<name>` for one evaluation: each named sub-expression is evaluated on its first read, by the
    tracer reading it (so its missing lookups count), and only if something reads it."""

    def __init__(self, texts: Mapping[str, str], tracer: "_Tracer") -> None:
        super().__init__((name, None) for name in texts)  # membership only: values come from __getitem__
        self.texts = dict(texts)
        self.tracer = tracer
        self.values: dict[str, Any] = {}
        self.misses: set[str] = set()
        self.origins: dict[str, tuple] = {}  # a let that read absent data -> the path that was absent
        self._absent_reads: dict[str, list[tuple]] = {}  # a let -> the absent paths it read
        self._active: list[str] = []

    def __getitem__(self, name: str) -> Any:
        if name in self.values:
            # Every read of a let that read absent data reads it again: a read that asks whether it
            # is absent is answered, any other read is NO_DATA, whichever came first.
            for path in self._absent_reads.get(name, ()):
                self.tracer.miss_again(path)
            return self.values[name]
        if name in self._active:
            raise ValueError(f"let.{name} reads itself (through {' -> '.join(self._active)})")
        self._active.append(name)
        before, start = self.tracer.miss_count, len(self.tracer.miss_log)
        try:
            value = self.tracer.evaluate_let(self.texts[name])
        finally:
            self._active.pop()
        if self.tracer.miss_count != before:
            self.misses.add(name)
            read = self.tracer.miss_log[start:]
            self._absent_reads[name] = [p for p in dict.fromkeys(read) if not any(q[: len(p)] == p != q for q in read)]
            if value is None and self.tracer.last_miss is not None:
                self.origins[name] = self.tracer.last_miss
        self.values[name] = value
        return value


class _Tracer(TreeInterpreter):
    """A TreeInterpreter that records missing lookups and the values of chosen nodes."""

    def __init__(
        self,
        options: Any,
        paths: dict[int, tuple],
        watch: Iterable[dict] = (),
        root: Any = None,
        absent: Collection[tuple] = (),
    ) -> None:
        super().__init__(options)
        self._paths = paths
        self._root = root  # the document as evaluated (with `let` added): its path is ()
        self.miss_count = 0
        self.last_miss: tuple | None = None
        self.miss_log: list[tuple] = []  # every missing lookup, in order (a let's are a slice of it)
        # Paths whose absence the document records (see `trace`), the lookups that failed on a
        # container that exists (a key it lacks, an index past its end), and the absent paths an
        # `== `null`` comparison asked about: those are answered, not missing.
        self._absent = frozenset(absent)
        self._in_container: set[tuple] = set()
        self.answered: list[tuple] = []
        # A comparison call's explain text (its first difference) and its operands cut around it.
        self.notes: dict[int, str | None] = {}
        self.cuts: dict[int, str] = {}
        # Path of the value being visited when it is not a container (a scalar or None):
        # set by the constructs that step into a value, restored after.
        self._hint: tuple | None = ()
        self._watch = {id(n) for n in watch}
        self.seen: dict[int, Any] = {}
        self.missing: list[tuple] = []

    # -- bookkeeping
    def visit(self, node: dict, *args: Any, **kwargs: Any) -> Any:
        result = super().visit(node, *args, **kwargs)
        if id(node) in self._watch and id(node) not in self.seen:
            self.seen[id(node)] = result
        return result

    def _path_of(self, value: Any) -> tuple | None:
        if value is self._root and value is not None:
            return ()
        if isinstance(value, (dict, list)):
            return self._paths.get(id(value))
        return self._hint

    def evaluate_let(self, text: str) -> Any:
        """A named sub-expression, over the whole document, wherever in the expression it is read."""
        saved = self._hint
        self._hint = ()
        try:
            return self.visit(jmespath.compile(text).parsed, self._root)
        finally:
            self._hint = saved

    def _miss(self, path: tuple) -> None:
        self.miss_count += 1
        self.last_miss = path
        self.miss_log.append(path)
        # A lookup below an already-missing value names the longer, more telling path.
        self.missing = [p for p in self.missing if p != path[: len(p)]]
        if not any(p[: len(path)] == path for p in self.missing):
            self.missing.append(path)

    def _step_path(self, node: dict, base: tuple | None) -> tuple | None:
        if base is not None and node["type"] in ("field", "index"):
            return base + (node["value"],)
        return None

    def miss_again(self, path: tuple) -> None:
        """A let that read absent data, read once more: the same missing path, counted again."""
        self.miss_count += 1
        self.last_miss = path
        self.miss_log.append(path)
        if not any(p[: len(path)] == path for p in self.missing):
            self.missing.append(path)

    def _lookup_failed(self, value: Any, key: Any) -> None:
        base = self._path_of(value)
        path = (base if base is not None else (COMPUTED,)) + (key,)
        if isinstance(value, dict if isinstance(key, str) else list):  # a key it lacks, an index past its end
            self._in_container.add(path)
        self._miss(path)

    # -- lookups: an absent key, an index past the end, or a lookup into a non-container
    def visit_field(self, node: dict, value: Any) -> Any:
        if isinstance(value, dict) and node["value"] in value:
            return value[node["value"]]
        self._lookup_failed(value, node["value"])
        return None

    def visit_index(self, node: dict, value: Any) -> Any:
        index = node["value"]
        if isinstance(value, list) and -len(value) <= index < len(value):
            return value[index]
        self._lookup_failed(value, index)
        return None

    def _chain(self, node: dict, value: Any) -> Any:
        saved = self._hint
        result, path = value, self._path_of(value)
        for child in node["children"]:
            self._hint = path
            next_path = self._step_path(child, path)
            before = result
            result = self.visit(child, result)
            # A container of the document is named by its own path (`let.s.files` is state.X.files),
            # and so is a let that read absent data (below it, the missing path grows from there).
            known = self._paths.get(id(result)) if isinstance(result, (dict, list)) else None
            if isinstance(before, _Lets) and child["type"] == "field":
                known = before.origins.get(child["value"], known)
            path = known if known is not None else next_path
        self._hint = saved
        return result

    visit_subexpression = _chain
    visit_index_expression = _chain

    def _each(self, body: dict, items: Iterable[tuple[Any, Any]], base: tuple | None, keep: Any = None) -> list:
        saved, collected = self._hint, []
        for key, element in items:
            if keep is not None:
                self._hint = None if base is None else base + (key,)
                if not self._is_true(self.visit(keep, element)):
                    continue
            self._hint = None if base is None else base + (key,)
            current = self.visit(body, element)
            if current is not None:
                collected.append(current)
        self._hint = saved
        return collected

    def visit_projection(self, node: dict, value: Any) -> Any:
        base = self.visit(node["children"][0], value)
        if not isinstance(base, list):
            return None
        return self._each(node["children"][1], enumerate(base), self._paths.get(id(base)))

    def visit_filter_projection(self, node: dict, value: Any) -> Any:
        base = self.visit(node["children"][0], value)
        if not isinstance(base, list):
            return None
        return self._each(node["children"][1], enumerate(base), self._paths.get(id(base)), keep=node["children"][2])

    def visit_value_projection(self, node: dict, value: Any) -> Any:
        base = self.visit(node["children"][0], value)
        if not isinstance(base, dict):
            return None
        return self._each(node["children"][1], base.items(), self._paths.get(id(base)))

    # -- absence asked about: `path == `null`` (or `!=`) over a path whose absence the document records
    def visit_comparator(self, node: dict, value: Any) -> Any:
        kids = node["children"]
        nulls = [k["type"] == "literal" and k["value"] is None for k in kids]
        if not self._absent or node["value"] not in ("eq", "ne") or sum(nulls) != 1:
            return super().visit_comparator(node, value)
        operands = [
            self.visit(k, value) if is_null or k["type"] not in _PATHS else self._asked_absent(k, value)
            for k, is_null in zip(kids, nulls)
        ]
        return self.COMPARATOR_FUNC[node["value"]](*operands)

    def _asked_absent(self, node: dict, value: Any) -> Any:
        """A path compared with null: the absent paths it alone read are answered (not missing) when
        each is one the document records as absent and the lookup failed on a container that exists."""
        before = list(self.missing)
        result = self.visit(node, value)
        new = [p for p in self.missing if p not in before]
        if (
            result is None
            and new
            and all(p in self.missing for p in before)  # nothing below an earlier miss
            and all(p in self._absent and p in self._in_container for p in new)
        ):
            self.missing = [p for p in self.missing if p not in new]
            self.answered += [p for p in new if p not in self.answered]
        return result

    def _get_missed(self, args: list, before: int) -> bool:
        """get(x, k) reads x.k with a computed key: a key x lacks (an index past its end) is missing
        data, as it is on the path (an x that was itself absent is missing already). Whether it missed."""
        found, key = member(*args)
        if found:
            return False
        if isinstance(args[0], (dict, list)):
            self._lookup_failed(args[0], key)
        elif not (args[0] is None and self.miss_count != before):
            self._miss((COMPUTED, key))
        return True

    # -- calls: a comparison says where it differs
    def visit_function_expression(self, node: dict, value: Any) -> Any:
        before = self.miss_count
        args = [self.visit(child, value) for child in node["children"]]
        result = self._functions.call_function(node["value"], args)
        name = node["value"]
        if name == "get" and self._get_missed(args, before):
            self.notes.setdefault(id(node), MISSING)  # explain says <absent>, not null
        if name in series.EXPLAINED and id(node) in self._watch and id(node) not in self.notes:
            self.notes[id(node)] = series.explain(name, args, result)
            for kid, text in zip(node["children"], series.windows(name, args, result)):
                if text is not None:
                    self.cuts.setdefault(id(kid), text)
        return result


# ---------------------------------------------------------------- one expression


def trace(
    expr: str,
    document: Any,
    options: Any = None,
    explain: bool = True,
    paths: dict[int, tuple] | None = None,
    lets: Mapping[str, str] | None = None,
    absent: Collection[tuple] = (),
) -> tuple[Any, list[str], list[list[str]]]:
    """Evaluate ``expr``: (value, missing paths, explain pairs). Raises on evaluation errors.
    ``paths`` is ``index_paths(document)``, passed in to index a big document only once. ``lets``
    (name -> JMESPath) are readable as ``let.<name>``; the explain pairs start with each one's value.
    ``absent``: paths (tuples of keys) whose absence the document itself records; comparing one of
    them with the literal null (``== `null```, ``!= `null```) asks about its absence and is answered,
    so it is not a missing path. Every other absent path read is missing."""
    parsed = jmespath.compile(expr).parsed
    watch = _explained_nodes(parsed) if explain else []
    root = dict(document) if lets else document
    tracer = _Tracer(options, index_paths(document) if paths is None else paths, watch, root, absent)
    named = _Lets(lets, tracer) if lets else None
    if named is not None:
        root["let"] = named
    try:
        with evaluation():  # one budget of range() elements for the whole expression and its lets
            value = tracer.visit(parsed, root)
    except Exception as exc:
        # What was computed before the failure is the best clue to it (a string operand...), and an
        # absent path fed to a typed function (sub(missing, 1)) is missing data, not an error: so is
        # one asked about, since the evaluation that asked gave no answer.
        missing = [path_text(p) for p in tracer.missing + tracer.answered]
        exc.missing = missing  # type: ignore[attr-defined]
        exc.explain = _pairs(tracer, watch, missing, named, parsed)  # type: ignore[attr-defined]
        raise
    missing = [path_text(p) for p in tracer.missing]
    shown_absent = missing + [path_text(p) for p in tracer.answered]
    return value, missing, _pairs(tracer, watch, shown_absent, named, parsed)


def _differences(parsed: dict, seen: dict[int, Any]) -> dict[str, str]:
    """Operand text -> its value cut around where it differs from the other side of its comparison,
    for every comparison of two long values that differ: cut at their start, two maps of hashes
    would show the same first hashes and never the one that differs."""
    out: dict[str, str] = {}
    stack = [parsed]
    while stack:
        node = stack.pop()
        kids = [k for k in node.get("children") or [] if isinstance(k, dict)]
        stack += kids
        if node["type"] != "comparator" or len(kids) != 2 or not all(id(k) in seen for k in kids):
            continue
        left, right = (seen[id(k)] for k in kids)
        if left != right and isinstance(left, (dict, list, str)) and isinstance(right, (dict, list, str)):
            shown = compact_pair(left, right)
            for kid, text in zip(kids, shown):
                out.setdefault(unparse(kid), text)
    return out


def _pairs(
    tracer: _Tracer, watch: list[dict], absent: list[str], named: _Lets | None = None, parsed: dict | None = None
) -> list[list[str]]:
    """(text, value shown) of each watched node; ``absent``: the texts of the absent paths read."""
    # A comparison call's operands are cut around its first difference, a comparator's around theirs.
    cut = {unparse(n): tracer.cuts[id(n)] for n in watch if id(n) in tracer.cuts}
    for text, shown in (_differences(parsed, tracer.seen) if parsed is not None and watch else {}).items():
        cut.setdefault(text, shown)
    pairs: list[list[str]] = []
    for n in watch:  # a sub-expression written twice has one value: shown once
        text = unparse(n)
        if all(p[0] != text for p in pairs):
            note = tracer.notes.get(id(n)) if id(n) in tracer.seen else None
            pairs.append([text, cut.get(text) or note or _shown(tracer.seen, n, text, absent)])
    if named is None:
        return pairs
    # Each named value once, first: a reviewer reads the names, then how the expression used them.
    head = [[f"let.{name}", cut.get(f"let.{name}") or _let_shown(named, name)] for name in named.texts]
    shown = {text for text, _ in head}
    return head + [p for p in pairs if p[0] not in shown]


def _let_shown(named: _Lets, name: str) -> str:
    if name not in named.values:
        return NOT_EVALUATED
    value = named.values[name]
    return MISSING if value is None and name in named.misses else compact(value)


def _shown(seen: dict[int, Any], node: dict, text: str, absent: list[str]) -> str:
    if id(node) not in seen:
        return NOT_EVALUATED
    value = seen[id(node)]
    # An absent path reads as null to jmespath; say which it really was.
    return MISSING if value is None and text in absent else compact(value)
