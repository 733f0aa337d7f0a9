"""`engine run SPEC --run-dir DIR --from STEP` (engine/judge/rerun.py): a failed leg re-run without
re-running what passed before it. Real `engine` runs over real legs (tests/legs/leg.py);
leg 2's "outage" is a value (`leg2_rc`) the first run sets to 3."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from engine_helpers import LEG, Engine, write_spec

from engine.judge.verdict import Exit

SPEC = """\
version: 1
name: resumable
description: a probe whose second leg can fail on an outage
budget_s: 200
values:
  leg2_rc: 0
  greeting: hello
steps:
  - name: leg1
    run:
      argv: ["${{python}}", "{leg}", "@append:${{run_dir}}/leg1.count:ran", "@append:${{run_dir}}/state.json:{{\\"x\\": 1}}", "${{greeting}}"]
      timeout_s: 20
  - name: hub
    collect: {{collector: json_file, args: {{path: "${{run_dir}}/state.json"}}}}
  - name: wipe
    remove: ["${{run_dir}}/scratch"]
  - name: leg2
    run:
      argv: ["${{python}}", "{leg}", "@append:${{run_dir}}/leg2.count:ran", "@append:${{run_dir}}/scratch:x", "leg 2 exits ${{leg2_rc}}", "@rc:${{leg2_rc}}"]
      timeout_s: 20
checks:
  - name: leg1_ok
    why: leg 1 exits cleanly
    expr: "steps.leg1.rc == `0`"
  - name: leg2_ok
    why: leg 2 exits cleanly
    expr: "steps.leg2.rc == `0`"
  - name: hub_state_read
    why: the state leg 1 left is what the collector read
    expr: "state.hub.x == `1`"
"""


def resumable_spec(spec: str = SPEC) -> str:
    return spec.format(leg=LEG)


def failed_first_run(engine: Engine, tmp_path: Path) -> tuple[Path, dict]:
    """The spec, and the evidence of its first run, in which leg 2 failed (rc 3)."""
    spec = write_spec(tmp_path / "resumable.yaml", resumable_spec())
    engine("run", str(spec), "--run-dir", "r", "--set", "leg2_rc=3", cwd=tmp_path, expect=Exit.FAILED)
    return spec, json.loads((tmp_path / "r" / "evidence.json").read_text())


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_from_reruns_the_step_and_after_it_and_reuses_the_evidence_before_it(engine, tmp_path: Path) -> None:
    spec, first = failed_first_run(engine, tmp_path)
    run = tmp_path / "r"
    old_leg2_log = (run / "logs" / "leg2.log").read_text()
    r = engine(
        "run", str(spec), "--run-dir", "r", "--from", "wipe", "--set", "leg2_rc=0",
        "--junit", "j.xml", "--markdown", "m.md", "--html", "h.html", cwd=tmp_path,
    )  # fmt: skip
    assert r.code == Exit.PASS, r.out + r.err
    # Leg 1 ran once (the first run), leg 2 twice; the wipe ran again and removed what leg 2 wrote.
    assert lines(run / "leg1.count") == ["ran"] and lines(run / "leg2.count") == ["ran", "ran"]
    doc = json.loads((run / "evidence.json").read_text())
    when = first["started_at"]
    assert doc["steps"]["leg1"] == {**first["steps"]["leg1"], "reused": True, "reused_from": when}
    assert doc["steps"]["hub"]["reused"] is True and doc["state"]["hub"] == {"x": 1}
    assert "reused" not in doc["steps"]["wipe"] and doc["steps"]["wipe"]["removed"] == [str(run / "scratch")]
    assert doc["steps"]["leg2"]["rc"] == 0 and "reused" not in doc["steps"]["leg2"]
    assert doc["verdict"]["reused"] == [{"step": "leg1", "from": when}, {"step": "hub", "from": when}]
    assert doc["resumed"]["from_step"] == "wipe" and doc["resumed"]["reused"] == ["leg1", "hub"]
    # The reused leg's log stays where its record points; the failed attempt is set aside, whole.
    aside = run / doc["resumed"]["set_aside"]
    assert (run / "logs" / "leg1.log").read_text().startswith("hello")
    assert json.loads((aside / "evidence.json").read_text())["verdict"] == first["verdict"]
    assert (aside / "logs" / "leg2.log").read_text() == old_leg2_log == "leg 2 exits 3\n"
    assert (run / "logs" / "leg2.log").read_text() == "leg 2 exits 0\n"
    # Every report says which steps were reused, and from when.
    stamp = when[:19] + "Z"
    said = f"resumed at wipe: leg1, hub reused from the run of {stamp}"
    assert f"resuming at wipe: reusing leg1, hub from the run of {stamp}" in r.out
    assert "=== leg1: reused (ok) from the run of" in r.out and said in r.out
    assert re.search(rf"^step:leg1 +ok +reused from the run of {stamp}, rc 0, ", r.out, re.M), r.out
    assert said in (tmp_path / "m.md").read_text() and said in (tmp_path / "h.html").read_text()
    case = ET.parse(tmp_path / "j.xml").getroot().find("testcase[@name='leg1']")
    assert case is not None and case.findtext("system-out") == f"reused from the run of {stamp}"
    # A re-check of the resumed run says it too.
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.PASS)
    assert said in r.out


def test_a_step_reused_twice_keeps_the_time_of_the_run_that_ran_it(engine, tmp_path: Path) -> None:
    spec, first = failed_first_run(engine, tmp_path)
    # The outage is still there: the resumed run fails at leg 2 again, and is resumed once more.
    engine("run", str(spec), "--run-dir", "r", "--from", "wipe", cwd=tmp_path, expect=Exit.FAILED)
    second = json.loads((tmp_path / "r" / "evidence.json").read_text())
    engine("run", str(spec), "--run-dir", "r", "--from", "wipe", "--set", "leg2_rc=0", cwd=tmp_path, expect=Exit.PASS)
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert second["started_at"] != first["started_at"]
    assert doc["steps"]["leg1"]["reused_from"] == first["started_at"]
    assert lines(tmp_path / "r" / "leg1.count") == ["ran"] and len(lines(tmp_path / "r" / "leg2.count")) == 3
    # Each earlier attempt is set aside in a folder of its own.
    assert len(list((tmp_path / "r").glob("previous-*/evidence.json"))) == 2


def test_from_refuses_an_earlier_step_that_changed_naming_it_and_what_changed(engine, tmp_path: Path) -> None:
    spec, first = failed_first_run(engine, tmp_path)
    before = sorted(p.name for p in (tmp_path / "r").iterdir())
    r = engine(
        "run",
        str(spec),
        "--run-dir",
        "r",
        "--from",
        "wipe",
        "--set",
        "greeting=bonjour",
        cwd=tmp_path,
        expect=Exit.USAGE,
    )
    assert "refusing --from wipe: steps before it changed since the run" in r.err
    assert "resume at leg1 (--from leg1)" in r.err
    assert "step leg1: definition changed (run.argv: `hello` -> `bonjour`)" in r.err
    # Nothing moved, nothing ran.
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == before
    assert json.loads((tmp_path / "r" / "evidence.json").read_text()) == first
    # A change to the step it starts at (and after) is what a resume is for.
    r = engine(
        "run", str(spec), "--run-dir", "r", "--from", "wipe", "--set", "leg2_rc=0", cwd=tmp_path, expect=Exit.PASS
    )


def test_from_refuses_a_leg_that_a_wipe_prepares_and_names_the_wipe(engine, tmp_path: Path) -> None:
    spec, _ = failed_first_run(engine, tmp_path)
    r = engine(
        "run", str(spec), "--run-dir", "r", "--from", "leg2", "--set", "leg2_rc=0", cwd=tmp_path, expect=Exit.USAGE
    )
    assert "the remove step wipe" in r.err and "resume at the wipe: --from wipe" in r.err
    assert lines(tmp_path / "r" / "leg2.count") == ["ran"]


def test_from_refuses_to_reuse_a_step_that_failed(engine, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path / "resumable.yaml", resumable_spec(SPEC.replace('"${{greeting}}"]', '"${{greeting}}", "@rc:4"]'))
    )
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.FAILED)
    r = engine("run", str(spec), "--run-dir", "r", "--from", "wipe", cwd=tmp_path, expect=Exit.USAGE)
    assert "refusing --from wipe: leg1 (failed) did not finish well in that run" in r.err
    assert "resume at leg1 (--from leg1)" in r.err


def test_from_refuses_what_it_cannot_resume(engine, tmp_path: Path) -> None:
    spec, _ = failed_first_run(engine, tmp_path)
    r = engine("run", str(spec), "--run-dir", "r", "--from", "leg3", cwd=tmp_path, expect=Exit.USAGE)
    assert "has no step 'leg3'; its steps: leg1, hub, wipe, leg2" in r.err
    r = engine("run", str(spec), "--from", "leg2", cwd=tmp_path, expect=Exit.USAGE)
    assert "--from leg2: needs --run-dir DIR" in r.err
    (tmp_path / "empty").mkdir()
    r = engine("run", str(spec), "--run-dir", "empty", "--from", "wipe", cwd=tmp_path, expect=Exit.USAGE)
    assert "holds no run to resume" in r.err
    assert list((tmp_path / "empty").iterdir()) == []
    other = tmp_path / "other.yaml"
    other.write_text(spec.read_text().replace("name: resumable", "name: another"))
    r = engine("run", str(other), "--run-dir", "r", "--from", "wipe", cwd=tmp_path, expect=Exit.USAGE)
    assert "refusing to resume" in r.err and "evidence of spec 'resumable'" in r.err, r.err
    r = engine("run", str(spec), "--run-dir", "r", "--from", "wipe", "--mode", "soak", cwd=tmp_path, expect=Exit.USAGE)
