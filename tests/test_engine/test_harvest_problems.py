"""Harvest problems (engine/run/output.py -> engine/judge/verdict.py -> engine/show/report.py): a malformed marker
line, or marker lines that disagree, fail the verdict unless the spec opts in, and every report
names the lines. Real `engine` runs over tests/legs/leg.py."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from engine_helpers import LEG, write_spec

from engine.judge.verdict import Exit
from engine.run.lines import Block
from engine.run.output import Capture, compile_rules, harvest_problems

WANTED = {
    "name": "harvesting",
    "budget_s": 100,
    "values": {"want": 12},
    "checks": [
        {
            "name": "final_step_is_wanted",
            "why": "the leg reports the step it stopped at",
            "expr": "steps.leg1.harvest.run_json.final_step == values.want",
        }
    ],
}


def harvesting(path: Path, *lines: str, **opts: str) -> Path:
    """A spec whose leg prints `lines` and harvests the last RUN_JSON, with the harvest options `opts`."""
    rule = {"marker": "RUN_JSON ", "pick": "last", **opts}
    run = {"argv": [sys.executable, LEG, *lines], "timeout_s": 30, "output": {"harvest": {"run_json": rule}}}
    return write_spec(path, [{"name": "leg1", "run": run}], **WANTED)


def feed(run: dict, *lines: str) -> Capture:
    capture = Capture(compile_rules(run))
    capture.feed(Block.from_lines(list(lines), 1))
    return capture


def test_a_malformed_line_after_the_kept_one_is_recorded_even_for_pick_first() -> None:
    # pick: first must go on parsing after the first valid line, or a later broken one goes unseen.
    capture = feed(
        {"output": {"harvest": {"r": {"marker": "R ", "pick": "first"}}}}, 'R {"a": 1}', "noise", "R {broken"
    )
    harvest, errors = capture.harvest_result()
    assert harvest == {"r": {"a": 1}}
    assert [(e["kind"], e["line"], e["text"]) for e in errors] == [("malformed", 3, "R {broken")]


def test_repeated_identical_markers_are_no_conflict_whatever_the_key_order() -> None:
    capture = feed({"output": {"harvest": {"r": {"marker": "R "}}}}, 'R {"a": 1, "b": NaN}', 'R {"b": NaN,  "a": 1}')
    assert capture.harvest_result()[1] == []


def test_problems_name_the_log_lines_and_honour_the_opt_ins() -> None:
    capture = feed(
        {"output": {"harvest": {"r": {"marker": "R "}}}},
        'R {"step": 1}',
        "x",
        'R {"step": 2}',
        "R {bad",
        'R {"step": 2}',
    )
    record = {"log": "logs/leg1.log", "harvest_errors": capture.harvest_result()[1]}
    strict = {p["kind"]: p for p in harvest_problems("leg1", record, {})}
    assert strict["conflict"]["lines"] == [1, 3, 5] and strict["conflict"]["fails"] is True
    assert strict["conflict"]["message"] == (
        "logs/leg1.log: 3 marker lines, not all with the same JSON (lines 1, 3, 5); pick last kept line 5"
    )
    assert strict["malformed"]["lines"] == [4] and strict["malformed"]["fails"] is True
    assert strict["malformed"]["message"].startswith("logs/leg1.log line 4: 'R ' followed by invalid JSON")
    opted = {
        p["kind"]: p for p in harvest_problems("leg1", record, {"r": {"on_conflict": "pick", "on_malformed": "skip"}})
    }
    assert not opted["conflict"]["fails"] and opted["conflict"]["message"].endswith("(on_conflict: pick)")
    assert not opted["malformed"]["fails"] and opted["malformed"]["message"].endswith("(on_malformed: skip)")


def test_disagreeing_markers_fail_the_verdict_in_every_report(engine, tmp_path: Path) -> None:
    # The check itself passes on the last marker: only the conflict can fail this run.
    spec = harvesting(tmp_path / "h.yaml", "hello", 'RUN_JSON {"final_step": 10}', "mid", 'RUN_JSON {"final_step": 12}')
    r = engine(
        "run", str(spec), "--run-dir", "r", "--junit", "j.xml", "--markdown", "s.md", cwd=tmp_path, expect=Exit.FAILED
    )
    lines = r.out.splitlines()
    assert lines[-1].startswith('VERDICT harvesting FAIL ["harvest:leg1.run_json"]')
    row = next(x for x in lines if x.startswith("harvest:leg1.run_json"))
    assert "FAIL" in row and "(lines 2, 4); pick last kept line 4" in row
    assert "final_step_is_wanted" in r.out and "HARVEST FAILED run_json (conflict)" in r.out
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert doc["verdict"]["failed"] == ["harvest:leg1.run_json"]
    (problem,) = doc["verdict"]["harvest"]
    assert (problem["step"], problem["kind"], problem["lines"], problem["fails"]) == ("leg1", "conflict", [2, 4], True)
    assert [c["outcome"] for c in doc["checks"]] == ["PASS"]
    suite = ET.parse(tmp_path / "j.xml").getroot()
    assert suite.get("failures") == "1"
    (case,) = [c for c in suite.iter("testcase") if c.get("classname") == "harvesting.harvest"]
    assert case.get("name") == "leg1.run_json (conflict)"
    assert case.find("failure").get("type") == "HARVEST" and case.find("failure").text == "lines 2, 4"
    md = (tmp_path / "s.md").read_text()
    assert "| `harvest:leg1.run_json` | ❌ FAIL | conflict: logs/leg1.log: 2 marker lines" in md
    assert "Failed: `harvest:leg1.run_json`" in md

    # Opting in later is honoured by `engine check` (the evidence records facts; the spec judges).
    harvesting(spec, "hello", 'RUN_JSON {"final_step": 10}', "mid", 'RUN_JSON {"final_step": 12}', on_conflict="pick")
    r = engine("check", str(spec), "--evidence", "r", "--junit", "j2.xml", cwd=tmp_path, expect=Exit.PASS)
    row = next(x for x in r.out.splitlines() if x.startswith("harvest:leg1.run_json"))
    assert " note " in row and row.endswith("(on_conflict: pick)")
    suite = ET.parse(tmp_path / "j2.xml").getroot()
    assert suite.get("failures") == "0" and "NOTE (opted in)" in ET.tostring(suite, encoding="unicode")


def test_a_malformed_marker_after_a_valid_one_fails_unless_skipped(engine, tmp_path: Path) -> None:
    spec = harvesting(tmp_path / "h.yaml", 'RUN_JSON {"final_step": 12}', 'RUN_JSON {"final_step": 1')
    r = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.FAILED)
    assert r.out.splitlines()[-1].startswith('VERDICT harvesting FAIL ["harvest:leg1.run_json"]')
    assert "malformed: logs/leg1.log line 2: 'RUN_JSON ' followed by invalid JSON" in r.out
    harvesting(spec, 'RUN_JSON {"final_step": 12}', 'RUN_JSON {"final_step": 1', on_malformed="skip")
    r = engine("run", str(spec), "--run-dir", "r2", cwd=tmp_path, expect=Exit.PASS)
    assert "(on_malformed: skip)" in r.out


def test_a_marker_whose_json_names_a_key_twice_is_malformed_naming_the_key() -> None:
    # Python's json keeps the last of two equal keys: step 10's first loss would vanish before any check.
    run = {"output": {"harvest": {"run_json": {"marker": "RUN_JSON ", "pick": "last"}}}}
    capture = feed(run, 'RUN_JSON {"final_step": 12, "losses": {"10": 5.2, "10": 5.3}}')
    assert "run_json" not in capture.harvested
    (error,) = capture.harvest_errors
    assert (error["kind"], error["line"]) == ("malformed", 1)
    assert error["error"] == 'not harvested: duplicate key "10" in one object (5.2, then 5.3)'
    record = {"log": "logs/leg1.log", "harvest": {}, "harvest_errors": capture.harvest_errors}
    (problem,) = harvest_problems("leg1", record, {"run_json": {}})
    assert problem["fails"] is True
    assert problem["message"] == (
        "logs/leg1.log line 1: 'RUN_JSON ' followed by invalid JSON "
        '(not harvested: duplicate key "10" in one object (5.2, then 5.3))'
    )


def test_harvest_opt_ins_are_validated_and_shown_by_plan(engine, tmp_path: Path) -> None:
    spec = harvesting(tmp_path / "h.yaml", "x", on_conflict="last_wins")
    r = engine("validate", str(spec), cwd=tmp_path, expect=Exit.USAGE)
    assert "on_conflict" in r.out
    harvesting(spec, "x", on_conflict="pick")
    r = engine("plan", str(spec), cwd=tmp_path)
    assert "harvest: run_json <- 'RUN_JSON ' (last, on_conflict pick)" in r.out
