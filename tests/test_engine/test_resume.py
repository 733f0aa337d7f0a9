"""`engine run SPEC --run-dir DIR --from STEP` (engine/judge/rerun.py): a failed leg re-run without
re-running what passed before it. Real `engine` runs over real legs (tests/legs/leg.py);
leg 2's "outage" is a value (`leg2_rc`) the first run sets to 3."""

from __future__ import annotations

import json
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from engine_helpers import LEG, Engine, engine_started, file_size_limit, write_spec
from processes import wait_until

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


def resumed(spec: Path, *args: str) -> tuple[str, ...]:
    """`engine run SPEC ARGS` resumed in the run dir `r` at the wipe: leg 2 and what prepares it run again."""
    return ("run", str(spec), "--run-dir", "r", "--from", "wipe", *args)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_from_reruns_the_step_and_after_it_and_reuses_the_evidence_before_it(engine, tmp_path: Path) -> None:
    spec, first = failed_first_run(engine, tmp_path)
    run = tmp_path / "r"
    old_leg2_log = (run / "logs" / "leg2.log").read_text()
    reports = ("--junit", "j.xml", "--markdown", "m.md", "--html", "h.html")
    r = engine(*resumed(spec, "--set", "leg2_rc=0", *reports), cwd=tmp_path)
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
    engine(*resumed(spec), cwd=tmp_path, expect=Exit.FAILED)
    second = json.loads((tmp_path / "r" / "evidence.json").read_text())
    engine(*resumed(spec, "--set", "leg2_rc=0"), cwd=tmp_path, expect=Exit.PASS)
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert second["started_at"] != first["started_at"]
    assert doc["steps"]["leg1"]["reused_from"] == first["started_at"]
    assert lines(tmp_path / "r" / "leg1.count") == ["ran"] and len(lines(tmp_path / "r" / "leg2.count")) == 3
    # Each earlier attempt is set aside in a folder of its own.
    assert len(list((tmp_path / "r").glob("previous-*/evidence.json"))) == 2


def test_from_refuses_an_earlier_step_that_changed_naming_it_and_what_changed(engine, tmp_path: Path) -> None:
    spec, first = failed_first_run(engine, tmp_path)
    before = sorted(p.name for p in (tmp_path / "r").iterdir())
    r = engine(*resumed(spec, "--set", "greeting=bonjour"), cwd=tmp_path, expect=Exit.USAGE)
    assert "refusing --from wipe: steps before it changed since the run" in r.err
    assert "resume at leg1 (--from leg1)" in r.err
    assert "step leg1: definition changed (run.argv: `hello` -> `bonjour`)" in r.err
    # Nothing moved, nothing ran.
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == before
    assert json.loads((tmp_path / "r" / "evidence.json").read_text()) == first
    # A change to the step it starts at (and after) is what a resume is for.
    r = engine(*resumed(spec, "--set", "leg2_rc=0"), cwd=tmp_path, expect=Exit.PASS)


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
    r = engine(*resumed(spec), cwd=tmp_path, expect=Exit.USAGE)
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
    r = engine(*resumed(other), cwd=tmp_path, expect=Exit.USAGE)
    assert "refusing to resume" in r.err and "evidence of spec 'resumable'" in r.err, r.err
    r = engine(*resumed(spec, "--mode", "soak"), cwd=tmp_path, expect=Exit.USAGE)


# ---------------------------------------------------------------- hostile resumes


SLOW = SPEC.replace('"leg 2 exits ${{leg2_rc}}"', '"@sleep:${{leg2_sleep}}", "leg 2 exits ${{leg2_rc}}"').replace(
    "  greeting: hello\n", "  greeting: hello\n  leg2_sleep: 0\n"
)


def test_a_second_engine_in_a_run_dir_is_refused_naming_the_first(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "resumable.yaml", resumable_spec(SLOW))
    engine("run", str(spec), "--run-dir", "r", "--set", "leg2_rc=3", cwd=tmp_path, expect=Exit.FAILED)
    args = resumed(spec, "--set", "leg2_sleep=8", "--set", "leg2_rc=0")
    first = engine_started(*args, cwd=tmp_path)
    try:
        lock = tmp_path / "r" / ".engine.lock"
        wait_until(lambda: lock.is_file() and lock.read_text().strip(), 60, "the first engine never took the lock")
        second = engine(*args, cwd=tmp_path, expect=Exit.USAGE)
        holder = json.loads(lock.read_text())
        assert f"another engine is running in it (pid {first.pid} on host {holder['host']}, since " in second.err
        assert second.out == ""
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == Exit.PASS, out + err
    # Only the first one ran: one evidence of it, one set-aside of the earlier run, and no lock left.
    assert lines(tmp_path / "r" / "leg2.count") == ["ran", "ran"]
    assert len(list((tmp_path / "r").glob("previous-*"))) == 1 and not lock.exists()


def test_the_lock_of_an_engine_that_is_gone_is_taken_over_and_said(engine, tmp_path: Path) -> None:
    spec, _ = failed_first_run(engine, tmp_path)
    gone = {"pid": 4_000_000, "host": "elsewhere", "started_at": "2026-12-01T00:00:00Z"}
    (tmp_path / "r" / ".engine.lock").write_text(json.dumps(gone))  # left by a killed engine: unlocked
    r = engine(*resumed(spec, "--set", "leg2_rc=0"), cwd=tmp_path)
    assert r.code == Exit.PASS, r
    assert "took over the lock of" in r.err and "(pid 4000000 on host elsewhere, since 2026-12-01T00:00:00Z)" in r.err
    assert not (tmp_path / "r" / ".engine.lock").exists()


HARVESTING = SPEC.replace(
    '"${{greeting}}"]\n      timeout_s: 20\n',
    '"${{greeting}}", "RUN_JSON {{\\"loss\\": 2.0}}"]\n      timeout_s: 20\n'
    "      output: {{harvest: {{run_json: {{marker: 'RUN_JSON '}}}}}}\n",
).replace(
    "checks:\n",
    'checks:\n  - name: loss_low\n    why: leg 1 learned\n    expr: "steps.leg1.harvest.run_json.loss < `2.5`"\n',
)


def test_from_re_harvests_a_reused_leg_with_the_output_rules_of_now(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "resumable.yaml", resumable_spec(HARVESTING))
    engine("run", str(spec), "--run-dir", "r", "--set", "leg2_rc=3", cwd=tmp_path, expect=Exit.FAILED)
    spec.write_text(spec.read_text().replace("marker: 'RUN_JSON '", "marker: 'METRICS '"))
    replay = engine("replay", str(spec), "--evidence", "r", cwd=tmp_path)
    r = engine(*resumed(spec, "--set", "leg2_rc=0"), cwd=tmp_path)
    # As replay judges it: the rule of now finds no loss in leg 1's log.
    assert replay.code == r.code == Exit.FAILED, r
    assert "leg1: re-harvested from logs/leg1.log with the current output rules" in r.out
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert doc["steps"]["leg1"]["harvest"] == {} and doc["verdict"]["failed"] == ["loss_low"]


def test_from_does_not_believe_an_edited_harvest_of_a_reused_leg(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "resumable.yaml", resumable_spec(HARVESTING.replace("`2.5`", "`1.5`")))
    engine("run", str(spec), "--run-dir", "r", "--set", "leg2_rc=3", cwd=tmp_path, expect=Exit.FAILED)
    saved = json.loads((tmp_path / "r" / "evidence.json").read_text())
    saved["steps"]["leg1"]["harvest"]["run_json"]["loss"] = 1.0  # the log says 2.0
    (tmp_path / "r" / "evidence.json").write_text(json.dumps(saved))
    engine(*resumed(spec, "--set", "leg2_rc=0"), cwd=tmp_path, expect=Exit.FAILED)
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert doc["steps"]["leg1"]["harvest"]["run_json"] == {"loss": 2.0} and doc["verdict"]["failed"] == ["loss_low"]
    engine("replay", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.FAILED)


def test_from_refuses_a_secret_it_is_not_given_again_naming_it(engine, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path / "resumable.yaml",
        resumable_spec(SPEC.replace("  greeting: hello\n", "  greeting: hello\n  api_token: none\n  repo: none\n")),
    )
    url = "https://bob:PaSsWoRd-4242@git.example.com/x.git"
    sets = ["--set", "api_token=tok_abcdef123456", "--set", f"repo={url}"]
    engine("run", str(spec), "--run-dir", "r", "--set", "leg2_rc=3", *sets, cwd=tmp_path, expect=Exit.FAILED)
    r = engine(*resumed(spec, "--set", "leg2_rc=0"), cwd=tmp_path)
    assert r.code == Exit.USAGE, r
    assert "the later steps would get the text '<redacted>' instead" in r.err
    assert "api_token (given by --set; give it again: --set api_token=...)" in r.err
    assert "repo (given by --set; give it again: --set repo=...)" in r.err
    assert lines(tmp_path / "r" / "leg2.count") == ["ran"]  # nothing ran
    engine(*resumed(spec, "--set", "leg2_rc=0", *sets), cwd=tmp_path, expect=Exit.PASS)


def test_from_on_a_full_disk_puts_the_earlier_run_back_and_says_where_it_is(
    engine, engine_process, tmp_path: Path
) -> None:
    spec, first = failed_first_run(engine, tmp_path)
    run = tmp_path / "r"
    before = {p: (run / p).read_bytes() for p in ("evidence.json", "logs/leg1.log", "logs/leg2.log")}
    args = resumed(spec, "--set", "leg2_rc=0")
    r = engine_process(*args, cwd=tmp_path, timeout=120, preexec=file_size_limit(200))
    assert "Traceback" not in r.err, r
    assert r.code == Exit.ERROR, r
    verdict = r.out.strip().splitlines()[-1]
    assert verdict.startswith(f"VERDICT resumable ERROR could not write {run}/evidence.json: File too large (EFBIG)")
    assert "and was not judged: no evidence.json of it could be written" in verdict
    assert "the earlier run's files are back where they were: evidence.json holds the run of" in r.err
    # Nothing lost: every file as it was, nothing set aside, and the run can be resumed again.
    assert {p: (run / p).read_bytes() for p in before} == before
    assert list(run.glob("previous-*")) == [] and list(run.glob(".evidence.*")) == []
    engine(*args, cwd=tmp_path, expect=Exit.PASS)


def test_a_set_aside_that_cannot_move_every_file_moves_none(engine, engine_process, tmp_path: Path) -> None:
    spec, first = failed_first_run(engine, tmp_path)
    run = tmp_path / "r"
    elsewhere = tmp_path / "logs-elsewhere"
    shutil.copytree(run / "logs", elsewhere)
    # In a mount namespace of its own, the run's logs/ is a bind mount: no file moves out of it
    # by rename (EXDEV), as on a run dir whose logs are on a disk of their own.
    script = 'mount --bind "$1" "$2/logs" || exit 99; exec "$3" -m engine.cli run "$4" --run-dir "$2" --from wipe'
    unshared = ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh")
    r = engine_process(
        command=(*unshared, str(elsewhere), str(run), sys.executable, str(spec)), cwd=tmp_path, timeout=120
    )
    if r.code == 99 or "unshare:" in r.err:
        pytest.skip(f"no private mount namespace here: {r.err.strip()}")
    assert r.code == Exit.USAGE, r
    assert "cannot set the earlier run's files aside in previous-" in r.err
    assert "nothing was moved" in r.err
    assert json.loads((run / "evidence.json").read_text()) == first and list(run.glob("previous-*")) == []
    assert lines(run / "leg2.count") == ["ran"]
