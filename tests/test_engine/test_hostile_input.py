"""Hostile specs and hostile evidence end in a clear error (exit 2 naming the input, or the step's own
error), never a traceback: a harvest too deep to read, an argv the OS refuses, a run dir or report that cannot
be written, evidence and bundles that point outside themselves, an alias bomb, control characters."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from engine_helpers import (
    TOKEN,
    Engine,
    evidence_of,
    files_holding,
    leg,
    no_traceback,
    python_leg,
    write_spec,
)


def test_run_json_nested_100000_deep_or_with_a_5000_digit_integer_is_a_harvest_error(engine, tmp_path):
    code = (
        "print('DEEP ' + '[' * 100000 + ']' * 100000); print('BIG {\"n\": ' + '7' * 5000 + '}');"
        "print('FINE {\"n\": 1}')"
    )
    spec = write_spec(
        tmp_path / "s.yaml",
        [
            python_leg(
                code,
                output={
                    "harvest": {"deep": {"marker": "DEEP "}, "big": {"marker": "BIG "}, "fine": {"marker": "FINE "}}
                },
            )
        ],
        checks=[{"name": "fine", "why": "the sane marker is still read", "expr": "steps.leg.harvest.fine.n == `1`"}],
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    # The engine reads on and the sane marker passes its check; the two it could not read fail the
    # verdict as harvest problems (the value a check would read is not what the leg meant).
    assert proc.code == 5 and 'VERDICT probe FAIL ["harvest:leg.deep", "harvest:leg.big"]' in proc.out
    assert "fine" in proc.out and evidence_of(tmp_path / "r")["checks"][0]["outcome"] == "PASS"
    errors = {e["name"]: e["error"] for e in evidence_of(tmp_path / "r")["steps"]["leg"]["harvest_errors"]}
    assert "nested" in errors["deep"] and "5,000 digits" in errors["big"], errors


def test_a_jmespath_expression_nested_3000_deep_is_invalid_not_a_crash(engine, tmp_path):
    expr = "(" * 3000 + "steps.leg.rc" + ")" * 3000 + " == `0`"
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")], checks=[{"name": "deep", "why": "w", "expr": expr}])
    proc = engine("validate", str(spec), cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 2 and "$.checks[0].expr" in proc.out and "nested" in proc.out


@pytest.mark.parametrize(
    "step,named",
    [
        (leg("a\0b"), "argv[2] contains a NUL byte"),
        (leg("hi", env={"BAD=NAME": "x"}), "environment variable name 'BAD=NAME' is not valid"),
        (leg("hi", env={"GOOD": "x\0y"}), "environment variable GOOD contains a NUL byte"),
    ],
)
def test_argv_nul_or_a_bad_environment_name_fails_the_step_with_a_message(engine, tmp_path, step, named):
    spec = write_spec(tmp_path / "s.yaml", [step])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 5 and "VERDICT probe FAIL" in proc.out
    assert named in evidence_of(tmp_path / "r")["steps"]["leg"]["error"]


@pytest.mark.parametrize("where", ["file", "/dev/null", "/proc/specprobe-run"])
def test_a_run_dir_that_cannot_be_one_is_refused_before_anything_runs(engine, tmp_path, where):
    (tmp_path / "file").write_text("x")
    marker = tmp_path / "ran"
    spec = write_spec(tmp_path / "s.yaml", [leg(f"@pidfile:{marker}")])
    proc = engine("run", str(spec), "--run-dir", where, cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 2 and "--run-dir" in proc.err and "VERDICT" not in proc.out
    assert not marker.exists()


@pytest.mark.parametrize("flag", ["--junit", "--markdown"])
def test_an_unwritable_report_is_refused_before_the_legs_run(engine, tmp_path, flag):
    (tmp_path / "afile").write_text("x")
    marker = tmp_path / "ran"
    spec = write_spec(tmp_path / "s.yaml", [leg(f"@pidfile:{marker}")])
    proc = engine("run", str(spec), "--run-dir", "r", flag, "afile/report", cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 2 and f"{flag} afile/report" in proc.err
    assert "VERDICT" not in proc.out and not marker.exists()


def test_a_report_that_became_unwritable_during_the_run_is_an_error_before_the_verdict(engine, tmp_path):
    # The leg turns the report's directory into a file: the check at the start passed.
    (tmp_path / "out").mkdir()
    code = "import shutil; shutil.rmtree('out'); open('out', 'w').close()"
    spec = write_spec(tmp_path / "s.yaml", [python_leg(code)])
    proc = engine("run", str(spec), "--run-dir", "r", "--junit", "out/junit.xml", cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 2 and "could not write the report out/junit.xml" in proc.err
    assert evidence_of(tmp_path / "r")["verdict"]["outcome"] == "PASS"  # the run itself is kept


@pytest.mark.parametrize(
    "content,says",
    [
        (b'{"evidence_version": 1, "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested"),
        (b'{"evidence_version": 1, "x": ' + b"[" * 500 + b"]" * 500 + b"}", "nested more than"),
        (json.dumps({"evidence_version": 1, "steps": [], "values": "x"}).encode(), "$.steps: expected an object"),
        (
            json.dumps({"evidence_version": 1, "steps": {"leg": {"status": 3, "log": "/etc/passwd"}}}).encode(),
            "$.steps.leg.status: expected a string",
        ),
        (b'{"evidence_version": 1, "mode": "\xff\xfe"}', "not UTF-8"),
    ],
)
def test_check_on_hostile_evidence_is_refused_naming_the_problem(engine, tmp_path, content, says):
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")])
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "evidence.json").write_bytes(content)
    proc = engine("check", str(spec), "--evidence", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 2 and says in proc.err and "evidence.json" in proc.err


def test_replay_reads_no_raw_log_outside_the_run_dir(engine, tmp_path):
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")])
    (tmp_path / "r").mkdir()
    doc = {"evidence_version": 1, "steps": {"leg": {"kind": "run", "status": "ok", "log": "../../etc/passwd"}}}
    (tmp_path / "r" / "evidence.json").write_text(json.dumps(doc))
    proc = engine("replay", str(spec), "--evidence", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 2 and "is not a path inside the run directory" in proc.err


def failed_run(engine: Engine, tmp_path: Path) -> Path:
    """A saved run of a failed leg (its failure lines are re-harvested by a replay)."""
    spec = write_spec(tmp_path / "s.yaml", [leg("Error: the leg failed", "@rc:1")])
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=5)
    return tmp_path / "r"


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda log: log.symlink_to("/proc/self/environ"), "outside"),
        (lambda log: log.symlink_to("/dev/zero"), "outside"),
        (lambda log: os.mkfifo(log), "not a regular file (a FIFO)"),
        (lambda log: log.symlink_to(log.parent.parent.parent / "elsewhere.log"), "outside"),
    ],
    ids=["environ", "device", "fifo", "file-outside"],
)
def test_replay_refuses_a_bundle_log_that_is_not_a_regular_file_inside_it(engine, tmp_path, make, says):
    run = failed_run(engine, tmp_path)
    (tmp_path / "elsewhere.log").write_text(f"Error HF_TOKEN={TOKEN}\n")
    log = run / "logs" / "leg.log"
    log.unlink()
    make(log)
    proc = engine("replay", str(tmp_path / "s.yaml"), "--evidence", "r", cwd=tmp_path, env={"HF_TOKEN": TOKEN})
    no_traceback(proc)
    assert proc.code == 2 and proc.err.startswith("raw log r/logs/leg.log: ") and says in proc.err
    assert TOKEN not in proc.out + proc.err
    assert not list(run.glob("replay-*")) and files_holding(run, TOKEN.encode()) == []


def test_replay_reads_a_log_linked_inside_its_bundle(engine, tmp_path):
    run = failed_run(engine, tmp_path)
    (run / "logs" / "leg.log").rename(run / "logs" / "kept.log")
    (run / "logs" / "leg.log").symlink_to("kept.log")
    proc = engine("replay", str(tmp_path / "s.yaml"), "--evidence", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 5 and len(list(run.glob("replay-*.json"))) == 1


def test_check_refuses_an_evidence_file_that_links_out_of_its_bundle(engine, tmp_path):
    run = failed_run(engine, tmp_path)
    (run / "evidence.json").rename(tmp_path / "evidence.json")
    (run / "evidence.json").symlink_to(tmp_path / "evidence.json")
    proc = engine("check", str(tmp_path / "s.yaml"), "--evidence", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 2 and f"resolves to {tmp_path / 'evidence.json'}, outside r" in proc.err


def test_what_a_replay_writes_from_a_bundle_passes_the_secret_filter(engine, tmp_path):
    # The bundle's own log holds this machine's token (a bundle may hold anything): the replay's
    # record, its reports and its terminal output show it redacted.
    run = failed_run(engine, tmp_path)
    (run / "logs" / "leg.log").write_text(f"Error: login {TOKEN} refused\n", encoding="utf-8")
    proc = engine(
        "replay",
        str(tmp_path / "s.yaml"),
        *"--evidence r --junit j.xml --markdown m.md".split(),
        cwd=tmp_path,
        env={"HF_TOKEN": TOKEN},
    )
    no_traceback(proc)
    assert proc.code == 5
    (record,) = run.glob("replay-*.json")
    assert json.loads(record.read_text())["steps"]["leg"]["failure_lines"] == ["Error: login <redacted> refused"]
    assert TOKEN not in proc.out + proc.err
    assert files_holding(tmp_path, TOKEN.encode()) == [str(run / "logs" / "leg.log")]


def test_a_re_check_record_is_never_written_through_a_link_the_bundle_planted(engine, tmp_path):
    # The record's temporary name is predictable (the second it is written in): a bundle could hold
    # a link there to any file of the reviewer's; the record goes through a file of its own.
    from datetime import datetime, timedelta, timezone

    run = failed_run(engine, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    now = datetime.now(timezone.utc)
    for second in range(30):
        stamp = (now + timedelta(seconds=second)).strftime("%Y%m%dT%H%M%SZ")
        (run / f"check-{stamp}.json.tmp").symlink_to(victim)
    proc = engine("check", str(tmp_path / "s.yaml"), "--evidence", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 5 and victim.read_text() == "keep me\n"
    (record,) = run.glob("check-*.json")
    assert json.loads(record.read_text())["kind"] == "check"


def test_a_yaml_alias_bomb_is_refused_quickly(engine_process, tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    text = "version: 1\nname: bomb\nbudget_s: 10\nvalues:\n" + "".join(f"  {line}\n" for line in lines)
    (tmp_path / "s.yaml").write_text(text + "steps: []\nchecks: [{name: c, why: w, expr: '`true`'}]\n")
    proc = engine_process("validate", "s.yaml", cwd=tmp_path, timeout=60)
    no_traceback(proc)
    assert proc.code == 2 and "expands to more than 100,000 nodes (a YAML alias bomb?)" in proc.out


def test_remove_refuses_paths_outside_the_run_dir_unless_allowed(engine, tmp_path):
    outside = tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    work = tmp_path / "work"
    work.mkdir()
    spec = write_spec(work / "s.yaml", [leg("hi"), {"name": "wipe", "remove": ["../outside/victim"]}])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=work)
    no_traceback(proc)
    assert "outside the run directory" in evidence_of(work / "r")["steps"]["wipe"]["error"]
    assert (outside / "victim").exists()
    spec = write_spec(
        work / "s2.yaml",
        [leg("hi"), {"name": "wipe", "remove": {"paths": ["../outside/victim"], "also_under": [str(outside)]}}],
    )
    proc = engine("run", str(spec), "--run-dir", "r2", cwd=work)
    no_traceback(proc)
    assert evidence_of(work / "r2")["steps"]["wipe"]["status"] == "ok" and not (outside / "victim").exists()


@pytest.mark.parametrize("target", [".git", "specs", ".", "specs/s.yaml"])
def test_remove_of_the_checkout_or_its_specs_is_refused_naming_the_value(engine, tmp_path, target):
    """`--set train_out=.git` turns a wipe into `rm -rf .git`: refused, naming the value, even where the
    step allows the working tree (`also_under`), and the run fails."""
    checkout = tmp_path / "checkout"
    (checkout / ".git" / "objects").mkdir(parents=True)
    (checkout / "specs").mkdir()
    wipe = {"name": "wipe", "remove": {"paths": ["${train_out}"], "also_under": ["${work_dir}"]}}
    spec = write_spec(checkout / "specs" / "s.yaml", [leg("hi"), wipe], values={"train_out": "${run_dir}/train"})
    proc = engine("run", str(spec), "--run-dir", str(tmp_path / "r"), "--set", f"train_out={target}", cwd=checkout)
    no_traceback(proc)
    assert proc.code == 5, proc
    error = evidence_of(tmp_path / "r")["steps"]["wipe"]["error"]
    assert error.startswith(f"refusing to remove {os.path.abspath(checkout / target)} (from `${{train_out}}`: ")
    assert f'train_out = "{target}" (given by --set))' in error
    assert (checkout / ".git" / "objects").is_dir() and (checkout / "specs" / "s.yaml").is_file()


def test_remove_still_takes_what_the_run_dir_holds_and_a_declared_scratch_root(engine, tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "old").mkdir(parents=True)
    wipe = {
        "name": "wipe",
        "remove": {"paths": ["${run_dir}/train", str(scratch / "old")], "also_under": [str(scratch)]},
    }
    spec = write_spec(tmp_path / "s.yaml", [leg("@append:${run_dir}/train:x"), wipe])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    assert proc.code == 0, proc
    assert evidence_of(tmp_path / "r")["steps"]["wipe"]["removed"] == [
        str(tmp_path / "r" / "train"),
        str(scratch / "old"),
    ]


def test_control_characters_from_a_leg_reach_neither_the_terminal_nor_the_junit(engine, tmp_path):
    nasty = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07\x00\x08\x9b"
    code = f"import sys; print('KEY> ' + {nasty!r}); print('Error ' + {nasty!r}); sys.exit(1)"
    spec = write_spec(
        tmp_path / "s.yaml",
        [python_leg(code, output={"echo_prefixes": ["KEY>"]})],
    )
    proc = engine("run", str(spec), "--run-dir", "r", "--junit", "j.xml", cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 5 and "KEY> \\x1b]0;pwned\\x07" in proc.out
    assert not any(c in proc.out + proc.err for c in "\x1b\x07\x00\x08\x9b")
    failure = ET.parse(tmp_path / "j.xml").getroot().find("testcase/failure")
    assert failure is not None and "Error ]0;pwned" in failure.text


BIDI = "\u202e\u2066\u200f\u061c"  # right-to-left override, left-to-right isolate, RTL mark, Arabic mark


def test_bidirectional_controls_from_a_spec_or_a_leg_reach_every_report_escaped(engine, tmp_path):
    code = f"import sys; print('Error ' + {BIDI!r} + 'yrros'); sys.exit(1)"
    check = {"name": "ok", "why": f"passes {BIDI}", "expr": f"steps.leg.rc == `0` && 'a{BIDI}b' != ''"}
    steps = [python_leg(code)]
    old = write_spec(tmp_path / "old.yaml", steps)
    new = write_spec(tmp_path / "new.yaml", steps, checks=[check])
    reports = ("--junit", "j.xml", "--markdown", "m.md", "--html", "h.html")
    run = engine("run", str(new), "--run-dir", "r", *reports, cwd=tmp_path)
    check_md = engine("check", str(new), "--evidence", "r", "--markdown", "-", cwd=tmp_path)
    diff = engine("diff", str(old), str(new), "--markdown", "d.md", cwd=tmp_path)
    assert (run.code, check_md.code, diff.code) == (5, 5, 1)
    shown = {
        "terminal": run.out + run.err,
        "check --markdown -": check_md.out,
        "diff": diff.out,
        **{name: (tmp_path / name).read_text(encoding="utf-8") for name in ("j.xml", "m.md", "h.html", "d.md")},
    }
    for where, text in shown.items():
        assert not any(c in text for c in BIDI), where
        assert "\\u202e\\u2066\\u200f\\u061c" in text, where
    failure = ET.parse(tmp_path / "j.xml").getroot().find("testcase/failure")
    assert failure is not None and "Error \\u202e\\u2066\\u200f\\u061cyrros" in failure.text


def test_an_existing_non_empty_run_dir_is_refused_without_force(engine, tmp_path):
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")])
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "precious.txt").write_text("keep me")
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 2 and "exists and is not empty (precious.txt)" in proc.err
    assert not (tmp_path / "r" / "evidence.json").exists()
    proc = engine("run", str(spec), "--run-dir", "r", "--force", cwd=tmp_path, expect=0)
    assert (tmp_path / "r" / "precious.txt").read_text() == "keep me"
