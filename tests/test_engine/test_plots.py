"""engine/show/plots.py: a spec's plots evaluated over the evidence; missing data is a gap or "no data",
with a note, never a number."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engine.show.plots import figures, for_spec
from engine.spec.load import load_spec
from engine.spec.plan import build_plan
from engine.spec.plotdefs import MarkerDef, PlotDef, SeriesDef, resolve
from engine.spec.validate import validate

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "specs" / "plots" / "probe.yaml"
EVIDENCE = ROOT / "tests" / "golden" / "plots" / "evidence.json"


def one(points: str, evidence: dict, markers: tuple = ()) -> object:
    plot = PlotDef("p", "P", "why", "x", "y", (SeriesDef("s", points),), markers)
    return figures([plot], evidence)[0]


def test_object_series_is_sorted_by_numeric_x_not_by_key_text():
    fig = one("d", {"d": {"10": 1.5, "9": 2, "100": 0.25}})
    assert fig.series[0].points == [(9, 2), (10, 1.5), (100, 0.25)]
    assert fig.notes == []


def test_pairs_and_plain_lists_are_series_too():
    assert one("d", {"d": [[2, 1.0], [1, 3]]}).series[0].points == [(1, 3), (2, 1.0)]
    assert one("d", {"d": [7, 8.5]}).series[0].points == [(0, 7), (1, 8.5)]


def test_null_and_non_finite_values_are_gaps_with_a_note_never_zero():
    fig = one("d", {"d": {"1": 1.0, "2": None, "3": float("nan"), "4": "x", "5": True, "6": 2.0}})
    series = fig.series[0]
    assert series.points == [(1, 1.0), (2, None), (3, None), (4, None), (5, None), (6, 2.0)]
    assert series.runs() == [[(1, 1.0)], [(6, 2.0)]]
    assert "no value at x = 2 (null): a gap, not drawn" in series.notes
    assert "no value at x = 3 (NaN): a gap, not drawn" in series.notes
    assert 'no value at x = 4 (not a number: "x"): a gap, not drawn' in series.notes
    assert "no value at x = 5 (not a number: true): a gap, not drawn" in series.notes
    assert all(y != 0 for _, y in series.drawn())


def test_an_absent_series_says_which_path_is_missing():
    fig = one("steps.leg1.harvest.run_json.losses", {"steps": {"leg1": {"harvest": {}}}})
    assert fig.series[0].points == []
    assert fig.notes == ["s: no data: steps.leg1.harvest.run_json.losses is missing"]
    assert not fig.has_data()


def test_a_null_series_and_an_empty_one_are_no_data():
    assert one("d", {"d": None}).notes == ["s: no data: `d` is null"]
    assert one("d", {"d": {}}).notes == ["s: no data: `d` is empty"]


def test_a_value_that_is_no_series_is_not_drawn_and_says_what_it_got():
    fig = one("d", {"d": "text"})
    assert fig.series[0].points == []
    assert fig.notes[0].startswith('s: not drawn: `d` gave "text"; a series is')


def test_keys_and_xs_that_are_not_numbers_are_skipped_with_a_note():
    fig = one("d", {"d": {"1": 1.0, "one": 2.0}})
    assert fig.series[0].points == [(1, 1.0)]
    assert fig.notes == ['s: key "one" is not a number: skipped']
    fig = one("d", {"d": [[1, 1.0], ["a", 2.0], [None, 3.0]]})
    assert fig.series[0].points == [(1, 1.0)]
    assert len(fig.notes) == 2


def test_a_projection_with_an_absent_field_keeps_the_gap_and_names_the_path():
    fig = one("rows[*].[step, rate]", {"rows": [{"step": 1, "rate": 2.0}, {"step": 2}]})
    assert fig.series[0].points == [(1, 2.0), (2, None)]
    assert fig.notes == ["s: rows[1].rate is missing", "s: no value at x = 2 (null): a gap, not drawn"]


def test_an_expression_that_fails_is_a_note_not_a_crash():
    fig = one("abs(d)", {"d": "x"})
    assert fig.series[0].points == [] and "failed" in fig.notes[0]


def test_repeated_x_keeps_the_last_value_and_says_so():
    fig = one("d", {"d": [[1, 1.0], [1, 2.0]]})
    assert fig.series[0].points == [(1, 2.0)]
    assert fig.notes == ["s: x = 1 given more than once: the last value is drawn"]


def test_markers_take_a_number_or_a_list_and_note_what_is_missing():
    ev = {"v": {"stop": 10, "pushes": [5, 10, "x"]}}
    fig = one(
        "v.stop",
        ev,
        (MarkerDef("x", "v.stop", "stop"), MarkerDef("x", "v.pushes", "push"), MarkerDef("y", "v.gate", "gate")),
    )
    assert [m.at for m in fig.markers] == [[10], [5, 10], []]
    assert 'marker push: not drawn at "x": not a number' in fig.notes
    assert "marker gate: no data: v.gate is missing" in fig.notes


def test_definitions_keep_spec_order_and_where_each_plot_is_written(monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = load_spec(PROBE.relative_to(ROOT))
    defs, problems = resolve(spec.data, locate=spec.locate_key)
    assert problems == []
    assert [d.name for d in defs] == ["loss", "rate", "memory"]
    assert (defs[0].file, defs[0].line) == ("tests/specs/plots/probe.yaml", 31)
    assert defs[0].markers == (MarkerDef("x", "values.stop", "stop"),)
    assert defs[2].markers == (MarkerDef("y", "values.gate", "gate"),)


def test_plots_merge_by_name_across_extends(monkeypatch):
    monkeypatch.chdir(ROOT)
    soak = build_plan(load_spec("specs/p4_soak.yaml"), environ={}).plots
    assert [p.name for p in soak] == ["loss", "tokens_per_s", "peak_memory"]
    loss = soak[0]
    # from p4_common: the reference beneath, then one series per leg
    assert [(s.label, s.under) for s in loss.series] == [
        ("reference (never stopped)", True),
        ("leg1", False),
        ("leg2", False),
    ]
    assert loss.markers == (MarkerDef("x", "values.stops[*].stop", "stop / cold resume"),)  # from p4_segment
    preempt = build_plan(load_spec("specs/p4_preempt.yaml"), environ={}).plots
    assert [p.name for p in preempt] == ["loss", "tokens_per_s"]
    assert preempt[0].series[0].under and preempt[0].series[1].points == "steps.leg1.harvest.progress[*].[step, loss]"


def test_saved_soak_run_gives_every_loss_of_both_legs(monkeypatch):
    monkeypatch.chdir(ROOT)
    evidence = json.loads((ROOT / "evidence" / "p4_soak" / "evidence.json").read_text())
    loss = for_spec(load_spec("specs/p4_soak.yaml"), evidence)[0]
    leg1 = evidence["steps"]["leg1"]["harvest"]["run_json"]["losses"]
    leg2 = evidence["steps"]["leg2"]["harvest"]["run_json"]["losses"]
    reference = evidence["steps"]["reference"]["harvest"]["run_json"]["losses"]
    assert loss.series[0].points == [(int(k), v) for k, v in reference.items()] and loss.series[0].under
    assert len(reference) == 180
    assert loss.series[1].points == [(int(k), v) for k, v in leg1.items()]
    assert loss.series[2].points == [(int(k), v) for k, v in leg2.items()]
    assert loss.markers[0].at == [120]


def test_validate_reports_plot_problems_like_check_problems(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = PROBE.read_text()
    text = text.replace('"steps.leg1.harvest.run_json.losses"', '"steps.leg3.harvest.run_json.losses"')
    text = text.replace('"steps.leg2.harvest.progress[*].[step, rate]"', '"nosuch(steps.leg2)"')
    text = text.replace('{y: "values.gate", label: gate}', '{y: "values.gates", label: gate}')
    (tmp_path / "bad.yaml").write_text(text)
    errors = [str(e) for e in validate(load_spec("bad.yaml"), environ={})]
    assert errors == [
        "bad.yaml:37:32: $.plots.loss.series[0].points: steps.leg3.harvest.run_json.losses: no step named "
        "'leg3'; steps: leg1, leg2",
        "bad.yaml:48:32: $.plots.rate.series[1].points: unknown function nosuch() in 'nosuch(steps.leg2)'",
        "bad.yaml:58:13: $.plots.memory.markers[0].y: values.gates: no value named 'gates'; values: gate, "
        "mode, python, run_dir, run_id, spec_dir, stop, work_dir",
    ]


@pytest.mark.parametrize(
    "plot, message",
    [
        ({"title": "t", "why": "w", "series": []}, "should be non-empty"),
        ({"title": "t", "why": " ", "series": [{"label": "a", "points": "x"}]}, "why must say what a reader"),
        ({"title": "t", "why": "w", "series": [{"label": "a"}]}, "'points' is a required property"),
        (
            {"title": "t", "why": "w", "series": [{"label": "a", "points": "x"}], "markers": [{"label": "m"}]},
            "a marker needs exactly one of x, y",
        ),
        (
            {"title": "t", "why": "w", "series": [{"label": "a", "points": "x"}], "colour": "red"},
            "unknown key 'colour'",
        ),
    ],
)
def test_schema_refuses_malformed_plots_with_a_located_message(tmp_path, monkeypatch, plot, message):
    monkeypatch.chdir(tmp_path)
    spec = {
        "version": 1,
        "name": "p",
        "budget_s": 10,
        "steps": [{"name": "a", "remove": "x"}],
        "checks": [{"name": "c", "why": "w", "expr": "`true`"}],
        "plots": {"bad": plot},
    }
    (tmp_path / "p.yaml").write_text(json.dumps(spec, indent=1))
    from engine.spec.located import SpecErrors

    with pytest.raises(SpecErrors) as info:
        load_spec("p.yaml")
    text = str(info.value)
    assert message in text and text.startswith("p.yaml:") and "$.plots.bad" in text


def test_number_of_gaps_named_is_capped():
    fig = one("d", {"d": {str(i): None for i in range(20)} | {"99": 1.0}})
    assert fig.notes == ["s: no value at x = 0, 1, 2, 3, 4, 5, 6, 7 and 12 more (null): a gap, not drawn"]
    assert not math.isnan(fig.series[0].drawn()[0][1])


def test_the_spec_reference_documents_a_markers_x_and_y_as_jmespath_strings_as_the_schema_has_them():
    schema = json.loads((ROOT / "engine" / "spec" / "spec.schema.json").read_text())
    marker = schema["$defs"]["plot_marker"]["properties"]
    assert marker["x"]["$ref"] == marker["y"]["$ref"] == "#/$defs/jmespath"
    row = next(line for line in (ROOT / "docs" / "specs.md").read_text().splitlines() if line.startswith("| `plots` |"))
    assert "a marker is `{x: JMESPath, label}` (a vertical line) or `{y: JMESPath, label}`" in row
    assert "a string read over the evidence" in row and "a number or a list." not in row
