"""engine/judge/recheck.py: `engine check` judges a saved run with the spec's CURRENT values, refuses
evidence of another spec or of changed steps (saying what changed, readably), and derives each leg's
outcome from its recorded exit code rather than a stored status string."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from engine_helpers import LEG, git, write_spec

from engine.judge.recheck import describe_change
from engine.judge.verdict import Exit, run_status

ROOT = Path(__file__).resolve().parents[2]

SPEC = """\
version: 1
name: {name}
description: a leg that reports a loss
budget_s: 100
values:
  ceiling: {ceiling}
  steps: {steps}
  model: tiny-model-with-a-long-name{extra}
steps:
  - name: leg1
    run:
      argv: ["${{python}}", "{leg}", "--model", "${{model}}", "--out", "/tmp/a/long/path/to/a/run/directory",
             "--tokens", "409600", "--lr", "0.01", "--steps", "${{steps}}", 'RUN_JSON {{"final_loss": 5.4}}',
             "@rc:{rc}"]
      timeout_s: 30
      output:
        harvest:
          run_json: {{marker: "RUN_JSON ", pick: last}}
checks:
  - name: loss_below_ceiling
    why: a leg that learned nothing ends at ln(vocab)
    expr: "steps.leg1.harvest.run_json.final_loss < values.ceiling"
"""


def lossy_spec(name: str = "lossy", rc: int = 0, ceiling: str = "6.0", steps: str = "20", extra: str = "") -> str:
    return SPEC.format(name=name, leg=LEG, rc=rc, ceiling=ceiling, steps=steps, extra=extra)


def test_check_uses_the_specs_current_values_and_lists_each_change(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", lossy_spec())
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.PASS)
    write_spec(spec, lossy_spec(ceiling="0.01", extra="\n  note: added later"))  # only checks could read them
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.FAILED)
    assert r.out.splitlines()[-1].startswith('VERDICT lossy FAIL ["loss_below_ceiling"]')
    assert "values.ceiling = 0.01" in r.out
    assert "ceiling: run had 6.0, spec has 0.01" in r.err
    assert 'note: run had no such value, spec has "added later"' in r.err
    (record,) = (tmp_path / "r").glob("check-*.json")
    changed = json.loads(record.read_text())["values_changed"]
    assert {"name": "ceiling", "run": 6.0, "spec": 0.01} in changed
    saved = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert saved["values"]["ceiling"] == 6.0  # the evidence itself is never rewritten


def test_a_value_edited_in_the_evidence_cannot_pass_a_failed_gate(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", lossy_spec(ceiling="5.0"))
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.FAILED)
    path = tmp_path / "r" / "evidence.json"
    doc = json.loads(path.read_text())
    doc["values"]["ceiling"] = 100
    path.write_text(json.dumps(doc))
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.FAILED)
    assert "values.ceiling = 5.0" in r.out
    assert "ceiling: run had 100, spec has 5.0" in r.err


def test_a_changed_leg_is_refused_showing_the_tokens_that_moved(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", lossy_spec())
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.PASS)
    write_spec(spec, lossy_spec(steps="30"))
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.USAGE)
    # The argv is longer than a cut of 100 characters: the cut shows where the two sides differ.
    assert "step leg1: definition changed (run.argv: `--steps 20` -> `--steps 30`)" in r.err
    assert "values changed since the run:\n  steps: run had 20, spec has 30" in r.err


def test_describe_change_cuts_long_values_around_their_difference() -> None:
    old, new = "x" * 300 + "A" + "y" * 50, "x" * 300 + "B" + "y" * 50
    text = describe_change("run.cwd", old, new)
    left, right = text.split(" -> ")
    assert "A" in left and "B" in right and left != right.replace("B", "A") + "x"
    assert describe_change("run.argv", ["a", "--n", "1"], ["a", "--n", "2"]) == "run.argv: `--n 1` -> `--n 2`"


def test_changed_output_rules_are_refused_by_check_but_not_the_judging_options(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", lossy_spec())
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.PASS)
    spec.write_text(spec.read_text().replace("pick: last}", "pick: last, on_conflict: pick}"))
    engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.PASS)
    spec.write_text(spec.read_text().replace('marker: "RUN_JSON "', 'marker: "RUN "'))
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.USAGE)
    assert (
        'step leg1: output rules changed (output.harvest.run_json.marker: "RUN_JSON " -> "RUN ")'
    ) in r.err and "engine replay" in r.err
    r = engine("replay", str(spec), "--evidence", "r", cwd=tmp_path)  # re-harvested: no "RUN " line
    assert r.code == Exit.FAILED and "steps.leg1.harvest.run_json.final_loss is missing" in r.out


def test_evidence_of_another_spec_is_refused_naming_both(engine, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "evidence" / "p4_soak", tmp_path / "p4_soak")
    saved = ("--evidence", str(tmp_path / "p4_soak"))
    r = engine("check", str(ROOT / "specs" / "p4_smoke.yaml"), *saved, cwd=tmp_path, expect=Exit.USAGE)
    assert "evidence of spec 'p4_soak' (specs/p4_soak.yaml), not of spec 'p4_smoke'" in r.err
    assert r.out == "" and not list((tmp_path / "p4_soak").glob("check-*.json"))
    engine("check", str(ROOT / "specs" / "p4_soak.yaml"), *saved, cwd=tmp_path, expect=Exit.PASS)


def test_a_hand_edited_status_does_not_turn_a_failed_leg_into_a_pass(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", lossy_spec(rc=3))
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.FAILED)
    path = tmp_path / "r" / "evidence.json"
    doc = json.loads(path.read_text())
    doc["steps"]["leg1"]["status"] = "ok"
    path.write_text(json.dumps(doc))
    r = engine("check", str(spec), "--evidence", "r", "--junit", "j.xml", cwd=tmp_path, expect=Exit.FAILED)
    assert r.out.splitlines()[-1].startswith('VERDICT lossy FAIL ["step:leg1"]')
    lines = r.out.splitlines()
    assert lines[0].startswith("re-checked at ") and lines[1].startswith("check ")  # a re-check says so first
    assert lines[2].split()[:2] == ["step:leg1", "failed"]
    assert "the evidence says status 'ok', but it recorded rc 3 (ok_exit_codes [0]): counted as failed" in r.err


@pytest.mark.parametrize(
    "record, codes, status",
    [
        ({"status": "ok", "rc": 3}, [0], "failed"),
        ({"status": "failed", "rc": -9}, [0, -9], "ok"),
        ({"status": "ok", "rc": 0, "timed_out": True}, [0], "failed"),
        ({"status": "ok", "rc": 127, "error": "cannot start"}, [0, 127], "failed"),
        ({"status": "ok"}, [0], "failed"),  # an ok without any exit code
        ({"status": "not_run"}, [0], "not_run"),
        ({"status": "interrupted", "rc": 0}, [0], "interrupted"),
    ],
)
def test_run_status_comes_from_the_recorded_exit_code(record: dict, codes: list, status: str) -> None:
    assert run_status(record, codes) == status


RECHECKED = re.compile(
    r"re-checked at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ against the spec at (.+), (\d+) values? changed "
    r"\(the run started \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)"
)


def test_a_recheck_says_so_in_every_report_with_each_changed_value_as_run_to_now(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", lossy_spec())
    r = engine(
        "run", str(spec), *"--run-dir r --markdown run.md --html run.html".split(), cwd=tmp_path, expect=Exit.PASS
    )
    # A run's own reports are not re-checks.
    assert "re-checked" not in (tmp_path / "run.md").read_text() + (tmp_path / "run.html").read_text() + r.out
    write_spec(spec, lossy_spec(ceiling="4.0"))  # the run had 6.0: its loss 5.4 is over the new ceiling
    r = engine("check", str(spec), *"--evidence r --markdown m.md --html h.html --junit j.xml".split(), cwd=tmp_path)
    assert r.code == Exit.FAILED, r.out + r.err
    sha = hashlib.sha256(spec.read_bytes()).hexdigest()  # the spec as it is now, not as it ran
    lines = r.out.splitlines()
    head = RECHECKED.fullmatch(lines[0])
    assert head is not None, lines[0]
    assert head.groups() == (f"sha256 {sha[:12]} of s.yaml (not in a git work tree)", "1")
    assert lines[1] == "  ceiling: run 6.0 -> now 4.0"
    md = (tmp_path / "m.md").read_text()
    assert f"> {lines[0]}\n" in md and "| `ceiling` | 6.0 | 4.0 |" in md
    page = (tmp_path / "h.html").read_text()
    assert f'<p class="recheck" id="recheck">{lines[0]}</p>' in page
    values = page[page.index('<section id="values">') :]
    assert "ceiling = 6.0 -&gt; 4.0" in values and "ceiling = 4.0" not in values
    props = {p.get("name"): p.get("value") for p in ET.parse(tmp_path / "j.xml").getroot().find("properties")}
    assert props["rechecked"] == lines[0] and props["values_changed"] == "1"
    assert props["value.ceiling"] == "6.0 -> 4.0" and props["spec_revision"] == head.group(1)
    (record,) = (tmp_path / "r").glob("check-*.json")
    assert json.loads(record.read_text())["spec_revision"]["sha256"] == sha
    replayed = engine("replay", str(spec), "--evidence", "r", cwd=tmp_path).out.splitlines()
    assert replayed[0].startswith("replayed (logs re-harvested) and re-checked at ") and replayed[1] == lines[1]


def test_a_recheck_names_the_specs_git_commit_and_says_when_the_spec_differs_from_it(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", lossy_spec())
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.PASS)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "s.yaml")
    git(tmp_path, "commit", "-q", "-m", "spec")
    commit = git(tmp_path, "rev-parse", "HEAD")
    head = RECHECKED.fullmatch(engine("check", str(spec), "--evidence", "r", cwd=tmp_path).out.splitlines()[0])
    assert head is not None and head.groups() == (f"git {commit[:12]}", "0")
    write_spec(spec, lossy_spec(ceiling="4.0"))
    head = RECHECKED.fullmatch(engine("check", str(spec), "--evidence", "r", cwd=tmp_path).out.splitlines()[0])
    assert head is not None and head.group(2) == "1"
    assert re.fullmatch(rf"git {commit[:12]} with uncommitted changes \(spec sha256 [0-9a-f]{{12}}\)", head.group(1))


def test_a_rechecked_note_inside_the_saved_evidence_is_not_believed(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", lossy_spec())
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.PASS)
    path = tmp_path / "r" / "evidence.json"
    doc = json.loads(path.read_text())
    doc["rechecked"] = {"kind": "check", "at": "1999-01-01T00:00:00Z", "revision": {"git": "f" * 40}}
    path.write_text(json.dumps(doc))
    line = engine("check", str(spec), "--evidence", "r", cwd=tmp_path).out.splitlines()[0]
    assert RECHECKED.fullmatch(line) and "1999" not in line and "ffffff" not in line


def test_a_longer_timeout_keeps_a_saved_run_checkable_and_a_shorter_one_is_refused(engine, tmp_path: Path) -> None:
    from engine_helpers import python_leg

    spec = write_spec(tmp_path / "s.yaml", [python_leg("print('hi')", timeout_s=30)])
    engine("run", str(spec), "--run-dir", str(tmp_path / "r"), expect=Exit.PASS)
    write_spec(spec, [python_leg("print('hi')", timeout_s=90)])
    ran = engine("check", str(spec), "--evidence", str(tmp_path / "r"), expect=Exit.PASS)
    assert "note: step leg's timeout grew (run.timeout_s: 30 -> 90) and its saved leg ended within it" in ran.err
    write_spec(spec, [python_leg("print('hi')", timeout_s=20)])
    ran = engine("check", str(spec), "--evidence", str(tmp_path / "r"), expect=Exit.USAGE)
    assert "step leg: definition changed (run.timeout_s: 30 -> 20)" in ran.err
