"""A spec's `plots:` as definitions: each plot's series and markers as JMESPath text, with the file and
line it is written at. Evaluating them over the evidence is engine/show/plots.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SeriesDef:
    label: str
    points: str  # JMESPath: {x: y}, [[x, y], ...] or [y, ...]


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


def definitions(data: Mapping[str, Any], locate: Any = None) -> list[PlotDef]:
    """The `plots:` of a loaded (schema-valid) spec, in order; `locate` is `Spec.locate_key`, which
    gives each plot the file and line its name is written at."""
    out = []
    for name, raw in (data.get("plots") or {}).items():
        file, line = locate(("plots", name))[:2] if locate else (None, None)
        markers = []
        for m in raw.get("markers") or []:
            axis = "x" if "x" in m else "y"
            markers.append(MarkerDef(axis, m[axis], m.get("label") or ""))
        out.append(
            PlotDef(
                name=name,
                title=raw.get("title") or name,
                why=raw.get("why") or "",
                x_label=(raw.get("x") or {}).get("label", ""),
                y_label=(raw.get("y") or {}).get("label", ""),
                series=tuple(SeriesDef(s["label"], s["points"]) for s in raw.get("series") or []),
                markers=tuple(markers),
                file=file,
                line=line,
            )
        )
    return out


def expressions(data: Mapping[str, Any]) -> Iterable[tuple[tuple, str]]:
    """(spec path, text) of every JMESPath in `plots:`, for `engine validate`."""
    for name, raw in (data.get("plots") or {}).items():
        if not isinstance(raw, Mapping):
            continue
        for i, s in enumerate(raw.get("series") or []):
            if isinstance(s, Mapping) and isinstance(s.get("points"), str):
                yield ("plots", name, "series", i, "points"), s["points"]
        for i, m in enumerate(raw.get("markers") or []):
            for axis in ("x", "y"):
                if isinstance(m, Mapping) and isinstance(m.get(axis), str):
                    yield ("plots", name, "markers", i, axis), m[axis]
