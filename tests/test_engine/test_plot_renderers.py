"""The renderers of plots: SVG (engine/show/svg.py), Mermaid (engine/show/mermaid.py) and the HTML report
(engine/show/html.py), against golden files, and read back: what is drawn is the evidence's numbers.

Regenerate the golden files after an intended change with SPECPROBE_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import html5lib
import pytest

from engine.cli import main
from engine.judge.verdict import judge
from engine.show import html as htmlreport
from engine.show import mermaid, svg
from engine.show.plots import for_spec
from engine.show.report import markdown
from engine.spec.load import load_spec
from engine.spec.plan import build_plan

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "plots"
PROBE = "tests/specs/plots/probe.yaml"
SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def probe(monkeypatch):
    """(evidence, results, verdict, figures) of the plots probe's saved evidence."""
    monkeypatch.chdir(ROOT)  # the report names spec files relative to the cwd
    spec = load_spec(PROBE)
    evidence = json.loads((GOLDEN / "evidence.json").read_text())
    results, verdict = judge(build_plan(spec), evidence)
    return evidence, results, verdict, for_spec(spec, evidence)


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SPECPROBE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file"


def strict_html(text: str):
    """The document parsed by a conforming HTML5 parser that raises on any parse error."""
    return html5lib.HTMLParser(strict=True, namespaceHTMLElements=False).parse(text)


def polylines(svg_root, series: str) -> list[list[tuple[float, float]]]:
    """The points of each polyline drawn for `series`, as numbers."""
    out = []
    for line in svg_root.iter():
        if line.tag.split("}")[-1] == "polyline" and line.get("data-series") == series:
            out.append([tuple(float(v) for v in p.split(",")) for p in line.get("points").split()])
    return out


def mermaid_lines(block: str) -> dict[str, list[float]]:
    return {
        m.group(1): [float(v) for v in m.group(2).split(", ")]
        for m in re.finditer(r'^    line "([^"]*)" \[([^\]]*)\]$', block, re.M)
    }


# ---------------------------------------------------------------- golden files, one per renderer


def test_svg_of_each_plot_matches_its_golden_file(probe):
    for figure in probe[3]:
        golden(f"{figure.name}.svg", svg.render(figure))


def test_mermaid_section_matches_its_golden_file(probe):
    golden("plots.md", mermaid.section(probe[3]))


def test_html_report_matches_its_golden_file(probe):
    golden("report.html", htmlreport.render(*probe))


# ---------------------------------------------------------------- what is drawn is the evidence


def test_svg_polylines_hold_the_evidence_numbers_and_break_at_a_gap(probe):
    evidence, *_, figures = probe
    loss = ET.fromstring(svg.render(figures[0]))
    assert polylines(loss, "leg 1") == [[(1, 6.25), (2, 5.5), (3, 4.75), (4, 4.0)]]
    # Step 6's loss is null: the line stops at 5 and starts again at 7, nothing is drawn at 6.
    assert polylines(loss, "leg 2") == [[(5, 3.875)], [(7, 3.5), (8, 3.25)]]
    marker = next(e for e in loss.iter(f"{SVG_NS}line") if e.get("class") == "marker")
    assert (marker.get("data-axis"), marker.get("data-at")) == ("x", "4")
    rate = ET.fromstring(svg.render(figures[1]))
    assert polylines(rate, "leg 2") == [[(5, 140)], [(8, 1e-05)]]
    memory = ET.fromstring(svg.render(figures[2]))
    assert polylines(memory, "leg 1") == [[(0, 2.5), (1, 2.75)]]
    assert polylines(memory, "leg 2") == []  # null: no line, not a line at zero
    assert "leg 2 (no data)" in svg.render(figures[2])


def test_svg_draws_the_points_where_the_transform_puts_them(probe):
    figure = probe[3][0]
    root = ET.fromstring(svg.render(figure))
    group = next(e for e in root.iter(f"{SVG_NS}g") if e.get("class") == "data")
    a, _, _, d, e, f = (float(v) for v in re.findall(r"-?[\d.]+", group.get("transform")))
    frame = next(e for e in root.iter(f"{SVG_NS}rect") if e.get("class") == "frame")
    left, top = float(frame.get("x")), float(frame.get("y"))
    right, bottom = left + float(frame.get("width")), top + float(frame.get("height"))
    for run in polylines(root, "leg 1") + polylines(root, "leg 2"):
        for x, y in run:
            assert left <= a * x + e <= right and top <= d * y + f <= bottom
    # Higher losses are drawn higher up (smaller pixel y): the y axis is not upside down.
    assert d < 0


def test_mermaid_lines_hold_the_evidence_numbers_without_exponents(probe):
    evidence, *_, figures = probe
    block = mermaid.block(figures[0])
    assert mermaid_lines(block) == {"leg 1": [6.25, 5.5, 4.75, 4.0]}
    assert 'x-axis "step (4: stop)" ["1", "2", "3", "4"]' in block
    assert mermaid.plain(1e-05) == "0.00001" and mermaid.plain(2.5e20) == "250000000000000000000"
    md = mermaid.markdown(figures[0])
    assert "leg 2: not in this chart: it has gaps" in md and "leg 2: no value at x = 6 (null)" in md
    memory = mermaid.block(figures[2])
    assert mermaid_lines(memory) == {"leg 1": [2.5, 2.75], "gate": [3.5, 3.5]}


def test_mermaid_joins_legs_that_follow_each_other_into_one_line(monkeypatch):
    monkeypatch.chdir(ROOT)
    evidence = json.loads((ROOT / "evidence" / "p4_soak" / "evidence.json").read_text())
    loss = for_spec(load_spec("specs/p4_soak.yaml"), evidence)[0]
    block = mermaid.block(loss)
    losses = (
        evidence["steps"]["leg1"]["harvest"]["run_json"]["losses"]
        | evidence["steps"]["leg2"]["harvest"]["run_json"]["losses"]
    )
    reference = evidence["steps"]["reference"]["harvest"]["run_json"]["losses"]
    # Each loss to 5 significant digits: the chart's source stays readable (the SVG keeps them exact). The
    # reference is a line of its own, the whole horizon; the legs are one line after the other.
    assert mermaid_lines(block) == {
        "reference (never stopped)": [float(f"{reference[str(s)]:.5g}") for s in range(1, 181)],
        "leg1 + leg2": [float(f"{losses[str(s)]:.5g}") for s in range(1, 181)],
    }
    assert "6.2225, 6.2097, 6.1926" in block and "6.222527027130127" not in block
    assert 'x-axis "step (120: stop / cold resume)" 1 --> 180' in block
    assert "line 2: leg1 at step 1-120, then leg2 at step 121-180" in mermaid.markdown(loss)


def test_mermaid_rounds_y_values_to_5_significant_digits_and_keeps_x_values_exact():
    assert [mermaid.rounded(v) for v in (6.222527027130127, 1.0, 123456.789, 1.23456789e-07, 3, 262144)] == [
        "6.2225",
        "1.0",
        "123460.0",
        "0.00000012346",
        "3",
        "262144",
    ]


def test_markdown_report_ends_with_the_plots(probe):
    evidence, results, verdict, figures = probe
    md = markdown(evidence, results, verdict, figures)
    assert md.index("| check |") < md.index("### Plots") < md.index("```mermaid")
    assert md.count("```mermaid") == 3  # each plot draws something; leg 2 of loss and rate only in the notes
    assert markdown(evidence, results, verdict) == markdown(evidence, results, verdict, [])


# ---------------------------------------------------------------- the HTML page


def test_html_report_is_valid_html5_with_one_svg_per_plot(probe):
    page = htmlreport.render(*probe)
    doc = strict_html(page)
    svgs = [e for e in doc.iter() if e.tag.split("}")[-1] == "svg"]
    assert [s.get("id") for s in svgs] == ["plot-loss", "plot-rate", "plot-memory"]
    assert all((s.get("width"), s.get("height")) == ("720", "360") for s in svgs)
    assert polylines(svgs[0], "leg 2") == [[(5, 3.875)], [(7, 3.5), (8, 3.25)]]


def test_html_report_loads_nothing_and_runs_nothing(probe):
    page = htmlreport.render(*probe)
    doc = strict_html(page)
    tags = {e.tag.split("}")[-1] for e in doc.iter()}
    assert not tags & {"script", "link", "img", "iframe", "object", "embed", "image", "use"}
    assert not [e for e in doc.iter() for k in e.attrib if k.split("}")[-1] in ("href", "src") or k.startswith("on")]
    assert re.findall(r"https?://[^\s\"'<>]+", page) == ["http://www.w3.org/2000/svg"] * 3
    assert "default-src 'none'" in page


def test_html_report_shows_the_failure_tree_and_escapes_text(probe):
    evidence, results, verdict, figures = probe
    failing = json.loads(json.dumps(evidence))
    failing["steps"]["leg2"]["harvest"]["run_json"]["final_step"] = 7
    failing["spec"]["name"] = 'a<b>&"c"'
    spec = load_spec(PROBE)
    results, verdict = judge(build_plan(spec), failing)
    page = htmlreport.render(failing, results, verdict, for_spec(spec, failing))
    strict_html(page)
    assert "a&lt;b&gt;&amp;&quot;c&quot;" in page and "<b>&" not in page
    tree = page[page.index('<section id="failures">') : page.index('<section id="plots">')]
    assert "leg2_finished" in tree and "steps.leg2.harvest.run_json.final_step = 7" in tree


def test_saved_soak_run_report_is_valid_and_draws_every_loss(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    run = tmp_path / "p4_soak"
    shutil.copytree(ROOT / "evidence" / "p4_soak", run)
    page_path = tmp_path / "report.html"
    assert main(["replay", "specs/p4_soak.yaml", "--evidence", str(run), "--html", str(page_path)]) == 0
    evidence = json.loads((run / "evidence.json").read_text())
    doc = strict_html(page_path.read_text())
    svgs = {e.get("id"): e for e in doc.iter() if e.tag.split("}")[-1] == "svg"}
    assert list(svgs) == ["plot-loss", "plot-tokens_per_s", "plot-peak_memory"]
    for leg in ("leg1", "leg2", "reference (never stopped)"):
        losses = evidence["steps"][leg.split()[0]]["harvest"]["run_json"]["losses"]
        drawn = polylines(svgs["plot-loss"], leg)
        assert drawn == [[(float(k), v) for k, v in losses.items()]]
    # The reference is drawn first (beneath), wide and grey; leg 1 keeps the first palette colour, on top.
    lines = [e for e in svgs["plot-loss"].iter() if e.tag.split("}")[-1] == "polyline"]
    shown = [(e.get("data-series"), e.get("stroke"), e.get("stroke-width")) for e in lines]
    assert shown == [
        ("reference (never stopped)", svg.UNDER_COLOUR, str(svg.UNDER_WIDTH)),
        ("leg1", svg.PALETTE[0], "1.5"),
        ("leg2", svg.PALETTE[1], "1.5"),
    ]
    # Tokens/s come from the progress lines the replay re-harvested out of the raw logs.
    log = (run / "logs" / "leg2.log").read_text()
    rates = [(float(s), float(r)) for s, r in re.findall(r"step (\d+)/180 loss \S+ lr \S+ tok/s (\d+)", log)]
    assert polylines(svgs["plot-tokens_per_s"], "leg2") == [rates] and len(rates) == 13
    # On the CPU there are no device memory figures: the plot says so instead of drawing zeros.
    assert polylines(svgs["plot-peak_memory"], "leg1") == []
    assert "leg1: no data: `steps.leg1.harvest.run_json.peak_reserved_gb_by_rank` is null" in page_path.read_text()


def test_html_and_markdown_both_on_stdout_is_refused(capsys):
    assert main(["check", PROBE, "--evidence", "x", "--html", "-", "--markdown", "-"]) == 2
    assert "would both print on stdout" in capsys.readouterr().err


def test_html_dash_prints_the_page_instead_of_the_table(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    run = tmp_path / "p4_soak"
    shutil.copytree(ROOT / "evidence" / "p4_soak", run)
    assert main(["check", "specs/p4_soak.yaml", "--evidence", str(run), "--html", "-"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("<!DOCTYPE html>") and "VERDICT p4_soak PASS" in out and "check  " not in out
    strict_html(out)


DOCS_CHART = re.compile(r"(<!-- chart: [^>]*-->\n)(.*?)(<!-- end of chart -->)", re.S)


def test_the_docs_show_the_saved_soak_runs_loss_plot(monkeypatch):
    """docs/running.md's Mermaid chart, and the lines under it, are the renderer's output for evidence/p4_soak,
    not a drawing (SPECPROBE_UPDATE_GOLDEN=1 writes them there)."""
    monkeypatch.chdir(ROOT)
    evidence = json.loads((ROOT / "evidence" / "p4_soak" / "evidence.json").read_text())
    loss = for_spec(load_spec("specs/p4_soak.yaml"), evidence)[0]
    page_path = ROOT / "docs" / "running.md"
    page = page_path.read_text()
    found = DOCS_CHART.search(page)
    assert found is not None, "docs/running.md lost its chart markers"
    if os.environ.get("SPECPROBE_UPDATE_GOLDEN"):
        page = page[: found.start(2)] + mermaid.chart(loss) + page[found.end(2) :]
        page_path.write_text(page)
        found = DOCS_CHART.search(page)
    assert found.group(2) == mermaid.chart(loss)
    assert "- line 2: leg1 at step 1-120, then leg2 at step 121-180" in found.group(2)
