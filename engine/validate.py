"""Semantic validation of a schema-valid spec: everything that can be known before anything runs.

Every problem is returned (not just the first), each located at file:line:col with its field path, so
one `engine validate` shows the whole list.
"""
from __future__ import annotations

import os
import re
from typing import Any, Iterator, Mapping

from engine import functions, plots
from engine.plan import command_timeout, default_builtins, mode_names, resolve_step, step_cost
from engine.spec import Spec, SpecError
from engine.values import iter_refs, layer, resolve, unknown_message

# What a check can read: the evidence document minus `checks` and `verdict`.
EVIDENCE_ROOTS = ("steps", "state", "values", "mode", "spec")


def _expressions(spec: Spec) -> Iterator[tuple[tuple, str]]:
    """(path, text) of every JMESPath in the spec."""
    data = spec.data
    for i, c in enumerate(data.get("checks") or []):
        for key in ("expr", "when"):
            if isinstance(c.get(key), str):
                yield ("checks", i, key), c[key]
    for i, s in enumerate(data.get("steps") or []):
        if isinstance(s.get("when"), str):
            yield ("steps", i, "when"), s["when"]
    layers = [(("values",), data.get("values") or {})]
    layers += [(("modes", m), v) for m, v in (data.get("modes") or {}).items() if isinstance(v, dict)]
    for prefix, table in layers:
        for name, v in table.items():
            if isinstance(v, dict) and isinstance(v.get("eval"), str):
                yield prefix + (name, "eval"), v["eval"]
    yield from plots.expressions(data)


def _compile_errors(spec: Spec) -> list[SpecError]:
    return [spec.error(path, msg) for path, text in _expressions(spec) for msg in functions.problems(text)]


def _unique_names(spec: Spec) -> list[SpecError]:
    errors = []
    for section, what in (("steps", "step"), ("checks", "check")):
        first: dict[str, int] = {}
        for i, item in enumerate(spec.data.get(section) or []):
            name = item.get("name")
            if name in first:
                file, line, _ = spec.locate((section, first[name]))
                errors.append(spec.error((section, i, "name"),
                                         f"duplicate {what} name {name!r} (first at {file}:{line})"))
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
        errors.append(spec.error(("modes", "default"),
                                 f"default mode {default!r} is not defined; modes: {', '.join(modes) or 'none'}"))
    defined_by: dict[str, str] = {}  # key -> first mode defining it
    for m, table in modes.items():
        for key in table:
            defined_by.setdefault(key, m)
    for m, table in modes.items():
        for key, first in defined_by.items():
            if key not in table:
                errors.append(spec.error(("modes", m), f"mode {m!r} does not define {key!r} (mode {first!r} "
                                                       f"does); every mode must define the same keys"))
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


def _reference_errors(spec: Spec) -> list[SpecError]:
    """Checks read evidence some step produces; step `when` reads known values."""
    data = spec.data
    steps: dict[str, Any] = {}
    for s in data.get("steps") or []:
        steps.setdefault(s["name"], s)  # a duplicate name is reported on its own; refer to the first
    collects = sorted(n for n, s in steps.items() if "collect" in s)
    values = _value_names(spec)
    errors = []
    for path, text in _expressions(spec):
        try:
            chains = functions.root_paths(functions.compile_expr(text))
        except Exception:  # noqa: BLE001 - a parse error, already reported by _compile_errors
            continue
        for chain in chains:
            msg = None
            if path[0] == "steps":
                if chain[0] not in values:
                    msg = f"step condition {text!r} reads {unknown_message(chain[0], values, ref=False)}"
            elif path[0] in ("checks", "plots"):  # a plot reads the evidence as a check does
                msg = _evidence_problem(chain, steps, collects, values)
            if msg:
                errors.append(spec.error(path, msg))
    return errors


def _evidence_problem(chain: tuple[str, ...], steps: Mapping[str, Any], collects: list[str],
                      values: set[str]) -> str | None:
    root = chain[0]
    dotted = ".".join(chain)
    if root == "null":
        return None  # bare null reads an absent field, which is null: works as the literal would
    if root in ("true", "false"):
        # Bare true/false are FIELD names in JMESPath, so `x == true` is false even when x is true.
        # (Bare null reads an absent field, which IS null: harmless, so it is allowed.)
        return f"{dotted}: bare {root} is a field name in JMESPath, not a boolean; write `{root}`"
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
                return (f"{dotted}: step {name!r} has no harvest rule {chain[3]!r}; "
                        f"its rules: {', '.join(rules) or 'none'}")
    elif root == "state" and name not in collects:
        return f"{dotted}: no collect step named {name!r}; collect steps: {', '.join(collects) or 'none'}"
    elif root == "values" and name not in values:
        return f"{dotted}: no value named {name!r}; values: {', '.join(sorted(values))}"
    return None


def _patterns(run: Mapping[str, Any]) -> list[tuple[tuple, Any, bool]]:
    """(path below run, pattern, needs a `step` group) of every regex in a run section."""
    found: list[tuple[tuple, Any, bool]] = [
        (("output", "strip_prefix"), (run.get("output") or {}).get("strip_prefix"), False)]
    found += [(("signals", j, "match"), s.get("match"), False) for j, s in enumerate(run.get("signals") or [])]
    if run.get("progress"):
        found.append((("progress", "match"), run["progress"].get("match"), True))
    harvest = (run.get("output") or {}).get("harvest")
    if isinstance(harvest, dict):
        found += [(("output", "harvest", name, "match"), rule.get("match"), False)
                  for name, rule in harvest.items() if isinstance(rule, dict) and "match" in rule]
    return found


def _regex_errors(spec: Spec, index: int, raw_run: Mapping[str, Any],
                  resolved_run: Mapping[str, Any] | None = None) -> list[SpecError]:
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
    return errors


def _budget_error(spec: Spec, mode: str, costs: list[tuple[str, float]]) -> SpecError | None:
    budget = spec.data.get("budget_s")
    total = sum(c for _, c in costs)
    if budget is None or total <= budget:
        return None
    top = ", ".join(f"{n} {c:g} s" for n, c in sorted(costs, key=lambda x: -x[1])[:3])
    return spec.error(("budget_s",), f"mode {mode!r}: worst case {total:g} s exceeds budget_s {budget:g} s "
                                     f"(biggest: {top})")


def _mode_pass(spec: Spec, mode: str, environ: Mapping[str, str],
               unknown: dict[tuple, set[str]]) -> list[SpecError]:
    """Resolve values and every step in one mode; unknown `${x}` go to `unknown` (reported across modes)."""
    data = spec.data
    defs = layer(data, mode, environ, {}, default_builtins(spec, mode))
    res = resolve(defs, spec.locate)
    errors = list(res.errors)
    failed = set(defs) - set(res.values)
    costs: list[tuple[str, float]] = []
    complete = not failed
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
        if step["kind"] == "collect" and step["collect"].get("collector") == "command" \
                and command_timeout(step["collect"]) is None:
            args = step["collect"]["args"]
            complete = False  # no honest worst case for this mode
            errors.append(spec.error(("steps", i, "collect", "args"),
                                     "the command collector's timeout_s must be a positive number of seconds and "
                                     f"grace_s a non-negative one (got timeout_s={args.get('timeout_s')!r}, "
                                     f"grace_s={args.get('grace_s')!r})"))
        if step["enabled"]:
            costs.append((step["name"], step_cost(step)))
    if complete:
        err = _budget_error(spec, mode, [c for c in costs if c[1] > 0])
        if err:
            errors.append(err)
    return errors


def validate(spec: Spec, environ: Mapping[str, str] | None = None) -> list[SpecError]:
    """Every semantic problem of a (schema-valid) spec, sorted by location; empty means valid."""
    env = os.environ if environ is None else environ
    errors: list[SpecError] = []
    errors += _unique_names(spec)
    errors += _compile_errors(spec)
    errors += _mode_errors(spec)
    errors += _reference_errors(spec)
    for i, raw in enumerate(spec.data.get("steps") or []):
        if isinstance(raw.get("run"), dict):
            errors += _regex_errors(spec, i, raw["run"])
    if not spec.data.get("checks"):
        errors.append(spec.error(("checks",), "no checks: a probe that asserts nothing always passes"))
    modes = mode_names(spec.data) or ["default"]
    unknown: dict[tuple, set[str]] = {}
    for mode in modes:
        errors += _mode_pass(spec, mode, env, unknown)
    for (path, name), in_modes in unknown.items():
        where = "" if len(in_modes) == len(modes) else f" in mode {', '.join(sorted(in_modes))}"
        errors.append(spec.error(path, f"unknown value ${{{name}}}{where}"))
    unique = {str(e): e for e in errors}
    return sorted(unique.values(), key=SpecError.sort_key)
