"""A figure (engine/show/plots.py) as a Mermaid `xychart-beta` block, which GitHub draws in a PR comment,
a job summary or a README with no image hosting.

Mermaid's xychart has limits the SVG does not, and this renderer says so rather than bend the data:
every `line` is a list of y values, one per x on a shared axis, with no gap and no legend. So
- the x axis is the union of the series' x values (a numeric range when they are consecutive
  integers, else one category per x);
- series that follow each other along x without overlapping (one leg, then the next) are joined
  into one line, and the notes under the block say which x belong to which series;
- a series with a gap, or one that covers only part of the axis with nothing to join it to, is
  left out of the chart with a note (the HTML report draws it);
- a horizontal marker is a constant line; a vertical one is named in the x axis title.
The y values are rounded to 5 significant digits (a chart shows no more, and 17-digit floats make its
source unreadable), written without exponents (Mermaid's grammar reads none); the x values and the
markers' x are exact, and the SVG (engine/show/svg.py) keeps every number as the evidence has it.
"""

from __future__ import annotations

from decimal import Decimal

from engine.show.plots import Figure, Number, Series, number_text
from engine.text import markdown_text

# Up to this many x values get a category each (a labelled tick per rank, say); more consecutive
# integers get a numeric range, whose ticks Mermaid spaces itself.
RANGE_MIN = 12


def plain(v: Number) -> str:
    """A number as Mermaid reads it: digits and a point, never an exponent."""
    text = number_text(v)
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    return text


# Significant digits of a y value in the chart.
Y_DIGITS = 5


def rounded(v: Number) -> str:
    """A y value as the chart draws it: a float to Y_DIGITS significant digits, an int as it is."""
    return plain(float(f"{v:.{Y_DIGITS}g}")) if isinstance(v, float) else plain(v)


def _quoted(text: str) -> str:
    # Mermaid's strings end at the next double quote and cannot escape one.
    return '"' + " ".join(text.replace('"', "'").split()) + '"'


def _consecutive(xs: list[Number]) -> bool:
    return all(isinstance(x, int) for x in xs) and all(b - a == 1 for a, b in zip(xs, xs[1:]))


def _range_text(xs: list[Number]) -> str:
    return number_text(xs[0]) if len(xs) == 1 else f"{number_text(xs[0])}-{number_text(xs[-1])}"


def lines(figure: Figure) -> tuple[list[Number], list[tuple[list[Series], list[Number]]], list[str]]:
    """(the x axis, the lines as (series joined, y values), notes on what the chart leaves out)."""
    notes: list[str] = []
    drawable = []
    for s in figure.series:
        if not s.drawn():
            continue
        if s.gaps():
            notes.append(
                f"{s.label}: not in this chart: it has gaps and Mermaid's xychart cannot draw "
                f"one (the HTML report does)"
            )
            continue
        drawable.append(s)
    axis = sorted({x for s in drawable for x, _ in s.points})
    chains: list[list[Series]] = []
    for s in drawable:
        first = s.points[0][0]
        for chain in chains:
            if chain[-1].points[-1][0] < first:
                chain.append(s)
                break
        else:
            chains.append([s])
    out = []
    for chain in chains:
        values = dict(p for s in chain for p in s.drawn())
        if len(values) != len(axis):
            for s in chain:
                notes.append(
                    f"{s.label}: not in this chart: it covers x {_range_text([x for x, _ in s.points])} "
                    f"of {_range_text(axis)}, and Mermaid's xychart cannot leave the rest empty "
                    f"(the HTML report draws it)"
                )
            continue
        out.append((chain, [values[x] for x in axis]))
    if not out:
        axis = []
    return axis, out, notes


def block(figure: Figure) -> str | None:
    """The xychart-beta source of the figure, or None when no series can be drawn."""
    axis, drawn, _ = lines(figure)
    if not drawn:
        return None
    x_title = figure.x_label
    vertical = [f"{', '.join(plain(v) for v in m.at)}: {m.label}" for m in figure.markers if m.axis == "x" and m.at]
    if vertical:
        x_title = f"{x_title} ({'; '.join(vertical)})" if x_title else "; ".join(vertical)
    if _consecutive(axis) and len(axis) > RANGE_MIN:
        x_axis = f"x-axis {_quoted(x_title)} {axis[0]} --> {axis[-1]}"
    else:
        x_axis = f"x-axis {_quoted(x_title)} [{', '.join(_quoted(plain(x)) for x in axis)}]"
    out = [
        "xychart-beta",
        f"    title {_quoted(figure.title)}",
        f"    {x_axis}",
        f"    y-axis {_quoted(figure.y_label)}",
    ]
    for chain, values in drawn:
        label = " + ".join(s.label for s in chain)
        out.append(f"    line {_quoted(label)} [{', '.join(rounded(v) for v in values)}]")
    for m in figure.markers:
        if m.axis == "y":
            for v in m.at:
                out.append(f"    line {_quoted(m.label)} [{', '.join(rounded(v) for _ in axis)}]")
    return "\n".join(out)


def markdown(figure: Figure, heading: str = "####") -> str:
    """The figure for a Markdown report: a heading, what to look for, then `chart`."""
    out = [f"{heading} {markdown_text(figure.title)}", ""]
    if figure.why:
        out += [markdown_text(" ".join(figure.why.split())), ""]
    return "\n".join(out) + "\n" + chart(figure)


def chart(figure: Figure) -> str:
    """The ```mermaid block, then what a reader of the chart must know: which x of each line is which
    series (`line 1: leg 1 at step 1-120, then leg 2 at step 121-180`), markers, gaps, missing data."""
    out = []
    source = block(figure)
    _, drawn, left_out = lines(figure)
    if source:
        out += ["```mermaid", source, "```", ""]
    x_name = figure.x_label or "x"
    legend = []
    for n, (chain, _) in enumerate(drawn if source else [], 1):
        parts = [f"{s.label} at {x_name} {_range_text([x for x, _ in s.points])}" for s in chain]
        legend.append(f"line {n}: " + ", then ".join(parts))
    n = len(drawn)
    for m in figure.markers:
        if m.axis == "y":
            for v in m.at:
                n += 1
                legend.append(
                    f"line {n}: {m.label} at {rounded(v)} (a marker)"
                    if source
                    else f"marker at y = {rounded(v)}: {m.label}"
                )
        elif m.at:
            legend.append(f"marker at x = {', '.join(plain(v) for v in m.at)}: {m.label}")
    notes = legend + left_out + figure.notes
    if not source:
        notes.insert(0, "nothing to draw")
    out += [f"- {markdown_text(note)}" for note in notes]  # notes quote the evidence
    return "\n".join(out).rstrip("\n") + "\n"


def section(figures: list[Figure]) -> str:
    """Every figure, for the end of `--markdown`; empty when the spec has no plots."""
    if not figures:
        return ""
    return "\n".join(["### Plots", ""] + [markdown(f) for f in figures])
