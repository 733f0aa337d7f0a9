"""Series compared within a tolerance, and per-step series checked for coverage: what allclose(),
first_difference(), max_abs_diff(), overlap(), restrict(), step_coverage() and by_step() compute
(engine/expr/functions.py registers them), and the explain text the tracer shows for such a call.

A series is a number, a list of numbers, or a step-keyed object (`{"1": 6.22, "2": 6.13}`). An object's
keys are walked in step order: integer keys by value (`"2"` before `"10"`), any other key after them, in
text order. Two series line up index by index (lists) or key by key (objects); a position that one
side lacks, a value that is not a number, a list against an object: each is a difference with a
name, never a Python exception. Two values that are not numbers (a digest, a list of sample ids) are
close when they are equal, exactly; a null never is. `b` is the reference: x is close to y when |x - y| <= atol + rtol x |y|
(numpy's rule). NaN is close to nothing, not even NaN; an infinity only to the same infinity.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable, Mapping

from engine import limits
from engine.text import compact

_INT = re.compile(r"[+-]?[0-9]{1,30}")  # a step key; 30 digits is past any run and far from int()'s limit
_ABSENT = object()  # one side has no value at this position
# Entries shown either side of a difference when an operand is too long to show whole.
AROUND = 2


class SeriesError(ValueError):
    """Values a series function cannot work with: a negative tolerance, a record without a step, a
    step logged twice with different values."""


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def step_of(key: Any) -> int | None:
    """The step an object key names (`"11"` -> 11); None for a key that is not an integer."""
    return int(key) if isinstance(key, str) and _INT.fullmatch(key) else None


def step_order(keys: Iterable[str]) -> list[str]:
    """Keys in step order: integers by value, then the others by text."""

    def order(key: str) -> tuple:
        step = step_of(key)
        return (0, step, key) if step is not None else (1, 0, key)

    return sorted(keys, key=order)


def number_text(x: Any) -> str:
    """A value as a sentence shows it: a float in full (4.2900001 must not read 4.29), NaN and the
    infinities as evidence.json names them."""
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if is_number(x):
        return repr(x)
    return compact(x, 60)


def _kind(x: Any) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "a boolean"
    if is_number(x):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(x), type(x).__name__)


def tolerances(rtol: Any, atol: Any) -> None:
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not (is_number(value) and math.isfinite(value) and value >= 0):
            raise SeriesError(f"{name} must be a finite number >= 0, got {number_text(value)}")


def apart(x: Any, y: Any, rtol: float, atol: float) -> str | None:
    """Why x is not close to the reference y; None when it is."""
    if not (is_number(x) or is_number(y)):
        # A digest or a list of sample ids is the same value or not; null never is (a trainer writes NaN so).
        if x is None or y is None:
            return "null is close to nothing"
        return None if x == y else "not the same value"
    if not (is_number(x) and is_number(y)):
        return f"{'a' if not is_number(x) else 'b'} is not a number"
    if math.isnan(x) or math.isnan(y):
        return "NaN is close to nothing"
    if math.isinf(x) or math.isinf(y):
        return None if x == y else "an infinity is close only to the same infinity"
    gap = abs(x - y)
    if gap <= atol + rtol * abs(y):
        return None
    return f"|d| {gap:.1e} > atol {atol:g} + rtol {rtol:g} x {abs(y):g}"


def _aligned(a: Any, b: Any) -> list[tuple[Any, Any, Any]] | str:
    """(position, a's value, b's value) in order, _ABSENT where a side lacks it; or why the two
    cannot be lined up."""
    if isinstance(a, list) and isinstance(b, list):
        return [
            (i, a[i] if i < len(a) else _ABSENT, b[i] if i < len(b) else _ABSENT) for i in range(max(len(a), len(b)))
        ]
    if isinstance(a, dict) and isinstance(b, dict):
        return [(k, a.get(k, _ABSENT), b.get(k, _ABSENT)) for k in step_order(set(a) | set(b))]
    return f"a is {_kind(a)}, b is {_kind(b)}: not two numbers, two lists or two objects"


def first_difference(a: Any, b: Any, rtol: float = 0, atol: float = 0) -> dict[str, Any] | None:
    """The first position where a and b differ, as {at, a, b, why} (`a`/`b` absent where that side
    has no value; `at` null for two numbers or two series that cannot be lined up); None when every
    position is close. Two empty series differ: there is nothing to compare."""
    tolerances(rtol, atol)
    if is_number(a) and is_number(b):
        why = apart(a, b, rtol, atol)
        return None if why is None else {"at": None, "a": a, "b": b, "why": why}
    pairs = _aligned(a, b)
    if isinstance(pairs, str):
        return {"at": None, "why": pairs}
    if not pairs:
        return {"at": None, "why": "both are empty: nothing to compare"}
    for at, x, y in pairs:
        if x is _ABSENT:
            return {"at": at, "b": y, "why": "only in b"}
        if y is _ABSENT:
            return {"at": at, "a": x, "why": "only in a"}
        why = apart(x, y, rtol, atol)
        if why is not None:
            return {"at": at, "a": x, "b": y, "why": why}
    return None


def allclose(a: Any, b: Any, rtol: float, atol: float) -> bool:
    return first_difference(a, b, rtol, atol) is None


def _gap(x: float, y: float) -> float:
    if math.isnan(x) or math.isnan(y):
        return math.nan
    if math.isinf(x) or math.isinf(y):
        return 0.0 if x == y else math.inf
    return abs(x - y)


def _gaps(a: Any, b: Any) -> list[tuple[Any, float]] | None:
    """(position, |a - b|) at every position; None unless both have a number at every position."""
    if is_number(a) and is_number(b):
        return [(None, _gap(a, b))]
    pairs = _aligned(a, b)
    if isinstance(pairs, str) or not pairs or not all(is_number(x) and is_number(y) for _, x, y in pairs):
        return None
    return [(at, _gap(x, y)) for at, x, y in pairs]


def _largest(gaps: list[tuple[Any, float]]) -> tuple[Any, float]:
    """The position of the largest gap; a NaN counts as the largest (it is close to nothing)."""
    return max(gaps, key=lambda g: (math.isnan(g[1]), g[1] if not math.isnan(g[1]) else 0))


def max_abs_diff(a: Any, b: Any) -> float | None:
    """The largest |a - b| over every position; NaN when any position has a NaN, Infinity when one
    holds an infinity against anything but the same infinity; null when the two do not line up
    number for number (a position only one side has, a non-number, nothing at all)."""
    gaps = _gaps(a, b)
    return None if gaps is None else _largest(gaps)[1]


def overlap(a: Any, b: Any) -> list[Any]:
    """The positions both have, in order: keys of two objects, indexes of two lists ([] otherwise)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return step_order(set(a) & set(b))
    if isinstance(a, list) and isinstance(b, list):
        return list(range(min(len(a), len(b))))
    return []


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if is_number(k) and math.isfinite(k) and float(k).is_integer():
        return str(int(k))
    raise SeriesError(f"a key is a string or an integer, got {number_text(k)}")


def restrict(obj: Mapping[str, Any], keys: list[Any]) -> dict[str, Any]:
    """`obj` limited to `keys` (numbers name steps: 11 is "11"), in step order; a key obj lacks is left out."""
    wanted = {_key(k) for k in keys}
    return {k: obj[k] for k in step_order(wanted) if k in obj}


def _integer(x: Any, what: str) -> int:
    if is_number(x) and math.isfinite(x) and float(x).is_integer():
        return int(x)
    raise SeriesError(f"{what} must be an integer, got {number_text(x)}")


def step_coverage(series: list[Any], first: Any, last: Any) -> dict[str, list[int]]:
    """Across the step-keyed objects (one per leg), the steps from first to last that no object has
    (`missing`), those more than one has (`repeated`), and those outside first..last (`outside`)."""
    lo, hi = _integer(first, "first"), _integer(last, "last")
    if lo > hi:
        raise SeriesError(f"first step {lo} is after last step {hi}")
    if hi - lo + 1 > limits.RANGE_MAX_TOTAL:
        raise SeriesError(f"{hi - lo + 1:,} steps from {lo} to {hi} (limit {limits.RANGE_MAX_TOTAL:,})")
    count: dict[int, int] = {}
    for i, one in enumerate(series):
        if not isinstance(one, dict):
            raise SeriesError(f"series [{i}] is {_kind(one)}, not a step-keyed object")
        for key in one:
            step = step_of(key)
            if step is None:
                raise SeriesError(f"series [{i}] has the key {json.dumps(key)}, which is not a step")
            count[step] = count.get(step, 0) + 1
    return {
        "missing": [n for n in range(lo, hi + 1) if n not in count],
        "repeated": sorted(n for n, c in count.items() if c > 1),
        "outside": sorted(n for n in count if not lo <= n <= hi),
    }


def _same(x: Any, y: Any) -> bool:
    if is_number(x) and is_number(y):
        return x == y or (math.isnan(x) and math.isnan(y))
    return json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)


def by_step(records: list[Any], field: str, key: str = "step") -> dict[str, Any]:
    """{step: value of `field`} from per-step records ({"step": 11, "loss": 4.31, ...}), in step order.
    A record without `field` is skipped (that step did not log it); one logged twice with the same
    value is one entry, with different values an error naming both."""
    out: dict[str, Any] = {}
    first_at: dict[str, int] = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise SeriesError(f"records[{i}] is {_kind(record)}, not an object")
        if key not in record:
            raise SeriesError(f"records[{i}] has no {key!r}: {compact(record, 80)}")
        step = str(_integer(record[key], f"records[{i}].{key}"))
        if field not in record:
            continue
        value = record[field]
        if step in out and not _same(out[step], value):
            raise SeriesError(
                f"step {step} is logged twice with different {field}: {number_text(out[step])} "
                f"(records[{first_at[step]}]) and {number_text(value)} (records[{i}])"
            )
        out.setdefault(step, value)
        first_at.setdefault(step, i)
    if records and not out:
        raise SeriesError(f"no record has {field!r} (records[0] has {', '.join(map(repr, records[0])) or 'no keys'})")
    return {k: out[k] for k in step_order(out)}


# ---------------------------------------------------------------- explain text


def _place(at: Any) -> str:
    if isinstance(at, int):
        return f"index {at}"
    return f"step {at}" if step_of(at) is not None else f"key {json.dumps(at)}"


def describe(diff: Mapping[str, Any]) -> str:
    """A first_difference() result as a sentence: where, both values, why."""
    at, why = diff.get("at"), diff["why"]
    if at is None:
        return f"{number_text(diff['a'])} vs {number_text(diff['b'])} ({why})" if "a" in diff else why
    where = f"first difference at {_place(at)}"
    if "a" not in diff or "b" not in diff:
        side = "a" if "a" in diff else "b"
        return f"{where}: only in {side} ({number_text(diff[side])})"
    return f"{where}: {number_text(diff['a'])} vs {number_text(diff['b'])} ({why})"


def _ranges(steps: list[int]) -> str:
    """[5, 7, 8, 9] -> "5, 7-9": a coverage list of thousands of steps reads in a line."""
    runs: list[list[int]] = []
    for n in steps:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:20]]
    return ", ".join(shown) + (f", ... ({len(runs) - 20} more runs)" if len(runs) > 20 else "")


def _max_where(a: Any, b: Any, result: Any) -> str:
    if result is None:
        diff = first_difference(a, b)
        return "null: " + (describe(diff) if diff is not None else "nothing to compare")
    at, _ = _largest(_gaps(a, b) or [])
    x, y = (a, b) if at is None else (a[at], b[at])
    where = "" if at is None else f" at {_place(at)}"
    shown = f"{result:.2e}" if math.isfinite(result) else number_text(result)  # 2.00e-02, not 0.019999999999999574
    return f"{shown}{where} ({number_text(x)} vs {number_text(y)})"


def explain(name: str, args: list[Any], result: Any) -> str | None:
    """What the explain trace shows for a call of `name` in place of its bare value (a `false` says
    nothing about where), or None to show the value as it is."""
    if name == "allclose" and result is False:
        diff = first_difference(*args)
        return None if diff is None else "false: " + describe(diff)
    if name == "max_abs_diff":
        return _max_where(args[0], args[1], result)
    if name == "step_coverage" and isinstance(result, dict):
        return "; ".join(f"{k} {_ranges(v) if v else 'none'}" for k, v in result.items())
    return None


def _difference_at(name: str, args: list[Any], result: Any) -> Any:
    """The position a comparison call points at: its first difference, or its largest gap."""
    if name == "first_difference":
        return result.get("at") if isinstance(result, dict) else None
    if name == "allclose" and result is False:
        diff = first_difference(*args)
        return diff.get("at") if diff else None
    if name == "max_abs_diff" and result is not None:
        gaps = _gaps(args[0], args[1])
        return _largest(gaps)[0] if gaps else None
    return None


def window(value: Any, at: Any, around: int = AROUND) -> str | None:
    """A long list or object shown around one position (`{...,"10":4.35,"11":4.31,"12":4.28,...}`);
    None when it is short enough to show whole, or `at` is no position of it."""
    if not isinstance(value, (dict, list)) or len(value) <= 2 * around + 1:
        return None
    if isinstance(value, dict) and isinstance(at, str):
        keys = step_order(set(value) | {at})
        i = keys.index(at)
        keys = [k for k in keys[max(i - around, 0) : i + around + 1] if k in value]
        shown = [f"{json.dumps(k)}:{compact(value[k], 60)}" for k in keys]
        order = step_order(value)
        head, tail = (keys and keys[0] != order[0]), (keys and keys[-1] != order[-1])
        brackets = "{}"
    elif isinstance(value, list) and isinstance(at, int) and not isinstance(at, bool):
        lo, hi = max(at - around, 0), min(at + around + 1, len(value))
        shown = [compact(v, 60) for v in value[lo:hi]]
        head, tail, brackets = lo > 0, hi < len(value), "[]"
    else:
        return None
    body = (["..."] if head else []) + shown + (["..."] if tail else [])
    return f"{brackets[0]}{','.join(body)}{brackets[1]} ({len(value)} entries)"


def windows(name: str, args: list[Any], result: Any) -> tuple[str | None, str | None]:
    """How a comparison call's two series are shown: each around the position the call points at."""
    at = _difference_at(name, args, result)
    if at is None or len(args) < 2:
        return None, None
    return window(args[0], at), window(args[1], at)


EXPLAINED = ("allclose", "first_difference", "max_abs_diff", "step_coverage")
