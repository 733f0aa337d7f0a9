"""`output.child_exit`: a launcher's failing child (torchrun's trainer) reported by its own exit code
and message, first, in every report; a spec that gains the rule re-reads a saved run with
`engine replay`, and `engine check` does not refuse the run for it. The rule is the P4 specs' own;
the lines are torchrun's, as it prints them (the real thing runs in tests/e2e/test_refusal_report.py)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from engine_helpers import write_spec

from engine.run.lines import Block
from engine.run.output import Capture, compile_rules
from engine.show import html, report
from engine.spec.load import load_spec
from engine.spec.plan import build_plan

ROOT = Path(__file__).resolve().parents[2]

# What a 2-rank torchrun prints when the trainer refuses (--tee 3 prefixes the ranks' lines): rank 1
# was stopped by torchrun (-15) after rank 0 exited 3; the report lists the root cause last.
TORCHRUN_REFUSAL = """\
[default0]:mix: /data shards=4 total_tokens=4000000 vocab=512
[default0]:refused: latest.json in file:///s/o/n is terminal (step 20): the run is finished
[default1]:error: not the first line that says error
E1201 15:37:48.036000 21907 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 3) local_rank: 0 (pid: 21917) of binary: python
Traceback (most recent call last):
  File "torch/distributed/run.py", line 1028, in main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
trainer.train FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 21918)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 3 (pid: 21917)
  error_file: <N/A>
============================================================
""".splitlines()


def p4_leg_output() -> dict:
    plan = build_plan(load_spec(ROOT / "specs" / "p4_smoke.yaml"), environ={})
    return next(s for s in plan.steps if s["name"] == "leg1")["run"]["output"]


def test_the_p4_rule_finds_the_trainer_s_code_in_torchrun_s_report_and_its_refusal_line():
    rules = compile_rules({"output": p4_leg_output()})
    capture = Capture(rules)
    # In two blocks, the report in the second: the code is the LAST one, the message the FIRST.
    capture.feed(Block("\n".join(TORCHRUN_REFUSAL[:4]), 4, 1, rules.strip_prefix))
    capture.feed(Block("\n".join(TORCHRUN_REFUSAL[4:]), len(TORCHRUN_REFUSAL) - 4, 5, rules.strip_prefix))
    assert capture.child_exit() == {
        "name": "the trainer",
        "code": 3,
        "message": "refused: latest.json in file:///s/o/n is terminal (step 20): the run is finished",
        "line": 2,
    }


def test_a_push_failure_and_a_killed_child_read_as_such():
    rules = compile_rules({"output": p4_leg_output()})
    capture = Capture(rules)
    lines = ["[default0]:CKPT FAILED: push of step=10 to file:///s failed: disk full", "  exitcode  : 4 (pid: 7)"]
    capture.feed(Block("\n".join(lines), 2, 1, rules.strip_prefix))
    evidence = {"steps": {"leg1": {"status": "failed", "child_exit": capture.child_exit()}}}
    assert report.child_exits(evidence) == [
        "leg1: the trainer exited 4: CKPT FAILED: push of step=10 to file:///s failed: disk full"
    ]
    evidence["steps"]["leg1"]["child_exit"] = {"name": "the trainer", "code": -9, "message": None}
    assert report.child_exits(evidence) == ["leg1: the trainer died of SIGKILL (exit code -9)"]


def test_a_saved_child_exit_of_the_wrong_types_is_reported_without_believing_it():
    steps = {
        "a": {"status": "failed", "child_exit": {"name": 7, "code": "3; rm -rf", "message": ["x"]}},
        "b": {"status": "failed", "child_exit": "the trainer exited 0"},
        "c": {"status": "ok", "child_exit": {"name": "t", "code": 3}},  # a passing leg says nothing
    }
    assert report.child_exits({"steps": steps}) == ["a: the child failed"]


def launched_spec(path: Path, rule: dict | None = None) -> Path:
    output: dict = {"strip_prefix": r"^\[(?:default|rank|worker)\d*\]:\s*"}
    if rule is not None:
        output["child_exit"] = rule
    code = "import sys; print(sys.argv[1]); sys.exit(1)"
    run = {"argv": [sys.executable, "-c", code, "\n".join(TORCHRUN_REFUSAL)], "timeout_s": 30, "output": output}
    return write_spec(path, [{"name": "leg", "run": run}], name="launched", budget_s=100)


RULE = {"name": "the trainer", "code": r"^\s*exitcode\s*:\s*(?P<code>-?\d+)", "message": "^refused: "}


def test_a_spec_that_gains_the_rule_replays_a_saved_run_with_it_and_checks_it_as_it_was(engine, tmp_path):
    spec = launched_spec(tmp_path / "s.yaml")
    run = tmp_path / "r"
    out = engine("run", str(spec), "--run-dir", str(run), expect=5).out
    assert "the trainer" not in out  # no rule, no claim
    launched_spec(spec, RULE)
    ran = engine("check", str(spec), "--evidence", str(run), expect=5)
    assert "output rules changed" not in ran.out + ran.err  # a reporting rule: not a changed harvest
    out = engine("replay", str(spec), "--evidence", str(run), "--junit", str(tmp_path / "j.xml"), expect=5).out
    said = "leg: the trainer exited 3: refused: latest.json in file:///s/o/n is terminal (step 20): the run is finished"
    # The replay says it is one first, then the leg's own exit, before any check.
    assert out.splitlines()[0].startswith("replayed (logs re-harvested) and re-checked at ")
    assert out.splitlines()[1] == said
    record = json.loads(next(run.glob("replay-*.json")).read_text())
    assert record["steps"]["leg"]["child_exit"]["code"] == 3
    failure = ET.parse(tmp_path / "j.xml").getroot().find("testcase[@name='leg']/failure")
    assert failure is not None and failure.get("message", "").startswith("failed: the trainer exited 3: refused: ")
    page = html.render(record | {"spec": {"name": "launched"}}, [], record["verdict"])
    assert f'<p class="child"><strong>{said}</strong></p>' in page


def test_a_code_rule_without_its_named_group_is_an_invalid_spec_naming_where(engine, tmp_path):
    spec = launched_spec(tmp_path / "s.yaml", {**RULE, "code": r"exitcode\s*:\s*(-?\d+)"})
    out = engine("validate", str(spec), expect=2).out
    assert f"{spec}:" in out and "$.steps[0].run.output.child_exit.code" in out and "(?P<code>...)" in out
