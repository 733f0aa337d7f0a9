"""The HTML report of the saved soak run in a real browser: headless Chromium (Debian's package,
installed by .ci/run) loads it, and the test reads what a person would see: no console error,
nothing fetched, each plot at its drawn size with its lines inside it, and a screenshot.

Outside CI a machine without Chromium skips this test; under CI (CI=true) a missing Chromium fails it,
so a broken install step cannot pass unnoticed.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from browser import chromium_path, render

from engine.cli import main
from engine.show.svg import HEIGHT, WIDTH

ROOT = Path(__file__).resolve().parents[2]

MEASURE = """[...document.querySelectorAll('svg.plot')].map(svg => {
  const box = svg.getBoundingClientRect();
  const lines = [...svg.querySelectorAll('polyline')].map(p => {
    const b = p.getBoundingClientRect();
    return [p.getAttribute('data-series'), b.left - box.left, b.top - box.top, b.width, b.height];
  });
  return {id: svg.id, width: svg.clientWidth, height: svg.clientHeight, lines: lines};
})"""


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])


@pytest.fixture
def chromium() -> str:
    path = chromium_path()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing under CI: .ci/run should have installed Debian's package")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return path


def test_saved_soak_report_renders_in_chromium_with_its_plots_drawn(chromium, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    run = tmp_path / "p4_soak"
    shutil.copytree(ROOT / "evidence" / "p4_soak", run)
    page = tmp_path / "report.html"
    assert main(["replay", "specs/p4_soak.yaml", "--evidence", str(run), "--html", str(page)]) == 0
    capsys.readouterr()

    seen = render(page.as_uri(), MEASURE, tmp_path / "profile")
    (tmp_path / "report.png").write_bytes(seen.png)

    assert seen.loaded and seen.title == "p4_soak (soak): PASS"
    assert seen.errors() == [], seen.console
    assert seen.requests == [page.as_uri()]  # the page itself, nothing else
    plots = {p["id"]: p for p in seen.measured}
    assert list(plots) == ["plot-loss", "plot-tokens_per_s", "plot-peak_memory"]
    for plot in plots.values():
        assert (plot["width"], plot["height"]) == (WIDTH, HEIGHT), plot["id"]
        for series, left, top, width, height in plot["lines"]:
            # Drawn, and inside its frame (not collapsed to a point, not thrown off the chart).
            assert width > 50 and height > 20, (plot["id"], series, width, height)
            assert 0 <= left and left + width <= WIDTH and 0 <= top and top + height <= HEIGHT
    # The run that never stopped is drawn first, under the legs, across the whole horizon.
    assert [line[0] for line in plots["plot-loss"]["lines"]] == ["reference (never stopped)", "leg1", "leg2"]
    assert [line[0] for line in plots["plot-tokens_per_s"]["lines"]] == ["leg1", "leg2"]
    assert plots["plot-peak_memory"]["lines"] == []  # no device memory on the CPU: nothing drawn
    # Leg 2's loss is drawn to the right of leg 1's (steps 121-180 after 1-120), both within the reference's span.
    reference, leg1, leg2 = plots["plot-loss"]["lines"]
    assert leg2[1] >= leg1[1] + leg1[3] - 1
    assert reference[1] <= leg1[1] + 1 and reference[1] + reference[3] >= leg2[1] + leg2[3] - 1
    width, height = png_size(seen.png)
    assert width == 1100 and height > 3 * HEIGHT


WRAPS = """[...document.querySelectorAll('pre')].map(pre => ({
  section: pre.closest('section').id, scroll: pre.scrollWidth, client: pre.clientWidth, text: pre.innerText,
}))"""


def test_a_long_explain_line_wraps_inside_its_box_with_the_differing_hash_on_screen(chromium, tmp_path, monkeypatch):
    """A pointer file whose stored bytes hash differently: the explain line naming the two maps of hashes
    is longer than the box, and wraps (no part of it beyond the box's edge), the differing hash whole."""
    monkeypatch.chdir(ROOT)
    run = tmp_path / "p4_soak"
    shutil.copytree(ROOT / "evidence" / "p4_soak", run)
    doc = json.loads((run / "evidence.json").read_text())
    stored = doc["state"]["hub_after_leg2"]["pointer_target_sha256_stored"]
    damaged = stored["trainer_state.json"][:-6] + "000000"
    stored["trainer_state.json"] = damaged
    (run / "evidence.json").write_text(json.dumps(doc))
    page = tmp_path / "report.html"
    assert main(["check", "specs/p4_soak.yaml", "--evidence", str(run), "--html", str(page)]) == 5

    seen = render(page.as_uri(), WRAPS, tmp_path / "profile")
    (tmp_path / "report.png").write_bytes(seen.png)
    assert seen.loaded and seen.errors() == [], seen.console
    # Two checks read the stored bytes: the read-back against the pointer, and the checkpoint compared with the
    # reference against the store; both explain lines hold the damaged hash.
    failures = [p["text"].replace("\n", "") for p in seen.measured if p["section"] == "failures"]
    assert len(failures) == 2 and all(damaged in text for text in failures), failures
    for pre in seen.measured:
        assert pre["scroll"] <= pre["client"], (pre["section"], pre["scroll"], pre["client"])
