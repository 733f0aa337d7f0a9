"""The one home of specprobe's custom JMESPath functions, and static analysis of expressions.

Every expression in a spec (check `expr`/`when`, step `when`, `{eval: ...}` values) is compiled with
`compile_expr` and evaluated with `OPTIONS`, so a function added here is available everywhere at once.
`problems(text)` rejects unknown functions and wrong arity before anything runs.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import re
import threading
from typing import Any, Iterator

import jmespath
from jmespath import exceptions as jexc
from jmespath import functions as jfn
from jmespath.functions import signature
from jmespath.lexer import Lexer

from engine import limits
from engine.expr import series

# A range() bigger than this is almost certainly a typo (a step count where a stride was meant), and
# materialising it would eat the machine before any check reports. One evaluation's range() calls
# share it (`evaluation()`), so `map(&range(...), range(...))` cannot multiply it either.
MAX_RANGE_LEN = limits.RANGE_MAX_TOTAL
_budget = threading.local()


@contextlib.contextmanager
def evaluation() -> Iterator[None]:
    """One expression's evaluation: the range() elements it may still make start at the limit."""
    saved = getattr(_budget, "left", None)
    _budget.left = MAX_RANGE_LEN
    try:
        yield
    finally:
        _budget.left = saved


class ExpressionTooDeep(jexc.JMESPathError):
    """An expression nested beyond what the parser (or the evaluator) can recurse through."""


class FunctionError(jexc.JMESPathError):
    """A custom function was called with values it cannot work with (e.g. range step 0)."""


def _bounded(result: Any, fname: str) -> Any:
    """An arithmetic result, refused when it is an integer too big to be a fact about a run
    (repeated mul() doubles the digits each time, and 8,000 digits cannot even be stored)."""
    if isinstance(result, int) and result.bit_length() > limits.INT_MAX_BITS:
        raise FunctionError(
            f"{fname}() result has {len(str(abs(result)))} digits (limit {int(limits.INT_MAX_BITS * math.log10(2))})"
        )
    return result


def _optional(*types: str) -> dict[str, Any]:
    # jmespath has no optional arguments, only variadic ones; `Functions._validate_arguments` honours this key.
    return {"types": list(types), "optional": True}


_is_number = series.is_number


@contextlib.contextmanager
def _series_errors(fname: str) -> Iterator[None]:
    """A series function's refusal, as the evaluation error a check reports (ERROR, with the reason)."""
    try:
        yield
    except series.SeriesError as e:
        raise FunctionError(f"{fname}(): {e}") from None


def member(obj: Any, key: Any) -> tuple[bool, Any]:
    """What get(obj, key) looks up: (whether obj has it, the key as a path names it: the text of an
    object's key, the integer index into an array). A number names an object's key by its JSON text
    (`11` is "11")."""
    if isinstance(obj, dict):
        name = key if isinstance(key, str) else json.dumps(key)
        return name in obj, name
    if isinstance(obj, list) and _is_number(key) and float(key).is_integer():
        i = int(key)
        return -len(obj) <= i < len(obj), i
    return False, key


def _as_int(x: Any, fname: str) -> int:
    if _is_number(x) and float(x).is_integer():
        return int(x)
    raise FunctionError(f"{fname}() expects integers, got {json.dumps(x)}")


class Functions(jfn.Functions):
    """JMESPath's built-ins plus specprobe's. Names are `_func_<name>`; see `functions_markdown()`."""

    def _validate_arguments(self, args, sig, function_name):  # jmespath's hook: its name and signature are jmespath's
        required = sum(1 for s in sig if not s.get("optional"))
        if any(s.get("optional") for s in sig):
            if not required <= len(args) <= len(sig):
                raise jexc.ArityError(len(sig), len(args), function_name)
            return self._type_check(args, sig[: len(args)], function_name)
        return super()._validate_arguments(args, sig, function_name)

    def _type_check(self, actual, sig, function_name):
        for i in range(min(len(sig), len(actual))):
            if sig[i]["types"]:
                self._type_check_single(actual[i], sig[i]["types"], function_name)

    @signature({"types": ["number"]}, {"types": ["number"]})
    def _func_add(self, a, b):
        """a + b. Example: ``add(stop1, `1`)`` with stop1=10 -> ``11``."""
        return _bounded(a + b, "add")

    @signature({"types": ["number"]}, {"types": ["number"]})
    def _func_sub(self, a, b):
        """a - b. Example: ``sub(steps, stop1)`` with 20, 10 -> ``10``."""
        return _bounded(a - b, "sub")

    @signature({"types": ["number"]}, {"types": ["number"]})
    def _func_mul(self, a, b):
        """a * b. Example: ``mul(steps, tps)`` with 20, 262144 -> ``5242880``."""
        bits = a.bit_length() + b.bit_length() if isinstance(a, int) and isinstance(b, int) else 0
        if bits > limits.INT_MAX_BITS + 1:
            # Refused before multiplying: the product of two huge integers takes its own time.
            raise FunctionError(
                f"mul() result would have about {int(bits * math.log10(2))} digits "
                f"(limit {int(limits.INT_MAX_BITS * math.log10(2))})"
            )
        return _bounded(a * b, "mul")

    @signature({"types": ["number"]}, {"types": ["number"]})
    def _func_div(self, a, b):
        """True division a / b; null when b is 0. Example: ``div(`7`, `2`)`` -> ``3.5``."""
        return None if b == 0 else a / b

    @signature({"types": ["number"]}, {"types": ["number"]})
    def _func_floordiv(self, a, b):
        """Floor division a // b; null when b is 0. Example: ``floordiv(`7`, `2`)`` -> ``3``."""
        return None if b == 0 else a // b

    @signature({"types": ["number"]}, {"types": ["number"]})
    def _func_mod(self, a, b):
        """Remainder a % b; null when b is 0. Example: ``mod(`7`, `2`)`` -> ``1``."""
        return None if b == 0 else a % b

    @signature({"types": ["number"]})
    def _func_exp(self, x):
        """e to the power x (a perplexity is the exp of its loss); Infinity where that overflows a float, NaN for NaN. Example: ``exp(`0`)`` -> ``1.0``."""
        try:
            return math.exp(x)
        except OverflowError:
            return math.inf

    @signature({"types": ["number"]})
    def _func_ln(self, x):
        """The natural logarithm of x (ln of the vocabulary size is the loss of a model that learned nothing); null when x is 0 or negative, NaN for NaN. Example: ``ln(`512`)`` -> ``6.238324625039508``."""
        if math.isnan(x):
            return x
        return math.log(x) if x > 0 else None

    @signature({"types": ["number"]})
    def _func_cos(self, x):
        """The cosine of x radians (a cosine learning-rate schedule's decay); NaN for an infinity or NaN. Example: ``cos(`3.141592653589793`)`` -> ``-1.0``."""
        return math.cos(x) if math.isfinite(x) else math.nan

    @signature({"types": ["number"]}, {"types": ["number"]}, _optional("number"))
    def _func_range(self, start, stop, step=1):
        """Integers from start up to (not including) stop. Example: ``range(`10`, `31`, `10`)`` -> ``[10, 20, 30]``."""
        start, stop, step = (_as_int(v, "range") for v in (start, stop, step))
        if step == 0:
            raise FunctionError("range() step must not be 0")
        n = len(range(start, stop, step))
        left = getattr(_budget, "left", None)
        left = MAX_RANGE_LEN if left is None else left
        if n > left:
            made = MAX_RANGE_LEN - left
            also = f" after {made:,} made by earlier range() calls" if made else ""
            raise FunctionError(f"range() would make {n:,} elements{also} (limit {MAX_RANGE_LEN:,} per expression)")
        if getattr(_budget, "left", None) is not None:
            _budget.left = left - n
        return list(range(start, stop, step))

    @signature({"types": []})
    def _func_to_int(self, x):
        """Integer value of a number or numeric string (truncated); null otherwise. Example: ``to_int('12')`` -> ``12``."""
        if _is_number(x):
            return int(x) if math.isfinite(x) else None
        if isinstance(x, str):
            try:
                return int(x.strip())
            except ValueError:
                try:
                    f = float(x.strip())
                except ValueError:
                    return None
                return int(f) if math.isfinite(f) else None
        return None

    @signature({"types": ["string", "null"]})
    def _func_suffix_int(self, s):
        """Trailing integer of a string; null if none. Example: ``suffix_int('checkpoint-120')`` -> ``120``."""
        if s is None:
            return None
        m = re.search(r"(\d+)$", s)
        return int(m.group(1)) if m else None

    @signature({"types": ["array"]})
    def _func_sort_numeric(self, items):
        """Sort numbers (or numeric strings) by value, not text. Example: ``sort_numeric(['120', '60'])`` -> ``['60', '120']``."""

        def key(x: Any) -> float:
            if _is_number(x):
                return float(x)
            if isinstance(x, str):
                try:
                    return float(x)
                except ValueError:
                    pass
            raise FunctionError(f"sort_numeric() cannot order {json.dumps(x)}")

        return sorted(items, key=key)

    @signature({"types": ["array"]})
    def _func_unique(self, items):
        """Drop repeated elements, keeping the first occurrence. Example: ``unique([`1`, `1`, `2`])`` -> ``[1, 2]``."""
        seen: set[str] = set()
        out = []
        for x in items:
            k = json.dumps(x, sort_keys=True)
            if k not in seen:
                seen.add(k)
                out.append(x)
        return out

    @signature({"types": ["string"]}, {"types": ["string"]})
    def _func_split(self, s, sep):
        """Split a string on a separator. Example: ``split('ckpt/checkpoint-10', '/')`` -> ``['ckpt', 'checkpoint-10']``."""
        if sep == "":
            raise FunctionError("split() separator must not be empty")
        return s.split(sep)

    @signature({"types": []})
    def _func_is_finite(self, x):
        """True for a finite number (not NaN/inf, not a boolean); false otherwise. Example: ``is_finite(`3.2`)`` -> ``true``."""
        return _is_number(x) and math.isfinite(x)

    @signature({"types": ["array"]})
    def _func_all_finite(self, items):
        """True if every element is a finite number; an EMPTY list is false (no evidence is not a pass). Example: ``all_finite([`1.5`, `2`])`` -> ``true``."""
        return bool(items) and all(_is_number(x) and math.isfinite(x) for x in items)

    @signature({"types": ["string"]}, {"types": ["string"]})
    def _func_regex_match(self, s, pattern):
        """Does the pattern occur in the string (a Python regex search; it gives up, an error, after 1 s). Example: ``regex_match('final/x', '^final/')`` -> ``true``."""
        import regex  # imported on first use: most checks never need it

        try:
            compiled = regex.compile(pattern)
        except (regex.error, ValueError, OverflowError, RecursionError) as e:
            raise FunctionError(f"regex_match(): bad pattern {pattern!r}: {e}") from None
        try:
            # The `regex` engine gives up after the timeout, and releases the interpreter while it
            # works: a catastrophic pattern must not stop the engine's own timeouts and signals.
            return compiled.search(s, timeout=limits.REGEX_TIMEOUT_S, concurrent=True) is not None
        except TimeoutError:
            raise FunctionError(
                f"regex_match(): pattern {pattern!r} gave up after "
                f"{limits.REGEX_TIMEOUT_S:g} s on a string of {len(s):,} characters "
                f"(catastrophic backtracking?)"
            ) from None

    @signature({"types": ["object", "array", "null"]}, {"types": ["string", "number"]})
    def _func_get(self, obj, key):
        """Member by a computed key (object) or index (array), as a path reads one: a key the object lacks (an index past the array's end) is missing data, so the check is NO_DATA, also compared with `null` (it gives null). Example: ``get(losses, to_string(stop1))`` -> the loss at step stop1."""
        found, name = member(obj, key)
        return obj[name] if found else None

    @signature({"types": ["string", "null"]}, {"types": ["array-string"]})
    def _func_startswith_any(self, s, prefixes):
        """Does the string start with any of the prefixes. Example: ``startswith_any('final/a', ['final/', 'ckpt/'])`` -> ``true``."""
        return s is not None and s.startswith(tuple(prefixes))

    @signature({"types": ["array"]}, {"types": ["array"]})
    def _func_difference(self, items, remove):
        """The elements of the first array that are not in the second, in order. Example: ``difference(['a', 'b'], ['b'])`` -> ``['a']``."""
        gone = {json.dumps(x, sort_keys=True) for x in remove}
        return [x for x in items if json.dumps(x, sort_keys=True) not in gone]

    # Series: numbers, lists and step-keyed objects ({"1": 6.22, "2": 6.13}); engine/expr/series.py.
    @signature({"types": []}, {"types": []}, {"types": ["number"]}, {"types": ["number"]})
    def _func_allclose(self, a, b, rtol, atol):
        """True when a and b (numbers, lists, or step-keyed objects, lined up key by key in step order) have the same positions and each value of a is within atol + rtol x |b| of b's. NaN is close to nothing (not even NaN), an infinity only to the same infinity; two values that are not numbers (a digest, a list of sample ids) only when equal, a null never; a position only one side has, a number against a non-number, a list against an object, or two empty series: false. Example: ``allclose(`{"1": 4.31, "2": 4.2}`, `{"2": 4.2, "1": 4.29}`, `0`, `0.05`)`` -> ``true``."""
        with _series_errors("allclose"):
            return series.allclose(a, b, rtol, atol)

    @signature({"types": []}, {"types": []}, _optional("number"), _optional("number"))
    def _func_first_difference(self, a, b, rtol=0, atol=0):
        """Where allclose(a, b, rtol, atol) fails first (exact without the tolerances): {at, a, b, why}, with `a` or `b` left out where that side has no value and `at` null for two numbers or two series that do not line up; null when none. Example: ``first_difference(`{"10": 4.3, "11": 4.31}`, `{"10": 4.3, "11": 4.29}`)`` -> ``{"at": "11", "a": 4.31, "b": 4.29, "why": "|d| 2.0e-02 > atol 0 + rtol 0 x 4.29"}``."""
        with _series_errors("first_difference"):
            return series.first_difference(a, b, rtol, atol)

    @signature({"types": []}, {"types": []})
    def _func_max_abs_diff(self, a, b):
        """The largest |a - b| over every position of two numbers, lists or step-keyed objects: NaN when a position holds a NaN, Infinity when one holds an infinity against anything but the same infinity; null when they do not line up number for number (a position only one side has, a non-number, two empty series). Example: ``max_abs_diff([`1.0`, `2.5`], [`1.0`, `2.0`])`` -> ``0.5``."""
        return series.max_abs_diff(a, b)

    @signature({"types": ["object", "array"]}, {"types": ["object", "array"]})
    def _func_overlap(self, a, b):
        """The positions both have, in order: the keys of two objects (in step order: "2" before "10") or the indexes of two lists; [] for a list and an object. Example: ``overlap(`{"10": 1, "11": 2}`, `{"11": 2, "2": 0, "10": 1}`)`` -> ``["10", "11"]``."""
        return series.overlap(a, b)

    @signature({"types": ["object"]}, {"types": ["array"]})
    def _func_restrict(self, obj, keys):
        """The object limited to the keys (numbers name steps: 11 is "11"), in step order; a key it lacks is left out. Example: ``restrict(`{"1": 6.2, "11": 4.3, "12": 4.2}`, ['11', '12'])`` -> ``{"11": 4.3, "12": 4.2}``."""
        with _series_errors("restrict"):
            return series.restrict(obj, keys)

    @signature({"types": ["array"]}, {"types": ["number"]}, {"types": ["number"]})
    def _func_step_coverage(self, legs, first, last):
        """Over a list of step-keyed objects (one per leg), the steps from first to last that none has (`missing`), that more than one has (`repeated`), and that lie outside first..last (`outside`); a key that is not an integer is an error. Example: ``step_coverage([`{"1": 6.2, "2": 6.1}`, `{"2": 6.1, "4": 5.9}`], `1`, `4`)`` -> ``{"missing": [3], "repeated": [2], "outside": []}``."""
        with _series_errors("step_coverage"):
            return series.step_coverage(legs, first, last)

    @signature({"types": ["array"]}, {"types": ["string"]}, _optional("string"))
    def _func_by_step(self, records, field, key="step"):
        """A step-keyed object from per-step records (a `pick: all` harvest: [{"step": 1, "loss": 6.2}, ...]): each record's `field` under its `key` (default "step"). A step logged twice with the same value is one entry; with different values, an error naming the step and both values; a record without `field` is skipped, but no record at all having it is an error. Example: ``by_step([`{"step": 1, "loss": 6.2}`, `{"step": 2, "loss": 6.1}`], 'loss')`` -> ``{"1": 6.2, "2": 6.1}``."""
        with _series_errors("by_step"):
            return series.by_step(records, field, key)


OPTIONS = jmespath.Options(custom_functions=Functions())

# What each function can return (JMESPath type names; "any" when it depends on the data): `engine
# validate` refuses a check whose top-level call can never give a boolean. Every function, built-in or
# specprobe's, must be listed (a test holds this).
RETURNS: dict[str, tuple[str, ...]] = {
    "add": ("number",),
    "sub": ("number",),
    "mul": ("number",),
    "div": ("number", "null"),
    "floordiv": ("number", "null"),
    "mod": ("number", "null"),
    "exp": ("number",),
    "ln": ("number", "null"),
    "cos": ("number",),
    "range": ("array",),
    "to_int": ("number", "null"),
    "suffix_int": ("number", "null"),
    "sort_numeric": ("array",),
    "unique": ("array",),
    "split": ("array",),
    "is_finite": ("boolean",),
    "all_finite": ("boolean",),
    "regex_match": ("boolean",),
    "get": ("any",),
    "startswith_any": ("boolean",),
    "difference": ("array",),
    "allclose": ("boolean",),
    "first_difference": ("object", "null"),
    "max_abs_diff": ("number", "null"),
    "overlap": ("array",),
    "restrict": ("object",),
    "step_coverage": ("object",),
    "by_step": ("object",),
    # JMESPath's own
    "abs": ("number",),
    "avg": ("number", "null"),
    "ceil": ("number",),
    "contains": ("boolean",),
    "ends_with": ("boolean",),
    "floor": ("number",),
    "join": ("string",),
    "keys": ("array",),
    "length": ("number",),
    "map": ("array",),
    "max": ("number", "string", "null"),
    "max_by": ("any",),
    "merge": ("object",),
    "min": ("number", "string", "null"),
    "min_by": ("any",),
    "not_null": ("any",),
    "reverse": ("array", "string"),
    "sort": ("array",),
    "sort_by": ("array",),
    "starts_with": ("boolean",),
    "sum": ("number",),
    "to_array": ("array",),
    "to_number": ("number", "null"),
    "to_string": ("string",),
    "type": ("string",),
    "values": ("array",),
}


def returns(name: str) -> tuple[str, ...] | None:
    """The JMESPath types a function can return; None when unknown or data-dependent ("any")."""
    types = RETURNS.get(name)
    return None if types is None or "any" in types else types


_CUSTOM = sorted(n[len("_func_") :] for n in vars(Functions) if n.startswith("_func_"))


def compile_expr(text: str) -> Any:
    """Compile a JMESPath expression (raises jmespath's ParseError/LexerError on bad syntax,
    ExpressionTooDeep past what the parser can recurse through)."""
    try:
        return jmespath.compile(text)
    except RecursionError:
        raise ExpressionTooDeep(f"nested too deeply to parse (limit {limits.EXPR_MAX_DEPTH} levels)") from None


def search(parsed: Any, data: Any) -> Any:
    """Evaluate a compiled expression with specprobe's functions."""
    try:
        with evaluation():
            return parsed.search(data, options=OPTIONS)
    except RecursionError:
        raise ExpressionTooDeep("nested too deeply to evaluate") from None


def depth(parsed: Any) -> int:
    """Nesting depth of a compiled expression's syntax tree (iterative: the tree may be deep)."""
    deepest, stack = 0, [(parsed.parsed, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((c, level + 1) for c in node.get("children", []) if isinstance(c, dict))
    return deepest


def _walk(node: dict) -> Iterator[dict]:
    yield node
    for child in node.get("children", []):
        if isinstance(child, dict):
            yield from _walk(child)


def function_calls(parsed: Any) -> list[tuple[str, int]]:
    """Every function call in a compiled expression, as (name, number of arguments), in AST order."""
    return [(n["value"], len(n["children"])) for n in _walk(parsed.parsed) if n.get("type") == "function_expression"]


def arity(name: str) -> tuple[int, float] | None:
    """(min, max) argument count of a known function, None if unknown."""
    entry = OPTIONS.custom_functions.FUNCTION_TABLE.get(name)
    if entry is None:
        return None
    sig = entry["signature"]
    if sig and sig[-1].get("variadic"):
        return len(sig), math.inf
    return sum(1 for s in sig if not s.get("optional")), len(sig)


def known_functions() -> list[str]:
    return sorted(OPTIONS.custom_functions.FUNCTION_TABLE)


def _arity_text(lo: int, hi: float) -> str:
    if hi == math.inf:
        return f"at least {lo}"
    return str(lo) if lo == hi else f"{lo} to {int(hi)}"


# What JMESPath writes in backticks and reads, without them, as a field of that name.
LITERAL_WORDS = ("null", "true", "false")


def bare_literals(text: str) -> list[str]:
    """A message for an expression that writes null, true or false without backticks where a value
    is read: JMESPath reads each as a field of that name (absent, so null), never as the literal, so
    `x == true` is false when x is true and `x == null` asks about a field. The message shows the
    expression as it should be written. A word after a dot (`a.null`), a key of a multi-select
    (`{null: a}`) and a quoted identifier (`"null"`) are field names on purpose and pass."""
    try:
        tokens = list(Lexer().tokenize(text))
    except jexc.JMESPathError:
        return []  # the syntax error is reported on its own
    bare = [
        t
        for i, t in enumerate(tokens)
        if t["type"] == "unquoted_identifier"
        and t["value"] in LITERAL_WORDS
        and not (i and tokens[i - 1]["type"] == "dot")
        and tokens[i + 1]["type"] not in ("colon", "lparen")
    ]
    if not bare:
        return []
    fixed = text
    for t in reversed(bare):
        fixed = fixed[: t["start"]] + f"`{t['value']}`" + fixed[t["end"] :]
    words = list(dict.fromkeys(t["value"] for t in bare))
    literals = " and ".join(f"`{w}`" for w in words)
    if len(words) == 1:
        what = f"bare {words[0]} is a JMESPath field name (it reads a field called {words[0]}), not the literal"
    else:
        what = f"bare {' and '.join(words)} are JMESPath field names, not literals"
    return [f"{what}: write {literals} in backticks: {fixed}"]


def problems(text: str) -> list[str]:
    """Why an expression would fail before any data is seen: syntax, unknown functions, wrong arity,
    a bare null/true/false.

    Empty list means it is fine. Messages are complete sentences ready to follow a location.
    """
    try:
        parsed = compile_expr(text)
    except jexc.JMESPathError as e:
        return [f"invalid JMESPath {_short(text)}: {' '.join(str(e).split())}"]
    levels = depth(parsed)
    if levels > limits.EXPR_MAX_DEPTH:
        return [f"expression {_short(text)} is nested {levels} levels deep (limit {limits.EXPR_MAX_DEPTH})"]
    out = bare_literals(text)
    for name, n in function_calls(parsed):
        rng = arity(name)
        if rng is None:
            near = difflib.get_close_matches(name, known_functions(), n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            out.append(f"unknown function {name}() in {text!r}{hint}")
        elif not rng[0] <= n <= rng[1]:
            out.append(f"{name}() takes {_arity_text(*rng)} argument(s), {n} given in {text!r}")
    return out


def _short(text: str, limit: int = 200) -> str:
    """An expression quoted for an error message, cut when it is huge."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text):,} characters)"


_CHAIN_HEAD = (
    "subexpression",
    "index_expression",
    "projection",
    "value_projection",
    "filter_projection",
    "flatten",
    "pipe",
)


def _chain(node: dict) -> tuple[tuple[str, ...], bool]:
    """Longest plain field chain a node starts with at the current context, and whether it IS that chain."""
    t = node.get("type")
    if t == "field":
        return (node["value"],), True
    if t == "subexpression":
        names: tuple[str, ...] = ()
        for i, child in enumerate(node["children"]):
            if i == 0:
                names, whole = _chain(child)
                if not whole:
                    return names, False
            elif child.get("type") == "field":
                names += (child["value"],)
            else:
                return names, False
        return names, True
    if t in _CHAIN_HEAD and node.get("children"):
        return _chain(node["children"][0])[0], False
    return (), False


def root_paths(parsed: Any) -> list[tuple[str, ...]]:
    """Field chains read from the ROOT of the data, e.g. ``steps.leg1.rc == `0` `` -> [('steps','leg1','rc')].

    Parts evaluated against projected elements or a pipe's result (filter conditions, right-hand sides,
    `&expr`) are not root reads and are left out.
    """
    out: list[tuple[str, ...]] = []

    def visit(node: dict) -> None:
        t = node.get("type")
        if t in ("field", "subexpression") or t in _CHAIN_HEAD:
            names, _ = _chain(node)
            if names:
                out.append(names)
            elif t in _CHAIN_HEAD and node.get("children"):
                visit(node["children"][0])  # e.g. `(a || b).c`: the head reads the root
            return
        if t == "expref":
            return
        for child in node.get("children", []):
            if isinstance(child, dict):
                visit(child)

    visit(parsed.parsed)
    return out


def _doc_parts(fn: Any) -> tuple[str, str]:
    doc = " ".join((fn.__doc__ or "").split())
    text, _, example = doc.partition("Example: ")
    return text.strip(), example.strip()


def _signature_text(name: str) -> str:
    sig = OPTIONS.custom_functions.FUNCTION_TABLE[name]["signature"]
    parts = []
    for s in sig:
        t = "|".join(s["types"]) or "any"
        parts.append(f"[{t}]" if s.get("optional") else t)
    return f"{name}({', '.join(parts)})"


def functions_markdown() -> str:
    """A Markdown table of specprobe's custom functions (the README embeds it)."""
    rows = ["| function | what it does | example |", "|---|---|---|"]
    for name in _CUSTOM:
        text, example = _doc_parts(getattr(Functions, "_func_" + name))
        # GFM splits table cells on `|` even inside code spans unless it is escaped.
        cells = [f"`{_signature_text(name)}`", text, example]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"
