"""Semantic validation of a schema-valid spec: everything that can be known before anything runs.

Every problem is returned (not just the first), each located at file:line:col with its field path, so
one `engine validate` shows the whole list.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Iterable, Iterator, Mapping

from engine.expr import functions
from engine.spec import blocks, expand, plotdefs, require
from engine.spec.load import Spec, family_of
from engine.spec.located import SpecError
from engine.spec.plan import (
    command_timeout,
    default_builtins,
    mode_names,
    resolve_checks,
    resolve_step,
    secret_value_names,
    step_cost,
)
from engine.spec.values import iter_refs, layer, resolve, unknown_message
from engine.types import Check

# What a check can read: the evidence document minus `checks` and `verdict` (and its own `let`).
EVIDENCE_ROOTS = ("steps", "state", "values", "mode", "spec")


# Every mode looks at the same expressions again (a check reads the same text in smoke and soak):
# what a text's syntax allows and what it reads depend on the text alone.
@functools.lru_cache(maxsize=2048)
def _problems(text: str) -> tuple[str, ...]:
    return tuple(functions.problems(text))


@functools.lru_cache(maxsize=2048)
def _roots(text: str) -> tuple[tuple[str, ...], ...]:
    """Field chains `text` reads from the root; raises on a syntax error (reported by _problems)."""
    return tuple(functions.root_paths(functions.compile_expr(text)))


def _check_texts(check: Mapping[str, Any]) -> Iterator[tuple[tuple, str]]:
    """(path below the check, text) of a check's JMESPath: expr, when, each let."""
    for key in ("expr", "when"):
        if isinstance(check.get(key), str):
            yield (key,), check[key]
    for name, text in (check.get("let") or {}).items():
        if isinstance(text, str):
            yield ("let", name), text


def _templated(text: str) -> bool:
    """A check expression with `${x}` (or a `for_each` element's `${x.field}`) is JMESPath only once
    spliced: it is checked per mode."""
    return expand.templated(text)


def _expressions(spec: Spec) -> Iterator[tuple[tuple, str]]:
    """(path, text) of every JMESPath in the spec, but the checks' templated ones (see `_mode_pass`)."""
    data = spec.data
    for i, c in enumerate(data.get("checks") or []):
        for sub, text in _check_texts(c):
            if not _templated(text):
                yield ("checks", i) + sub, text
    for i, s in enumerate(data.get("steps") or []):
        if isinstance(s.get("when"), str):
            yield ("steps", i, "when"), s["when"]
    for i, rule in enumerate(data.get("require") or []):
        yield from ((("require", i) + sub, text) for sub, text in _check_texts(rule))
    layers = [(("values",), data.get("values") or {})]
    layers += [(("modes", m), v) for m, v in (data.get("modes") or {}).items() if isinstance(v, dict)]
    for prefix, table in layers:
        for name, v in table.items():
            if isinstance(v, dict) and isinstance(v.get("eval"), str):
                yield prefix + (name, "eval"), v["eval"]
    yield from plotdefs.expressions(data)


@functools.lru_cache(maxsize=2048)
def _bare_literals(text: str) -> frozenset[str]:
    return frozenset(functions.bare_literals(text))


def _expression_errors(spec: Spec, path: tuple, text: str) -> list[SpecError]:
    """The problems of one expression at `path`; a bare null/true/false in a check also names the
    check, whose expression the message shows rewritten."""
    bare = _bare_literals(text) if path[0] == "checks" else frozenset()
    name = spec.data["checks"][path[1]].get("name") if bare else None
    return [spec.error(path, f"check {name!r}: {msg}" if msg in bare else msg) for msg in _problems(text)]


def _compile_errors(spec: Spec) -> list[SpecError]:
    return [e for path, text in _expressions(spec) for e in _expression_errors(spec, path, text)]


def _unique_names(spec: Spec) -> list[SpecError]:
    errors = []
    for section, what in (("steps", "step"), ("checks", "check"), ("require", "requirement")):
        first: dict[str, int] = {}
        for i, item in enumerate(spec.data.get(section) or []):
            name = item.get("name")
            if name in first:
                file, line, _ = spec.locate((section, first[name]))
                file2, line2, _ = spec.locate((section, i))
                errors.append(
                    spec.error(
                        (section, i, "name"),
                        f"duplicate {what} name {name!r}: {file}:{line} and {file2}:{line2}; "
                        f"rename one (a repeated name would replace the first)",
                    )
                )
            else:
                first[name] = i
    return errors


def _mode_errors(spec: Spec) -> list[SpecError]:
    """Every mode defines the same keys; modes.default names a mode; env names known values."""
    data = spec.data
    modes = {m: data["modes"][m] for m in mode_names(data)}
    errors = []
    default = (data.get("modes") or {}).get("default")
    if default is not None and default not in modes:
        errors.append(
            spec.error(
                ("modes", "default"), f"default mode {default!r} is not defined; modes: {', '.join(modes) or 'none'}"
            )
        )
    defined_by: dict[str, str] = {}  # key -> first mode defining it
    for m, table in modes.items():
        for key in table:
            defined_by.setdefault(key, m)
    for m, table in modes.items():
        for key, first in defined_by.items():
            if key not in table:
                errors.append(
                    spec.error(
                        ("modes", m),
                        f"mode {m!r} does not define {key!r} (mode {first!r} "
                        f"does); every mode must define the same keys",
                    )
                )
    known = _value_names(spec)
    for var, name in (data.get("env") or {}).items():
        if name not in known:
            errors.append(spec.error(("env", var), f"env {var} overrides {unknown_message(name, known, ref=False)}"))
    return errors


def _value_names(spec: Spec) -> set[str]:
    data = spec.data
    names = set(default_builtins(spec, "x")) | set(data.get("values") or {})
    for m in mode_names(data):
        names |= set(data["modes"][m] or {})
    return names


def _harvest_names(step: Mapping[str, Any]) -> set[str]:
    run = step.get("run") or {}
    return set(((run.get("output") or {}).get("harvest") or {}))


def _reference_errors(spec: Spec, texts: Iterable[tuple[tuple, str]] | None = None) -> list[SpecError]:
    """Checks read evidence some step produces (and their own lets); step `when` reads known values.
    `texts`: the (path, text) pairs to look at, by default every untemplated expression."""
    data = spec.data
    steps: dict[str, Any] = {}
    for s in data.get("steps") or []:
        steps.setdefault(s["name"], s)  # a duplicate name is reported on its own; refer to the first
    collects = sorted(n for n, s in steps.items() if "collect" in s)
    values = _value_names(spec)
    errors = []
    for path, text in _expressions(spec) if texts is None else texts:
        try:
            chains = _roots(text)
        except Exception:  # a parse error, already reported by _compile_errors
            continue
        for chain in chains:
            msg = None
            if chain[0] in functions.LITERAL_WORDS and _bare_literals(text):
                continue  # a bare null/true/false: reported with its fix by _expression_errors
            if path[0] == "steps":
                if chain[0] not in values:
                    msg = f"step condition {text!r} reads {unknown_message(chain[0], values, ref=False)}"
            elif path[0] == "checks":
                lets = list((data["checks"][path[1]].get("let") or {}))
                msg = (
                    _let_problem(chain, path, lets)
                    if chain[0] == "let"
                    else _evidence_problem(chain, steps, collects, values)
                )
            elif path[0] == "plots":  # a plot reads the evidence as a check does
                msg = _evidence_problem(chain, steps, collects, values)
            if msg:
                errors.append(spec.error(path, msg))
    return errors


def _let_problem(chain: tuple[str, ...], path: tuple, lets: list[str]) -> str | None:
    """`let.<name>` names one of the check's lets; a let reads only the lets written above it."""
    if len(chain) < 2:
        return "`let` alone is not a value: read a named sub-expression as let.<name>"
    name = chain[1]
    if name not in lets:
        return f"let.{name}: this check has no let named {name!r}; its lets: {', '.join(lets) or 'none'}"
    if len(path) >= 4 and path[2] == "let":
        me = path[3]
        if lets.index(name) >= lets.index(me):
            return (
                f"let.{me} reads let.{name}, which is {'itself' if name == me else 'written after it'}; "
                f"a let reads only the lets above it"
            )
    return None


def _evidence_problem(
    chain: tuple[str, ...], steps: Mapping[str, Any], collects: list[str], values: set[str]
) -> str | None:
    root = chain[0]
    dotted = ".".join(chain)
    if root not in EVIDENCE_ROOTS:
        return f"{dotted}: {root!r} is not part of the evidence; a check reads {', '.join(EVIDENCE_ROOTS)}"
    if len(chain) < 2:
        return None
    name = chain[1]
    if root == "steps":
        if name not in steps:
            return f"{dotted}: no step named {name!r}; steps: {', '.join(steps) or 'none'}"
        if len(chain) >= 4 and chain[2] == "harvest":
            rules = sorted(_harvest_names(steps[name]))
            if chain[3] not in rules:
                return (
                    f"{dotted}: step {name!r} has no harvest rule {chain[3]!r}; its rules: {', '.join(rules) or 'none'}"
                )
    elif root == "state" and name not in collects:
        return f"{dotted}: no collect step named {name!r}; collect steps: {', '.join(collects) or 'none'}"
    elif root == "values" and name not in values:
        return f"{dotted}: no value named {name!r}; values: {', '.join(sorted(values))}"
    return None


# --- what a check can yield ------------------------------------------------------------------------

Types = frozenset[str] | None  # the JMESPath types a node can yield; None: anything (data decides)
_BOOL: frozenset[str] = frozenset({"boolean"})
_A_LIST = frozenset({"array", "null"})


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}.get(type(value), "any")


def _field_chain(node: dict) -> tuple[str, ...] | None:
    """`a.b.c` -> ("a", "b", "c"); None unless the node is exactly a chain of plain fields."""
    if node["type"] == "field":
        return (node["value"],)
    if node["type"] == "subexpression":
        parts: tuple[str, ...] = ()
        for kid in node["children"]:
            sub = _field_chain(kid)
            if sub is None:
                return None
            parts += sub
        return parts
    return None


def _types(node: dict, values: Mapping[str, Any], lets: Mapping[str, Types]) -> Types:
    """What a node can yield, from the AST alone: literals, operators, functions' return types, and the
    values (known per mode) and lets it reads; None where only the data can tell."""
    kind, kids = node["type"], node.get("children", [])
    if kind == "literal":
        return frozenset({_json_type(node["value"])})
    if kind == "comparator":  # JMESPath's ordering of non-numbers is null, equality always a boolean
        return _BOOL if node["value"] in ("eq", "ne") else frozenset({"boolean", "null"})
    if kind == "not_expression":
        return _BOOL
    if kind in ("and_expression", "or_expression"):  # either operand is what comes out
        a, b = _types(kids[0], values, lets), _types(kids[1], values, lets)
        return None if a is None or b is None else a | b
    if kind == "function_expression":
        found = functions.returns(node["value"])
        return None if found is None else frozenset(found)
    if kind in ("projection", "filter_projection", "value_projection", "flatten", "multi_select_list"):
        return _A_LIST
    if kind == "multi_select_dict":
        return frozenset({"object", "null"})
    if kind == "expref":
        return frozenset({"expression"})
    if kind == "pipe":
        return _types(kids[1], values, lets)
    chain = _field_chain(node)
    if chain is not None:
        if len(chain) == 2 and chain[0] == "values" and chain[1] in values:
            return frozenset({_json_type(values[chain[1]])})
        if len(chain) == 2 and chain[0] == "let":
            return lets.get(chain[1])
        return None
    if kind in ("subexpression", "index_expression") and kids and kids[-1]["type"] not in ("field", "index"):
        return _types(kids[-1], values, lets)
    return None


_A = {
    "number": "a number",
    "string": "a string",
    "array": "a list",
    "object": "an object",
    "null": "null",
    "boolean": "a boolean",
    "expression": "an expression reference",
}


def _what(node: dict, types: frozenset[str]) -> str:
    shown = " or ".join(_A.get(t, t) for t in sorted(types))
    kind = node["type"]
    if kind == "function_expression":
        return f"{node['value']}() returns {shown}"
    if kind == "literal":
        return f"it is a literal ({shown})"
    if kind in ("projection", "filter_projection", "value_projection", "flatten"):
        return "a projection yields a list"
    return f"it yields {shown}"


def _bare(node: dict) -> bool:
    return node["type"] in ("field", "subexpression", "index_expression", "current")


def boolean_findings(
    check: Mapping[str, Any], values: Mapping[str, Any]
) -> tuple[list[tuple[tuple, str]], list[tuple[tuple, str]]]:
    """(errors, warnings) as (path below the check, message): an expr or when whose top can never be a
    boolean would read as a system failure at run time ("got 120, not true"), so it is a spec error; a
    bare field reference passes only on an exact true, which deserves a word."""
    lets: dict[str, Types] = {}
    for name, text in (check.get("let") or {}).items():
        try:  # a text still templated could not be spliced (said already): it is no JMESPath yet
            lets[name] = None if _templated(text) else _types(functions.compile_expr(text).parsed, values, lets)
        except Exception:  # a parse error is reported on its own
            lets[name] = None
    errors, warnings = [], []
    for key in ("expr", "when"):
        text = check.get(key)
        if not isinstance(text, str) or _templated(text):
            continue
        try:
            node = functions.compile_expr(text).parsed
        except Exception:  # a parse error is reported on its own
            continue
        types = _types(node, values, lets)
        role = "a check passes only on exactly true" if key == "expr" else "a condition must be exactly true or false"
        if types is not None and "boolean" not in types:
            errors.append(
                (
                    (key,),
                    f"{key} {text!r} can never be true: {_what(node, types)}, and {role}; "
                    f"compare it (e.g. `... == ...`)",
                )
            )
        elif types is None and _bare(node):
            warnings.append(
                (
                    (key,),
                    f"{key} {text!r} is a bare field reference: it holds only when that field "
                    f"is exactly true; compare it (e.g. {text} == `true`) to say so",
                )
            )
    return errors, warnings


def _unused_lets(check: Mapping[str, Any]) -> list[tuple[tuple, str]]:
    lets = list(check.get("let") or {})
    if not lets or any(_templated(text) for _, text in _check_texts(check)):
        return []  # a text that could not be spliced (said already) cannot tell what it reads
    read: set[str] = set()
    for sub, text in _check_texts(check):
        try:
            chains = _roots(text)
        except Exception:  # a parse error, already reported by _compile_errors
            continue
        read |= {c[1] for c in chains if len(c) >= 2 and c[0] == "let" and not (sub[0] == "let" and sub[1] == c[1])}
    return [(("let", n), f"let.{n} is never read (by expr, when or another let)") for n in lets if n not in read]


def _written(spec: Spec, checks: list[Check]) -> list[tuple[int, Mapping[str, Any]]]:
    """(index, the check as written) of each resolved check: an expansion of a `for_each` check is
    written as its family, unless a check overrides that one expansion."""
    raw = spec.data.get("checks") or []
    index: dict[str, int] = {}
    for i, c in enumerate(raw):
        index.setdefault(c["name"], i)
    out = []
    for check in checks:
        name = check["name"]
        i = index[name] if name in index else index[str(family_of(name))]
        out.append((i, raw[i]))
    return out


def _check_findings(
    spec: Spec, checks: list[Check], values: Mapping[str, Any]
) -> tuple[list[SpecError], list[SpecError]]:
    """Per mode: the templated expressions once spliced (syntax, what they read), then what every
    check can yield. (errors, warnings)."""
    errors: list[SpecError] = []
    warnings: list[SpecError] = []
    spliced = []
    for check, (i, written) in zip(checks, _written(spec, checks)):
        for sub, text in _check_texts(written):
            if _templated(text):
                done = check.get(sub[0]) if len(sub) == 1 else (check.get("let") or {}).get(sub[1])
                if isinstance(done, str) and not _templated(done):  # else: not spliced, said already
                    spliced.append((("checks", i) + sub, done))
        bad, warn = boolean_findings(check, values)
        errors += [spec.error(("checks", i) + sub, msg) for sub, msg in bad]
        warnings += [spec.error(("checks", i) + sub, msg) for sub, msg in warn + _unused_lets(check)]
    errors += [e for path, text in spliced for e in _expression_errors(spec, path, text)]
    errors += _reference_errors(spec, spliced)
    return errors, warnings


def _plot_findings(spec: Spec, values: Mapping[str, Any]) -> list[SpecError]:
    """Per mode: every `for_each` series expanded and `${x}` spliced, then the spliced points checked
    like any plot expression (syntax, what they read)."""
    plots, problems = plotdefs.resolve(spec.data, values)
    errors = [spec.error(*p) for p in problems]
    spliced = [
        (series.at, series.points)
        for plot in plots
        for series in plot.series
        if _templated(_at(spec.data, series.at)) or "for_each" in _at(spec.data, series.at[:-1])
    ]
    errors += [spec.error(path, msg) for path, text in spliced for msg in _problems(text)]
    return errors + _reference_errors(spec, spliced)


def _at(data: Any, path: tuple) -> Any:
    for key in path:
        data = data[key]
    return data


def _patterns(run: Mapping[str, Any]) -> list[tuple[tuple, Any, bool]]:
    """(path below run, pattern, needs a `step` group) of every regex in a run section."""
    found: list[tuple[tuple, Any, bool]] = [
        (("output", "strip_prefix"), (run.get("output") or {}).get("strip_prefix"), False)
    ]
    found += [(("signals", j, "match"), s.get("match"), False) for j, s in enumerate(run.get("signals") or [])]
    if run.get("progress"):
        found.append((("progress", "match"), run["progress"].get("match"), True))
        phases = run["progress"].get("phases")
        if isinstance(phases, dict):
            found += [(("progress", "phases", name), text, False) for name, text in phases.items()]
    harvest = (run.get("output") or {}).get("harvest")
    if isinstance(harvest, dict):
        found += [
            (("output", "harvest", name, "match"), rule.get("match"), False)
            for name, rule in harvest.items()
            if isinstance(rule, dict) and "match" in rule
        ]
    child = (run.get("output") or {}).get("child_exit")
    if isinstance(child, dict):
        found.append((("output", "child_exit", "code"), child.get("code"), False))
        messages = child.get("message")
        if isinstance(messages, list):
            found += [(("output", "child_exit", "message", i), m, False) for i, m in enumerate(messages)]
        elif messages is not None:
            found.append((("output", "child_exit", "message"), messages, False))
    for key in ("fail_on", "warn_on"):
        texts = (run.get("output") or {}).get(key)
        if isinstance(texts, list):
            found += [(("output", key, i), text, False) for i, text in enumerate(texts)]
    return found


def _regex_errors(
    spec: Spec, index: int, raw_run: Mapping[str, Any], resolved_run: Mapping[str, Any] | None = None
) -> list[SpecError]:
    """Regexes compile. Without `resolved_run`: the patterns free of `${x}` (once for all modes); with it:
    the patterns that had `${x}`, as substituted in that mode."""
    raw = _patterns(raw_run)
    pats = raw if resolved_run is None else _patterns(resolved_run)
    errors = []
    for (sub, raw_pattern, needs_step), (_, pattern, _) in zip(raw, pats):
        templated = isinstance(raw_pattern, str) and bool(list(iter_refs(raw_pattern)))
        if not isinstance(pattern, str) or templated != (resolved_run is not None):
            continue
        path = ("steps", index, "run") + sub
        try:
            rx = re.compile(pattern)
        except re.error as e:
            errors.append(spec.error(path, f"bad regex {pattern!r}: {e}"))
            continue
        if needs_step and "step" not in rx.groupindex:
            errors.append(spec.error(path, f"progress regex {pattern!r} needs a named group (?P<step>...)"))
        if sub[:2] == ("output", "harvest") and not rx.groupindex:
            errors.append(spec.error(path, f"harvest regex {pattern!r} has no named group (?P<name>...) to harvest"))
        if sub == ("output", "child_exit", "code") and "code" not in rx.groupindex:
            errors.append(spec.error(path, f"child_exit.code regex {pattern!r} needs a named group (?P<code>...)"))
    return errors


# Where a spec's text reaches what runs: a leg's argv, environment and working directory, the paths a
# step removes, a collector's arguments, and the values spliced into them.
_REACHES_A_LEG = (
    ("run", "argv"),
    ("run", "env"),
    ("run", "cwd"),
    ("remove",),
    ("collect", "args"),
    ("reference",),
    ("snapshot",),
)


def _leaves(node: Any, path: tuple) -> Iterator[tuple[tuple, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, path + (i,))
    else:
        yield path, node


def _misread_errors(spec: Spec) -> list[SpecError]:
    """A scalar that YAML read otherwise than written (engine/spec/misread.py: line breaks folded
    into spaces, `010` as 8, `12:30` as 750) where it reaches a leg: refused, naming where it is
    written and what it reads as."""
    data = spec.data
    roots = [(("values",), data.get("values")), (("modes",), data.get("modes"))]
    for i, step in enumerate(data.get("steps") or []):
        for sub in _REACHES_A_LEG:
            node = step
            for key in sub:
                node = node.get(key) if isinstance(node, dict) else None
            roots.append((("steps", i) + sub, node))
    errors = []
    for root, node in roots:
        for path, value in _leaves(node, root):
            mark = spec.marks.get(path)
            if mark is not None and mark.misread:
                shown = repr(value[:80]) if isinstance(value, str) else repr(value)
                errors.append(spec.error(path, f"this reads {shown}: {mark.misread}"))
    return errors


def budget_error(spec: Spec, mode: str, costs: list[tuple[str, float]]) -> SpecError | None:
    """The budget_s error of one mode whose worst case does not fit, or None (also `engine run`'s
    refusal after --set)."""
    budget = spec.data.get("budget_s")
    total = sum(c for _, c in costs)
    if budget is None or total <= budget:
        return None
    top = ", ".join(f"{n} {c:g} s" for n, c in sorted(costs, key=lambda x: -x[1])[:3])
    return spec.error(
        ("budget_s",), f"mode {mode!r}: worst case {total:g} s exceeds budget_s {budget:g} s (biggest: {top})"
    )


def _mode_pass(
    spec: Spec,
    mode: str,
    environ: Mapping[str, str],
    unknown: dict[tuple, set[str]],
    warnings: list[SpecError],
    unmet: dict[tuple[int, str], list[str]],
) -> list[SpecError]:
    """Resolve values, every step and every check in one mode; unknown `${x}` go to `unknown` and the
    requirements that do not hold to `unmet` (both reported across modes), warnings to `warnings`."""
    data = spec.data
    defs = layer(data, mode, environ, {}, default_builtins(spec, mode))
    res = resolve(defs, spec.locate)
    errors = list(res.errors)
    if not res.errors:
        checks, errs = resolve_checks(spec, res.values)
        found, warned = _check_findings(spec, checks, res.values)
        errors += errs + found + _plot_findings(spec, res.values)
        warnings += warned
    failed = set(defs) - set(res.values)
    costs: list[tuple[str, float]] = []
    resolved: list[tuple[int, dict[str, Any]]] = []
    complete = not failed
    steps: list[dict[str, Any]] = []
    for i, raw in enumerate(data.get("steps") or []):
        body = {k: v for k, v in raw.items() if k not in ("name", "when", "description")}
        names = list(iter_refs(body, ("steps", i)))
        missing = [(n, p) for n, p in names if n not in defs]
        for n, p in missing:
            unknown.setdefault((p, n), set()).add(mode)
        if missing or any(n in failed for n, _ in names):
            complete = False
            continue
        step, errs = resolve_step(spec, i, raw, res.values, mode)
        errors.extend(errs)
        if not step:
            complete = False
            continue
        if step["kind"] == "run":
            errors.extend(_regex_errors(spec, i, raw["run"], step["run"]))
        if (
            step["kind"] == "collect"
            and step["collect"].get("collector") == "command"
            and command_timeout(step["collect"]) is None
        ):
            args = step["collect"]["args"]
            complete = False  # no honest worst case for this mode
            errors.append(
                spec.error(
                    ("steps", i, "collect", "args"),
                    "the command collector's timeout_s must be a positive number of seconds and "
                    f"grace_s a non-negative one (got timeout_s={args.get('timeout_s')!r}, "
                    f"grace_s={args.get('grace_s')!r})",
                )
            )
        steps.append(step)
        resolved.append((i, step))
        if step["enabled"]:
            costs.append((step["name"], step_cost(step)))
    if not res.errors:
        errors += blocks.resolved_errors(spec, resolved, res.values["run_dir"])
        errors += blocks.run_dependence_errors(spec, mode, environ, resolved)
    if complete:
        err = budget_error(spec, mode, [c for c in costs if c[1] > 0])
        if err:
            errors.append(err)
        secrets = secret_value_names(data, res.values, res.sources)
        for found in require.unmet(spec, res.values, steps, mode, secrets):
            unmet.setdefault(found, []).append(mode)
    return errors


def validate(spec: Spec, environ: Mapping[str, str] | None = None) -> list[SpecError]:
    """Every semantic problem of a (schema-valid) spec, sorted by location; empty means valid."""
    return findings(spec, environ)[0]


def findings(spec: Spec, environ: Mapping[str, str] | None = None) -> tuple[list[SpecError], list[SpecError]]:
    """(errors, warnings) of a (schema-valid) spec, each sorted by location. Warnings do not make it
    invalid: they point at what is legal but easy to misread (a bare field reference, an unused let)."""
    env = os.environ if environ is None else environ
    warnings: list[SpecError] = []
    errors: list[SpecError] = []
    errors += _unique_names(spec)
    errors += _compile_errors(spec)
    errors += _mode_errors(spec)
    errors += _reference_errors(spec)
    errors += _misread_errors(spec)
    errors += blocks.written_errors(spec)
    for i, raw in enumerate(spec.data.get("steps") or []):
        if isinstance(raw.get("run"), dict):
            errors += _regex_errors(spec, i, raw["run"])
    if not spec.data.get("checks"):
        errors.append(spec.error(("checks",), "no checks: a probe that asserts nothing always passes"))
    modes = mode_names(spec.data) or ["default"]
    unknown: dict[tuple, set[str]] = {}
    unmet: dict[tuple[int, str], list[str]] = {}
    for mode in modes:
        errors += _mode_pass(spec, mode, env, unknown, warnings, unmet)
    for (index, found), in_modes in unmet.items():
        errors.append(require.requirement_error(spec, index, found, [] if len(in_modes) == len(modes) else in_modes))
    for (path, name), in_modes in unknown.items():
        where = "" if len(in_modes) == len(modes) else f" in mode {', '.join(sorted(in_modes))}"
        errors.append(spec.error(path, f"unknown value ${{{name}}}{where}"))
    unique = {str(e): e for e in errors}
    seen = {str(w): w for w in warnings}
    return sorted(unique.values(), key=SpecError.sort_key), sorted(seen.values(), key=SpecError.sort_key)
