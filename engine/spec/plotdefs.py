"""A spec's `plots:` as definitions for one mode: each plot's series and markers as JMESPath text, with
the file and line it is written at; a series declared `for_each` element of a list of values is one
series per element, `${x}` spliced into its points as into a check (engine/spec/expand.py).
Evaluating them over the evidence is engine/show/plots.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.spec import expand


@dataclass(frozen=True)
class SeriesDef:
    label: str
    points: str  # JMESPath: {x: y}, [[x, y], ...] or [y, ...]
    at: tuple = field(default=(), compare=False)  # where its `points` is written (for validation)
    under: bool = False  # drawn beneath the others, wide and pale: the run they are compared with


@dataclass(frozen=True)
class MarkerDef:
    axis: str  # "x" (a vertical line) or "y" (a horizontal one)
    at: str  # JMESPath: a number or a list of numbers
    label: str


@dataclass(frozen=True)
class PlotDef:
    name: str
    title: str
    why: str
    x_label: str
    y_label: str
    series: tuple[SeriesDef, ...]
    markers: tuple[MarkerDef, ...] = ()
    file: str | None = None
    line: int | None = None


def _series(raw: Any, path: tuple, values: Mapping[str, Any] | None) -> tuple[list[SeriesDef], list[expand.Problem]]:
    """One series as written: every element of its `for_each` (or itself), `${x}` spliced into its
    points and the element's references into its label. Without values, nothing is templated."""
    at = path + ("points",)
    if values is None:
        return [SeriesDef(raw["label"], raw["points"], at, bool(raw.get("under")))], []
    elements: list[expand.Element | None] = [None]
    if raw.get("for_each"):
        found, problems = expand.elements(raw["for_each"], values, path + ("for_each",))
        if problems:
            return [], problems
        elements = list(found)
    out, problems = [], []
    for element in elements:
        owner = f"series {element.name('')}" if element else ""
        points, problem = expand.splice(raw["points"], values, at, element, owner)
        try:
            label = expand.bind(raw["label"], element, splice=False)
        except ValueError as e:
            problems.append((path + ("label",), f"in {owner}: {e}"))
            continue
        if problem:
            problems.append(problem)
            continue
        out.append(SeriesDef(label, points, at, bool(raw.get("under"))))
    return out, problems


def resolve(
    data: Mapping[str, Any], values: Mapping[str, Any] | None = None, locate: Any = None
) -> tuple[list[PlotDef], list[expand.Problem]]:
    """The `plots:` of a loaded (schema-valid) spec, in order, for the mode whose `values` are given
    (None: as written, for a spec whose series use neither `for_each` nor `${x}`); `locate` is
    `Spec.locate_key`, which gives each plot the file and line its name is written at."""
    out, problems = [], []
    if values is not None:
        declared = [
            (("plots", name, "series", i), s.get("for_each"))
            for name, raw in (data.get("plots") or {}).items()
            for i, s in enumerate(raw.get("series") or [])
        ]
        too_many = expand.over_limit(declared, values, ("plot series", "series"))
        if too_many:
            return [], [too_many]
    for name, raw in (data.get("plots") or {}).items():
        file, line = locate(("plots", name))[:2] if locate else (None, None)
        markers = []
        for m in raw.get("markers") or []:
            axis = "x" if "x" in m else "y"
            markers.append(MarkerDef(axis, m[axis], m.get("label") or ""))
        series: list[SeriesDef] = []
        for i, s in enumerate(raw.get("series") or []):
            found, bad = _series(s, ("plots", name, "series", i), values)
            series += found
            problems += bad
        out.append(
            PlotDef(
                name=name,
                title=raw.get("title") or name,
                why=raw.get("why") or "",
                x_label=(raw.get("x") or {}).get("label", ""),
                y_label=(raw.get("y") or {}).get("label", ""),
                series=tuple(series),
                markers=tuple(markers),
                file=file,
                line=line,
            )
        )
    return out, problems


def expressions(data: Mapping[str, Any]) -> Iterable[tuple[tuple, str]]:
    """(spec path, text) of every JMESPath in `plots:` that is JMESPath as written, for `engine
    validate` (a series with `for_each` or `${x}` is checked per mode, once spliced)."""
    for name, raw in (data.get("plots") or {}).items():
        if not isinstance(raw, Mapping):
            continue
        for i, s in enumerate(raw.get("series") or []):
            if not isinstance(s, Mapping) or s.get("for_each") or not isinstance(s.get("points"), str):
                continue
            if not expand.templated(s["points"]):
                yield ("plots", name, "series", i, "points"), s["points"]
        for i, m in enumerate(raw.get("markers") or []):
            for axis in ("x", "y"):
                if isinstance(m, Mapping) and isinstance(m.get(axis), str):
                    yield ("plots", name, "markers", i, axis), m[axis]
