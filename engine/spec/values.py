"""Values: builtins < values (default) < mode < env < --set, derived values, `${x}` templating.

A value is plain, `{eval: JMESPath over the other values}`, or `{switch: other, cases: {...}}`; strings
may contain `${x}`. Values resolve in dependency order; a cycle is an error that names it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import yaml
from jmespath import exceptions as jexc

from engine import limits
from engine.expr import functions
from engine.secrets import is_secret
from engine.spec.located import SpecError, json_path

# Values every run has (source `builtin`); all but `mode` differ from one run to the next.
BUILTINS = ("python", "work_dir", "spec_dir", "run_dir", "run_id", "mode")
PER_RUN_BUILTINS = BUILTINS[:-1]
# `${name}` is a reference; `$${` is a literal `${` (for shell text inside an argv item).
_REF = re.compile(r"(\$?)\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_WHOLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

Locate = Callable[[tuple], tuple[str, int, int]]


class UsageError(Exception):
    """Bad command-line input (unknown mode, malformed or unknown --set)."""


def parse_scalar(text: str) -> Any:
    """`--set`/env text as YAML: "30" -> 30, "true" -> True, "[10, 20]" -> [10, 20]; bad YAML stays text."""
    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if v is None and text.strip() not in ("", "~", "null", "Null", "NULL"):
        return text
    return v if isinstance(v, (str, int, float, bool, list, dict, type(None))) else text


def refs(text: str) -> list[str]:
    """Names referenced as `${name}` in a string (escaped `$${name}` excluded)."""
    return [m.group(2) for m in _REF.finditer(text) if not m.group(1)]


def iter_refs(obj: Any, path: tuple = ()) -> Iterator[tuple[str, tuple]]:
    """Every (name, path) of a `${name}` inside a nested structure."""
    if isinstance(obj, str):
        for name in refs(obj):
            yield name, path
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from iter_refs(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from iter_refs(v, path + (i,))


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)
    return json.dumps(v)  # true/false/null, lists, objects: their JSON text


class UnknownVariable(Exception):
    def __init__(self, name: str, path: tuple):
        super().__init__(name, path)
        self.name, self.path = name, path


def substitute(text: str, values: Mapping[str, Any], path: tuple = ()) -> Any:
    """`${x}` alone keeps x's type; embedded references become text."""
    whole = _WHOLE.fullmatch(text)
    if whole:
        name = whole.group(1)
        if name not in values:
            raise UnknownVariable(name, path)
        return values[name]

    def one(m: re.Match) -> str:
        if m.group(1):
            return "${" + m.group(2) + "}"
        if m.group(2) not in values:
            raise UnknownVariable(m.group(2), path)
        return _text(values[m.group(2)])

    return _REF.sub(one, text)


def substitute_text(text: str, values: Mapping[str, Any], path: tuple = ()) -> str:
    """`${x}` replaced by x's text, even when it is the whole string (prose: a check's `why`)."""
    return _text(substitute(text, values, path))


def _template(obj: Any, values: Mapping[str, Any], path: tuple) -> Any:
    if isinstance(obj, str):
        return substitute(obj, values, path)
    if isinstance(obj, dict):
        return {k: _template(v, values, path + (k,)) for k, v in obj.items()}
    if isinstance(obj, list):
        out: list = []
        for i, item in enumerate(obj):
            v = _template(item, values, path + (i,))
            # An argv item that is exactly `${x}` with a list value splices into the list.
            if isinstance(item, str) and _WHOLE.fullmatch(item) and isinstance(v, list):
                out.extend(v)
            else:
                out.append(v)
        return out
    return obj


def template(obj: Any, values: Mapping[str, Any], path: tuple = (), locate: Locate | None = None) -> Any:
    """Substitute `${x}` throughout a step definition; unknown names raise SpecError at `path`."""
    try:
        return _template(obj, values, path)
    except UnknownVariable as e:
        file, line, col = locate(e.path) if locate else ("<template>", 0, 0)
        raise SpecError(file, line, col, json_path(e.path), unknown_message(e.name, values)) from None


def unknown_message(name: str, known: Iterable[str], ref: bool = True) -> str:
    """`ref`: the name was written as `${name}` (templates) rather than a bare JMESPath identifier."""
    shown = f"${{{name}}}" if ref else repr(name)
    return f"unknown value {shown}; known: {', '.join(sorted(known))}"


# --- layering ------------------------------------------------------------------------------------


@dataclass
class Definition:
    raw: Any  # as written (plain, {eval}, {switch}) or a parsed override
    source: str  # builtin | default | mode | env | --set
    path: tuple  # where it is written in the spec (for errors); () for builtins/overrides
    problem: str | None = None  # why it cannot be used (an environment variable YAML would not read as written)


def override_value(name: str, text: str) -> Any:
    """An override's text (--set, env) as a value: a secret is taken as it is written (YAML would
    turn the token `0123` into 83 and `yes` into true), anything else is parsed as a YAML scalar."""
    return text if is_secret(name) else parse_scalar(text)


# What YAML takes for a line break: a plain scalar folds each one into a space.
_LINE_BREAKS = ("\n", "\r", "\x85", "\u2028", "\u2029")


def override_problem(name: str, text: str) -> str | None:
    """Why an override's text (--set, env) would not be read as written, or None. YAML folds a line
    break into a space (`owner/name\n--delete-everything` would become one argument), drops a `#`
    comment and the blanks around a plain scalar: each is refused, never done silently. A secret is
    taken as written (and never shown); a quoted text means what its quotes say."""
    if is_secret(name):
        return None
    if any(brk in text for brk in _LINE_BREAKS):
        return "it holds a line break, which YAML would fold into a space: a value given here is one line"
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None  # not YAML: taken as written
    if isinstance(node, yaml.ScalarNode) and not node.style and node.tag.endswith((":int", ":float")):
        if ":" in text or re.fullmatch(r"\s*[-+]?0[0-7_]+\s*", text):
            return f"YAML 1.1 would read {text!r} as {parse_scalar(text)!r}; quote it ('...') to mean the text"
    if isinstance(node, yaml.ScalarNode) and not node.style and node.value != text:
        why = [
            *(["its blanks at either end are dropped"] if text.strip() != text else []),
            *(["a ` #` starts a comment"] if node.value != text.strip() and "#" in text else []),
        ]
        return (
            f"YAML would read {text!r} as {node.value!r}"
            + (f" ({'; '.join(why)})" if why else "")
            + "; quote it ('...') to mean it as written"
        )
    return None


def parse_sets(sets: Sequence[str]) -> dict[str, Any]:
    """["steps=30", "repo=x"] -> {"steps": 30, "repo": "x"}; malformed -> UsageError."""
    out: dict[str, Any] = {}
    for item in sets:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            # The item may hold a secret's text: name the key only.
            raise UsageError(f"--set {key[:40]!r}...: expected NAME=VALUE")
        problem = override_problem(key, text)
        if problem:
            raise UsageError(f"--set {key}: {problem}")
        out[key] = override_value(key, text)
    return out


def layer(
    data: Mapping[str, Any],
    mode: str | None,
    environ: Mapping[str, str],
    sets: Mapping[str, Any],
    builtins: Mapping[str, Any],
) -> dict[str, Definition]:
    """Stack the layers into one definition per name (the highest layer wins)."""
    defs = {k: Definition(v, "builtin", ()) for k, v in builtins.items()}
    for k, v in (data.get("values") or {}).items():
        defs[k] = Definition(v, "default", ("values", k))
    if mode is not None:
        for k, v in ((data.get("modes") or {}).get(mode) or {}).items():
            defs[k] = Definition(v, "mode", ("modes", mode, k))
    for var, name in (data.get("env") or {}).items():
        if var in environ:
            text = environ[var]
            problem = override_problem(name, text)
            if not text.strip() and not is_secret(name):
                problem = "it is set but empty (YAML would read null); unset it to keep the spec's value"
            defs[name] = Definition(
                override_value(name, text),
                "env",
                ("env", var),
                f"the environment variable {var} (value {name!r}): {problem}" if problem else None,
            )
    unknown = sorted(set(sets) - set(defs))
    if unknown:
        raise UsageError(f"--set {', '.join(unknown)}: unknown value; known: {', '.join(sorted(defs))}")
    for k, v in sets.items():
        if k == "mode":
            raise UsageError("--set mode=...: use --mode to pick a mode")
        defs[k] = Definition(v, "--set", ())
    return defs


def _derived_kind(raw: Any) -> str | None:
    if isinstance(raw, dict) and set(raw) == {"eval"} and isinstance(raw["eval"], str):
        return "eval"
    if isinstance(raw, dict) and set(raw) == {"switch", "cases"} and isinstance(raw["cases"], dict):
        return "switch"
    return None


def _case_key(v: Any) -> str:
    return _text(v)


@dataclass
class Resolved:
    values: dict[str, Any]
    sources: dict[str, str]
    errors: list[SpecError]


class _Resolver:
    def __init__(self, defs: dict[str, Definition], locate: Locate | None):
        self.defs = defs
        self.locate = locate
        self.values: dict[str, Any] = {}
        self.failed: set[str] = set()
        self.errors: list[SpecError] = []
        self.stack: list[str] = []
        self.too_deep = False

    def err(self, path: tuple, message: str) -> None:
        file, line, col = self.locate(path) if self.locate else ("<values>", 0, 0)
        self.errors.append(SpecError(file, line, col, json_path(path), message))

    def get(self, name: str) -> bool:
        """Resolve `name`; False if it (or something it needs) failed."""
        if name in self.values:
            return True
        if name in self.failed:
            return False
        if name in self.stack:
            cycle = self.stack[self.stack.index(name) :] + [name]
            d = self.defs[name]
            self.err(d.path, f"value cycle: {' -> '.join(cycle)}")
            self.failed.update(cycle)
            return False
        if len(self.stack) >= limits.VALUE_MAX_CHAIN:
            # Resolution recurses once per link; past this a generated spec gone wrong would
            # exhaust the interpreter's stack.
            chain = self.stack[:3] + ["..."] + self.stack[-2:] + [name]
            if not self.too_deep:  # one such chain is reported; each later one is the same story
                self.err(
                    self.defs[name].path,
                    f"values refer through more than {limits.VALUE_MAX_CHAIN} other values: {' -> '.join(chain)}",
                )
            self.too_deep = True
            self.failed.update(self.stack + [name])
            return False
        self.stack.append(name)
        try:
            ok = self._compute(name)
        finally:
            self.stack.pop()
        if not ok:
            self.failed.add(name)
        return ok

    def _need(self, names: list[str], d: Definition, what: str) -> bool:
        ok = True
        for n in names:
            if n not in self.defs:
                self.err(d.path, f"{what} {unknown_message(n, self.defs)}")
                ok = False
            elif not self.get(n):
                ok = False
        return ok

    def _compute(self, name: str) -> bool:
        d = self.defs[name]
        if name in self.failed:
            return False
        if d.problem:
            self.err(d.path, d.problem)
            return False
        kind = _derived_kind(d.raw) if d.source in ("default", "mode") else None
        if kind == "eval":
            return self._eval(name, d)
        if kind == "switch":
            return self._switch(name, d)
        if isinstance(d.raw, (str, list, dict)) and d.source != "builtin":
            needed = [n for n, _ in iter_refs(d.raw)]
            if not self._need(needed, d, "uses"):
                return False
            self.values[name] = _template(d.raw, self.values, d.path)
            return True
        self.values[name] = d.raw
        return True

    def _eval(self, name: str, d: Definition) -> bool:
        text = d.raw["eval"]
        where = d.path + ("eval",)
        bad = functions.problems(text)
        if bad:
            for msg in bad:
                self.err(where, msg)
            return False
        parsed = functions.compile_expr(text)
        deps = [p[0] for p in functions.root_paths(parsed)]
        unknown = [n for n in dict.fromkeys(deps) if n not in self.defs]
        for n in unknown:
            self.err(where, f"{text!r} reads {unknown_message(n, self.defs, ref=False)}")
        if unknown or not all([self.get(n) for n in dict.fromkeys(deps)]):
            return False
        try:
            self.values[name] = functions.search(parsed, self.values)
        except (jexc.JMESPathError, TypeError, ValueError, OverflowError) as e:
            self.err(where, f"{text!r} failed: {' '.join(str(e).split())}")
            return False
        return True

    def _switch(self, name: str, d: Definition) -> bool:
        other = d.raw["switch"]
        if not isinstance(other, str) or other not in self.defs:
            self.err(d.path + ("switch",), f"switch on {unknown_message(str(other), self.defs, ref=False)}")
            return False
        if not self.get(other):
            return False
        key = _case_key(self.values[other])
        cases = d.raw["cases"]
        if key not in cases:
            self.err(
                d.path + ("cases",), f"value {name!r}: no case for {other}={key!r}; known cases: {', '.join(cases)}"
            )
            return False
        chosen = cases[key]
        needed = [n for n, _ in iter_refs(chosen)]
        if not self._need(needed, d, "uses"):
            return False
        self.values[name] = _template(chosen, self.values, d.path + ("cases", key))
        return True


def resolve(defs: dict[str, Definition], locate: Locate | None = None) -> Resolved:
    """Resolve every definition in dependency order; collect (not raise) every error."""
    r = _Resolver(defs, locate)
    for name in defs:
        r.get(name)
    sources = {}
    for name, d in defs.items():
        if name in r.values:
            derived = d.source in ("default", "mode") and (
                _derived_kind(d.raw) or (isinstance(d.raw, (str, list, dict)) and list(iter_refs(d.raw)))
            )
            sources[name] = "derived" if derived else d.source
    # Keep the spec's order for people reading `engine plan`; errors sorted for stable output.
    values = {k: r.values[k] for k in defs if k in r.values}
    errors = sorted({str(e): e for e in r.errors}.values(), key=SpecError.sort_key)
    return Resolved(values, sources, errors)
