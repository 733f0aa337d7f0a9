"""A figure (engine/show/plots.py) as one self-contained SVG line chart: no script, no external reference.

Each series is drawn inside one group whose transform maps data to pixels, so a polyline's
`points` are the evidence's own numbers (exactly as JSON gave them) and a reader, or a test, can
read them back. A gap in a series ends its polyline; the next drawn point starts a new one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Sequence

from engine.show.plots import Figure, Number, number_text

WIDTH, HEIGHT = 720, 360
LEFT, RIGHT, BOTTOM = 70, 20, 50
LEGEND_ROW = 18
FONT_PX = 12
CHAR_PX = 6.6  # average advance of a 12 px sans-serif character, for laying out the legend
# Distinguishable in colour and in grey; the series take them in order.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
MARKER_COLOUR = "#444444"
# A series drawn `under` the others (the run they are compared with): wide and pale, so that a line
# over it where the two coincide is seen on it, and it is seen beside that line where they part.
UNDER_COLOUR, UNDER_WIDTH = "#b0b0b0", 6
GRID_COLOUR = "#e6e6e6"
# Few enough points that each is worth a dot.
DOT_MAX_POINTS = 40


def _fmt(v: float) -> str:
    """Pixel and transform numbers: enough digits for the drawing, nothing more."""
    text = f"{v:.6f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def nice_step(span: float, target: int = 6) -> float:
    """A 1, 2, 2.5 or 5 times a power of ten step giving about `target` ticks over `span`."""
    raw = span / max(target - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw * (1 - 1e-9):
            return m * mag
    return 10 * mag


def _decimals(step: float) -> int:
    d = max(0, -math.floor(math.log10(step)))
    return d + 1 if round(step / 10**-d, 6) % 1 else d


def axis(values: Sequence[Number], integer: bool, pad_few: bool = False) -> tuple[float, float, list[float], int]:
    """(low, high, ticks, decimals) of an axis covering `values` with round tick marks."""
    if not values:
        return 0.0, 1.0, [], 0  # no data: a bare frame, no invented scale
    lo, hi = float(min(values)), float(max(values))
    if hi == lo:
        half = 1.0 if integer or lo == 0 else abs(lo) * 0.1
        lo, hi = lo - half, hi + half
    step = nice_step(hi - lo)
    if integer:
        step = max(1.0, math.ceil(step))
    low, high = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
    decimals = 0 if integer else _decimals(step)
    ticks = [round(low + i * step, decimals + 2) for i in range(int(round((high - low) / step)) + 1)]
    if pad_few and len(set(values)) <= 10:
        # A handful of points (ranks, say) would sit on the frame; leave half a step either side.
        low, high = low - step / 2, high + step / 2
    return low, high, ticks, decimals


def colours(figure: Figure) -> list[str]:
    """Each series' colour: the palette in order over the series drawn on top, grey for one drawn under
    (which takes no palette colour, so the legs keep theirs with or without it)."""
    out, i = [], 0
    for s in figure.series:
        if s.under:
            out.append(UNDER_COLOUR)
        else:
            out.append(PALETTE[i % len(PALETTE)])
            i += 1
    return out


def _legend(figure: Figure) -> list[tuple[str, str, bool, bool]]:
    """(text, colour, dashed, has data) of each legend entry."""
    out = []
    for s, colour in zip(figure.series, colours(figure)):
        out.append((s.label if s.drawn() else f"{s.label} (no data)", colour, False, bool(s.drawn())))
    for m in figure.markers:
        at = ", ".join(number_text(v) for v in m.at)
        out.append((f"{m.label} ({at})" if at else f"{m.label} (no data)", MARKER_COLOUR, True, bool(m.at)))
    return out


def _legend_rows(entries: list[tuple[str, str, bool, bool]], width: float) -> list[list[int]]:
    rows: list[list[int]] = [[]]
    used = 0.0
    for i, (text, *_rest) in enumerate(entries):
        need = 28 + len(text) * CHAR_PX + 16
        if rows[-1] and used + need > width:
            rows.append([])
            used = 0.0
        rows[-1].append(i)
        used += need
    return [r for r in rows if r]


@dataclass
class _Frame:
    """The plot area in pixels and the data range it shows: data -> pixel coordinates."""

    left: int
    right: int
    top: int
    bottom: int
    x0: float
    y0: float
    sx: float
    sy: float

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) * self.sx

    def py(self, y: float) -> float:
        return self.bottom - (y - self.y0) * self.sy


def render(figure: Figure, element_id: str | None = None) -> str:
    """The figure as an <svg> element (valid inline in HTML5 and as a standalone .svg file)."""
    ident = element_id or f"plot-{figure.name}"
    entries = _legend(figure)
    rows = _legend_rows(entries, WIDTH - LEFT - RIGHT)
    top = 14 + LEGEND_ROW * len(rows)
    left, right, bottom = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM

    xs = [x for s in figure.series for x, _ in s.points] + [v for m in figure.markers if m.axis == "x" for v in m.at]
    ys = [y for s in figure.series for _, y in s.drawn()] + [v for m in figure.markers if m.axis == "y" for v in m.at]
    integer_x = all(isinstance(x, int) or float(x).is_integer() for x in xs)
    x0, x1, xticks, xdec = axis(xs, integer=integer_x, pad_few=True)
    y0, y1, yticks, ydec = axis(ys, integer=False)
    frame = _Frame(left, right, top, bottom, x0, y0, (right - left) / (x1 - x0), (bottom - top) / (y1 - y0))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" id="{escape(ident)}" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-labelledby="{escape(ident)}-title" '
        f'font-family="sans-serif" font-size="{FONT_PX}">',
        f'<title id="{escape(ident)}-title">{escape(figure.title)}</title>',
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
    ]
    out += _axes(figure, frame, (xticks, xdec), (yticks, ydec))
    out += _series(figure, frame)
    out += _markers(figure, frame)
    if not figure.has_data():
        out.append(
            f'<text class="no-data" x="{_fmt((left + right) / 2)}" y="{_fmt((top + bottom) / 2)}" '
            f'text-anchor="middle" font-size="16" fill="#888888">no data (see the notes)</text>'
        )
    out += _legend_lines(entries, rows)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _axes(figure: Figure, fr: _Frame, x: tuple[list[float], int], y: tuple[list[float], int]) -> list[str]:
    """Grid, frame, tick labels and axis labels; `x` and `y` are each axis's (ticks, decimals)."""
    (xticks, xdec), (yticks, ydec) = x, y
    left, right, top, bottom = fr.left, fr.right, fr.top, fr.bottom
    out = [f'<g class="grid" stroke="{GRID_COLOUR}" stroke-width="1">']
    out += [f'<line x1="{_fmt(fr.px(t))}" y1="{top}" x2="{_fmt(fr.px(t))}" y2="{bottom}"/>' for t in xticks]
    out += [f'<line x1="{left}" y1="{_fmt(fr.py(t))}" x2="{right}" y2="{_fmt(fr.py(t))}"/>' for t in yticks]
    out.append("</g>")
    out.append(
        f'<rect class="frame" x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
        f'fill="none" stroke="#999999"/>'
    )
    out.append('<g class="ticks" fill="#333333">')
    out += [f'<text x="{_fmt(fr.px(t))}" y="{bottom + 16}" text-anchor="middle">{t:.{xdec}f}</text>' for t in xticks]
    out += [f'<text x="{left - 6}" y="{_fmt(fr.py(t) + 4)}" text-anchor="end">{t:.{ydec}f}</text>' for t in yticks]
    out.append("</g>")
    out.append(
        f'<text class="x-label" x="{_fmt((left + right) / 2)}" y="{HEIGHT - 12}" text-anchor="middle" '
        f'fill="#111111">{escape(figure.x_label)}</text>'
    )
    out.append(
        f'<text class="y-label" x="16" y="{_fmt((top + bottom) / 2)}" text-anchor="middle" fill="#111111" '
        f'transform="rotate(-90 16 {_fmt((top + bottom) / 2)})">{escape(figure.y_label)}</text>'
    )
    return out


def _series(figure: Figure, fr: _Frame) -> list[str]:
    """Each series' lines, in data coordinates (polyline points are the evidence's numbers), and its dots."""
    a, e = fr.sx, fr.left - fr.x0 * fr.sx
    d, f = -fr.sy, fr.bottom + fr.y0 * fr.sy
    out = [f'<g class="data" transform="matrix({_fmt(a)} 0 0 {_fmt(d)} {_fmt(e)} {_fmt(f)})">']
    drawn = list(zip(figure.series, colours(figure)))
    # The series drawn under go first: SVG paints in document order.
    for s, colour in [d for d in drawn if d[0].under] + [d for d in drawn if not d[0].under]:
        width = UNDER_WIDTH if s.under else 1.5
        for run in s.runs():
            points = " ".join(f"{number_text(x)},{number_text(y)}" for x, y in run)
            out.append(
                f'<polyline class="series" data-series="{escape(s.label)}" points="{points}" fill="none" '
                f'stroke="{colour}" stroke-width="{width}" stroke-linejoin="round" '
                f'vector-effect="non-scaling-stroke"/>'
            )
    out.append("</g>")
    # Dots in pixels (a circle in data coordinates would be squashed into an ellipse): every point of
    # a short series, and a point a gap left alone, which a line cannot show.
    out.append('<g class="dots">')
    for s, colour in drawn:
        if s.under:
            continue  # its wide line is the mark; a dot under each leg's would hide theirs
        runs = s.runs()
        few = sum(len(r) for r in runs) <= DOT_MAX_POINTS
        for run in runs:
            if few or len(run) == 1:
                out += [
                    f'<circle cx="{_fmt(fr.px(x))}" cy="{_fmt(fr.py(y))}" r="{3 if len(run) > 1 else 3.5}" fill="{colour}"/>'
                    for x, y in run
                ]
    out.append("</g>")
    return out


def _markers(figure: Figure, fr: _Frame) -> list[str]:
    """Each marker's dashed line across the plot, with its label."""
    out = [
        f'<g class="markers" stroke="{MARKER_COLOUR}" stroke-width="1.2" stroke-dasharray="6 4" fill="{MARKER_COLOUR}">'
    ]
    for m in figure.markers:
        for v in m.at:
            label = escape(m.label)
            if m.axis == "x":
                out.append(
                    f'<line class="marker" data-axis="x" data-at="{number_text(v)}" x1="{_fmt(fr.px(v))}" '
                    f'y1="{fr.top}" x2="{_fmt(fr.px(v))}" y2="{fr.bottom}"/>'
                )
                out.append(f'<text x="{_fmt(fr.px(v) + 4)}" y="{fr.top + 14}" stroke="none">{label}</text>')
            else:
                out.append(
                    f'<line class="marker" data-axis="y" data-at="{number_text(v)}" x1="{fr.left}" '
                    f'y1="{_fmt(fr.py(v))}" x2="{fr.right}" y2="{_fmt(fr.py(v))}"/>'
                )
                out.append(
                    f'<text x="{fr.right - 4}" y="{_fmt(fr.py(v) - 5)}" text-anchor="end" stroke="none">{label}</text>'
                )
    out.append("</g>")
    return out


def _legend_lines(entries: list[tuple[str, str, bool, bool]], rows: list[list[int]]) -> list[str]:
    out = ['<g class="legend">']
    for r, row in enumerate(rows):
        x, y = float(LEFT), 12 + r * LEGEND_ROW + 2
        for i in row:
            text, colour, dashed, has = entries[i]
            dash = ' stroke-dasharray="6 4"' if dashed else ""
            out.append(
                f'<line x1="{_fmt(x)}" y1="{y}" x2="{_fmt(x + 22)}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/>'
            )
            out.append(
                f'<text x="{_fmt(x + 28)}" y="{y + 4}" fill="{"#111111" if has else "#888888"}">{escape(text)}</text>'
            )
            x += 28 + len(text) * CHAR_PX + 16
    out.append("</g>")
    return out
