"""Two loaded checkpoints compared leaf by leaf, group by group, into one JSON document.

A checkpoint is loaded (probes/ckpt/formats.py) as groups (model, optimizer, scheduler, rng, trainer_state), each a
flat ``{name: leaf}`` mapping. A leaf is a tensor, a numpy array, a list of numbers, a number, or another plain value
(a string, a bool, None). Numbers are compared with ``|a - b| <= atol + rtol * |b|`` (B is the reference, as in
numpy's ``allclose``); a NaN is never equal or close to anything, an infinity only to the same infinity. Anything
else is compared with ``==``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

GROUPS = ("model", "optimizer", "scheduler", "rng", "trainer_state")
NAMES_SHOWN = 50  # names listed per group and side (only_in_a, ...); the count is always whole


@dataclass
class Part:
    """One group of one checkpoint: its leaves, the files they came from, and what could not be read."""

    leaves: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # files this group comes from that the checkpoint lacks
    errors: list[str] = field(default_factory=list)  # files present but unreadable: "path: why"


@dataclass
class Loaded:
    """A checkpoint as its format loader read it."""

    format: str
    path: str
    parts: dict[str, Part] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)  # groups the format never has, and why
    notes: list[str] = field(default_factory=list)  # files not compared, and why
    unsafe: list[str] = field(default_factory=list)  # files loaded with full pickle (trust_pickle)
    default_ignore: list[str] = field(default_factory=list)
    error: str | None = None  # the checkpoint as a whole could not be read: nothing of it is compared

    def part(self, group: str) -> Part:
        return self.parts.setdefault(group, Part())


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists as ``{"a.b.0.c": leaf}``; a list of plain numbers stays one leaf (a vector)."""
    out: dict[str, Any] = {}

    def walk(o: Any, name: str) -> None:
        if isinstance(o, Mapping) and o:
            for k, v in o.items():
                walk(v, f"{name}.{k}" if name else str(k))
        elif isinstance(o, (list, tuple)) and o and not all(_plain_number(x) for x in o):
            for i, v in enumerate(o):
                walk(v, f"{name}.{i}" if name else str(i))
        else:
            out[name] = list(o) if isinstance(o, tuple) else o

    walk(obj, prefix)
    return out


def _plain_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _as_tensor(x: Any) -> torch.Tensor | None:
    """A numeric leaf as a tensor (None when it is not numeric)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if hasattr(x, "dtype") and hasattr(x, "tobytes") and hasattr(x, "shape"):  # numpy
        try:
            return torch.from_numpy(x.copy()) if x.dtype.kind in "biuf" else None
        except TypeError:
            return None
    if _plain_number(x) or (isinstance(x, list) and x and all(_plain_number(v) for v in x)):
        try:
            return torch.tensor(x, dtype=torch.float64 if _any_float(x) else torch.int64)
        except (OverflowError, RuntimeError):  # an int past int64: compared as a plain value
            return None
    return None


def _any_float(x: Any) -> bool:
    return isinstance(x, float) or (isinstance(x, list) and any(isinstance(v, float) for v in x))


@dataclass
class LeafResult:
    name: str
    equal: bool
    close: bool
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    first_unequal: dict[str, Any] | None = None
    first_not_close: dict[str, Any] | None = None
    nonfinite: int = 0
    reason: str | None = None


def _element(t: torch.Tensor, flat_index: int) -> list[int]:
    return [int(i) for i in torch.unravel_index(torch.tensor(flat_index), t.shape)] if t.dim() else []


def compare_numeric(name: str, a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> LeafResult:
    if tuple(a.shape) != tuple(b.shape):
        reason = f"shape {list(a.shape)} vs {list(b.shape)}"
        return LeafResult(name, False, False, reason=reason)
    fa, fb = a.reshape(-1), b.reshape(-1)
    if fa.dtype == torch.bool:
        fa, fb = fa.to(torch.uint8), fb.to(torch.uint8)
    same_dtype = a.dtype == b.dtype
    da, db = fa.to(torch.float64), fb.to(torch.float64)
    if fa.dtype.is_floating_point or fb.dtype.is_floating_point:
        eq = da == db  # NaN is never equal, an infinity equals itself
    else:
        eq = fa.to(torch.int64) == fb.to(torch.int64)  # integers exactly, past 2**53 too
    close = eq | (torch.isfinite(da) & torch.isfinite(db) & ((da - db).abs() <= atol + rtol * db.abs()))
    both = torch.isfinite(da) & torch.isfinite(db)
    diff = (da - db).abs()[both]
    rel_ok = both & (db != 0)
    result = LeafResult(
        name,
        equal=bool(eq.all()) and same_dtype,
        close=bool(close.all()),
        max_abs_diff=float(diff.max()) if diff.numel() else 0.0,
        max_rel_diff=float(((da - db).abs() / db.abs())[rel_ok].max()) if bool(rel_ok.any()) else 0.0,
        nonfinite=int((~torch.isfinite(da) | ~torch.isfinite(db)).sum()) if fa.dtype.is_floating_point else 0,
        reason=None if same_dtype else f"dtype {a.dtype} vs {b.dtype}".replace("torch.", ""),
    )
    for mask, attr in ((eq, "first_unequal"), (close, "first_not_close")):
        bad = (~mask).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            setattr(result, attr, {"index": _element(a, i), "a": fa[i].item(), "b": fb[i].item()})
    if result.first_unequal is None and not same_dtype:
        result.first_unequal = {"index": None, "a": str(a.dtype), "b": str(b.dtype)}
    return result


def compare_leaf(name: str, a: Any, b: Any, rtol: float, atol: float) -> LeafResult:
    ta, tb = _as_tensor(a), _as_tensor(b)
    if ta is not None and tb is not None:
        return compare_numeric(name, ta, tb, rtol, atol)
    if (ta is None) != (tb is None):
        reason = f"{_kind(a)} vs {_kind(b)}"
        shown = {"index": None, "a": _plain(a), "b": _plain(b)}
        return LeafResult(name, False, False, first_unequal=shown, first_not_close=shown, reason=reason)
    same = type(a) is type(b) and a == b
    shown = None if same else {"index": None, "a": _plain(a), "b": _plain(b)}
    return LeafResult(name, same, same, first_unequal=shown, first_not_close=shown)


def _kind(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor {list(x.shape)}"
    return type(x).__name__


def _plain(x: Any) -> Any:
    """A value as JSON can carry it (a long one cut)."""
    if x is None or isinstance(x, (bool, int, float)):
        return x
    text = x if isinstance(x, str) else repr(x)
    return text if len(text) <= 200 else text[:200] + f"... [{len(text) - 200} more characters]"


def ignored(full_name: str, group: str, patterns: Sequence[str]) -> bool:
    """A glob over ``group.name`` (``optimizer.state.*.exp_avg``), or the group's bare name (``rng``)."""
    return any(fnmatch.fnmatchcase(full_name, p) or fnmatch.fnmatchcase(group, p) for p in patterns)


def _shown(names: Iterable[str]) -> dict[str, Any]:
    names = list(names)
    return {"count": len(names), "names": names[:NAMES_SHOWN]}


def compare_group(group: str, pa: Part, pb: Part, rtol: float, atol: float, patterns: Sequence[str]) -> dict[str, Any]:
    """One group's verdict: counts, flags, the largest difference and the first differing leaf."""
    doc: dict[str, Any] = {
        "files": {"a": pa.files, "b": pb.files},
        "missing": {"a": pa.missing, "b": pb.missing},
        "error": "; ".join(pa.errors + pb.errors) or None,
    }
    keep_a = {n: v for n, v in pa.leaves.items() if not ignored(f"{group}.{n}", group, patterns)}
    keep_b = {n: v for n, v in pb.leaves.items() if not ignored(f"{group}.{n}", group, patterns)}
    n_ignored = len(set(pa.leaves) | set(pb.leaves)) - len(set(keep_a) | set(keep_b))
    only_a = [n for n in keep_a if n not in keep_b]
    only_b = [n for n in keep_b if n not in keep_a]
    results = [compare_leaf(n, v, keep_b[n], rtol, atol) for n, v in keep_a.items() if n in keep_b]
    complete = not (pa.missing or pb.missing or doc["error"] or only_a or only_b)
    biggest = max((r for r in results if r.max_abs_diff is not None), key=lambda r: r.max_abs_diff, default=None)
    unequal = next((r for r in results if not r.equal), None)
    not_close = next((r for r in results if not r.close), None)
    doc.update(
        {
            "equal": complete and all(r.equal for r in results),
            "close": complete and all(r.close for r in results),
            "count": len(results),
            "numel": {"a": _numel(keep_a), "b": _numel(keep_b)},
            "n_equal": sum(r.equal for r in results),
            "n_close": sum(r.close for r in results),
            "n_differ": sum(not r.close for r in results),
            "n_ignored": n_ignored,
            "n_nonfinite": sum(r.nonfinite for r in results),
            "max_abs_diff": biggest.max_abs_diff if biggest else None,
            "max_abs_diff_name": biggest.name if biggest and biggest.max_abs_diff else None,
            "max_rel_diff": max((r.max_rel_diff for r in results if r.max_rel_diff is not None), default=None),
            "first_difference": _first(unequal, "first_unequal"),
            "first_not_close": _first(not_close, "first_not_close"),
            "only_in_a": _shown(only_a),
            "only_in_b": _shown(only_b),
        }
    )
    return doc


def _numel(leaves: dict[str, Any]) -> int:
    """How many numbers a side's tensors hold (the group's size, read from the checkpoint, not from its owner)."""
    return sum(v.numel() for v in leaves.values() if isinstance(v, torch.Tensor))


def _first(r: LeafResult | None, attr: str) -> dict[str, Any] | None:
    if r is None:
        return None
    where = getattr(r, attr) or {}
    return {"name": r.name, **where, "max_abs_diff": r.max_abs_diff, "reason": r.reason}


def compare_loaded(
    a: Loaded, b: Loaded, *, rtol: float, atol: float, ignore: Sequence[str], default_ignore: bool = True
) -> dict[str, Any]:
    """The comparison document of two loaded checkpoints of one format."""
    defaults = sorted(set(a.default_ignore) | set(b.default_ignore)) if default_ignore else []
    patterns = [*ignore, *defaults]
    groups = [g for g in GROUPS if g in a.parts or g in b.parts] + sorted((set(a.parts) | set(b.parts)) - set(GROUPS))
    out_groups: dict[str, Any] = {}
    skipped: list[str] = []
    for g in groups:
        if any(fnmatch.fnmatchcase(g, p) for p in patterns):
            skipped.append(g)  # ignored whole, missing files and all
            continue
        out_groups[g] = compare_group(g, a.parts.get(g, Part()), b.parts.get(g, Part()), rtol, atol, patterns)
    differing = [g for g, d in out_groups.items() if not d["equal"]]
    first = next(({"group": g, **d["first_difference"]} for g, d in out_groups.items() if d["first_difference"]), None)
    not_close = next(
        ({"group": g, **d["first_not_close"]} for g, d in out_groups.items() if d["first_not_close"]), None
    )
    return {
        "format": a.format,
        "a": a.path,
        "b": b.path,
        "rtol": rtol,
        "atol": atol,
        "ignore": list(ignore),
        "default_ignore": defaults,
        "ignored_groups": skipped,
        "error": None,
        "equal": bool(out_groups) and not differing,
        "close": bool(out_groups) and all(d["close"] for d in out_groups.values()),
        "differing_groups": differing,
        "not_close_groups": [g for g, d in out_groups.items() if not d["close"]],
        "first_difference": first,
        "first_not_close": not_close,
        "groups": out_groups,
        "absent_groups": {**b.absent, **a.absent},
        "not_compared": sorted(set(a.notes) | set(b.notes)),
        "unsafe_loads": a.unsafe + b.unsafe,
    }


def error_doc(
    message: str, *, fmt: str | None, a: str, b: str, rtol: float, atol: float, ignore: Sequence[str]
) -> dict:
    """The document of a comparison that could not be made: the same keys, ``error`` saying why."""
    return {
        "format": fmt,
        "a": a,
        "b": b,
        "rtol": rtol,
        "atol": atol,
        "ignore": list(ignore),
        "default_ignore": [],
        "ignored_groups": [],
        "error": message,
        "equal": False,
        "close": False,
        "differing_groups": [],
        "not_close_groups": [],
        "first_difference": None,
        "first_not_close": None,
        "groups": {},
        "absent_groups": {},
        "not_compared": [],
        "unsafe_loads": [],
    }
