"""Plots as data: a spec's `plots:` evaluated over the evidence into figures (series of points,
markers and notes) that the renderers draw (engine/show/svg.py, engine/show/mermaid.py, engine/show/html.py).

The engine knows series and markers, never what they measure. A plot's series and markers are
JMESPath over the same evidence document the checks read, traced the same way, so a series whose
data is absent says which path was missing. Missing data never becomes a number: an absent series
is "no data", a null or non-finite value is a gap in its line, and each says so in a note.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from engine.expr.functions import OPTIONS
from engine.expr.trace import check_document, index_paths, trace
from engine.secrets import redact
from engine.spec.plotdefs import MarkerDef, PlotDef
from engine.text import compact

Number = Union[int, float]
# How many x values a gap note names before it says "and N more".
NOTE_XS = 8

_INT = re.compile(r"^[+-]?\d+$")


# ---------------------------------------------------------------- figures (over the evidence)


@dataclass
class Series:
    label: str
    expr: str
    # Sorted by x; a None y is a gap (the value was null, not finite or not a number).
    points: list[tuple[Number, Number | None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    under: bool = False  # drawn beneath the others, wide and pale (the run they are compared with)

    def drawn(self) -> list[tuple[Number, Number]]:
        return [(x, y) for x, y in self.points if y is not None]

    def runs(self) -> list[list[tuple[Number, Number]]]:
        """The drawn points split at every gap: one line each."""
        out: list[list[tuple[Number, Number]]] = [[]]
        for x, y in self.points:
            if y is None:
                if out[-1]:
                    out.append([])
            else:
                out[-1].append((x, y))
        return [run for run in out if run]

    def gaps(self) -> list[Number]:
        return [x for x, y in self.points if y is None]


@dataclass
class Marker:
    axis: str
    label: str
    expr: str
    at: list[Number] = field(default_factory=list)


@dataclass
class Figure:
    name: str
    title: str
    why: str
    x_label: str
    y_label: str
    series: list[Series]
    markers: list[Marker]
    notes: list[str]
    file: str | None = None
    line: int | None = None

    def has_data(self) -> bool:
        return any(s.drawn() for s in self.series)


def is_number(v: Any) -> bool:
    """A finite int or float (not a boolean): what can be drawn."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def number_text(v: Number) -> str:
    """The exact text of a number as the renderers write it (repr round-trips a float)."""
    return str(v) if isinstance(v, int) else repr(float(v))


def _key_number(key: str) -> Number | None:
    if _INT.match(key.strip()):
        return int(key)
    try:
        v = float(key)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _why_not(v: Any) -> str:
    """Why a y value is a gap."""
    if v is None:
        return "null"
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return f"not a number: {compact(v, 40)}"


def _xs_text(xs: Sequence[Number]) -> str:
    shown = ", ".join(number_text(x) for x in xs[:NOTE_XS])
    return shown + (f" and {len(xs) - NOTE_XS} more" if len(xs) > NOTE_XS else "")


def _evaluate(expr: str, document: Any, paths: dict[int, tuple]) -> tuple[Any, str | None, list[str]]:
    """(value, why there is none, missing paths) of one expression over the document."""
    try:
        value, missing, _ = trace(expr, document, OPTIONS, explain=False, paths=paths)
    except Exception as exc:  # a plugin function may raise anything; a plot never crashes a report
        missing = getattr(exc, "missing", [])
        if missing:
            return None, f"no data: {missing[0]} is missing", missing
        return None, f"not drawn: `{expr}` failed: {type(exc).__name__}: {' '.join(str(exc).split())}", []
    if value is None:
        return None, f"no data: {missing[0]} is missing" if missing else f"no data: `{expr}` is null", missing
    return value, None, missing


def _pairs(value: Any, expr: str) -> tuple[list[tuple[Any, Any]], list[str]] | str:
    """(x, y) pairs as given, and notes on x values that cannot be placed; or why `value` is not a
    series at all."""
    notes: list[str] = []
    if isinstance(value, Mapping):
        out = []
        for key, y in value.items():
            x = _key_number(str(key))
            if x is None:
                notes.append(f"key {compact(key, 40)} is not a number: skipped")
            else:
                out.append((x, y))
        return out, notes
    if isinstance(value, list):
        if value and all(isinstance(item, list) and len(item) == 2 for item in value):
            out = []
            for x, y in value:
                if is_number(x):
                    out.append((x, y))
                else:
                    notes.append(f"x {compact(x, 40)} is not a number: [{compact(x, 40)}, {compact(y, 40)}] skipped")
            return out, notes
        if all(not isinstance(item, (list, dict)) for item in value):
            return list(enumerate(value)), notes
    return f"not drawn: `{expr}` gave {compact(value, 60)}; a series is {{x: y}}, [[x, y], ...] or [y, ...]"


def series_of(label: str, expr: str, document: Any, paths: dict[int, tuple], under: bool = False) -> Series:
    """One series over the (check_document-ed) evidence, with its notes."""
    series = Series(label, expr, under=under)
    value, problem, missing = _evaluate(expr, document, paths)
    if problem:
        series.notes.append(problem)
        return series
    shaped = _pairs(value, expr)
    if isinstance(shaped, str):
        series.notes.append(shaped)
        return series
    pairs, notes = shaped
    series.notes.extend(notes)
    if missing:
        series.notes.append(
            ", ".join(missing[:3])
            + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            + (" is" if len(missing) == 1 else " are")
            + " missing"
        )
    by_x: dict[Number, Any] = {}
    repeated: list[Number] = []
    for x, y in pairs:
        if x in by_x:
            repeated.append(x)
        by_x[x] = y
    if repeated:
        series.notes.append(f"x = {_xs_text(sorted(set(repeated)))} given more than once: the last value is drawn")
    gaps: dict[str, list[Number]] = {}
    for x in sorted(by_x):
        y = by_x[x]
        if is_number(y):
            series.points.append((x, y))
        else:
            series.points.append((x, None))
            gaps.setdefault(_why_not(y), []).append(x)
    for why, xs in gaps.items():
        series.notes.append(f"no value at x = {_xs_text(xs)} ({why}): a gap, not drawn")
    if not series.points:
        series.notes.append(f"no data: `{expr}` is empty")
    return series


def marker_of(definition: MarkerDef, document: Any, paths: dict[int, tuple]) -> tuple[Marker, list[str]]:
    marker = Marker(definition.axis, definition.label, definition.at)
    value, problem, _ = _evaluate(definition.at, document, paths)
    if problem:
        return marker, [problem]
    items = value if isinstance(value, list) else [value]
    notes = []
    for item in items:
        if is_number(item):
            marker.at.append(item)
        else:
            notes.append(f"not drawn at {compact(item, 40)}: not a number")
    return marker, notes


def figure_of(definition: PlotDef, document: Any, paths: dict[int, tuple] | None = None) -> Figure:
    """One plot over a document already passed through `check_document`."""
    paths = index_paths(document) if paths is None else paths
    series = [series_of(s.label, s.points, document, paths, s.under) for s in definition.series]
    notes = [f"{s.label}: {note}" for s in series for note in s.notes]
    markers = []
    for m in definition.markers:
        marker, marker_notes = marker_of(m, document, paths)
        markers.append(marker)
        notes += [f"marker {m.label or m.at}: {note}" for note in marker_notes]
    return Figure(
        name=definition.name,
        title=definition.title,
        why=definition.why,
        x_label=definition.x_label,
        y_label=definition.y_label,
        series=series,
        markers=markers,
        notes=notes,
        file=definition.file,
        line=definition.line,
    )


def figures(plots: Sequence[PlotDef], evidence: Mapping[str, Any]) -> list[Figure]:
    """Every plot over the evidence (a live run's or a saved one: both read the same document)."""
    if not plots:
        return []
    document = check_document(evidence)
    paths = index_paths(document)
    return [figure_of(p, document, paths) for p in plots]


def for_spec(spec: Any, evidence: Mapping[str, Any]) -> list[Figure]:
    """The figures of a loaded spec's plots over `evidence`: what `engine run`, `check` and
    `replay` render, and what `engine review` can call on a saved run. The plots are the plan's for
    the run (its mode, its overrides): a `for_each` series draws every element the run had."""
    from engine.spec.plan import replan

    plan = replan(spec, evidence, environ={})
    # A value the run did not record (a spec newer than the run, e.g. a list of its stops for a
    # marker) is read from the spec; every value the run recorded stays the run's.
    values = {**redact(plan.values, plan.secret_names), **(evidence.get("values") or {})}
    return figures(plan.plots, {**evidence, "values": values})
