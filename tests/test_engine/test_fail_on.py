"""`output.fail_on`: a line a leg prints only when it failed (the trainer's `CKPT FAILED: `, a rank's
traceback) fails the leg whatever its exit code, quoted with its line number in every report; `engine
replay` finds such lines in a saved run's raw log with the spec's current rules, `engine check` reads
the ones the run recorded (and refuses a run whose rules changed since). Real legs (tests/legs/leg.py)
print the lines and exit 0; the P4 rule is read from the shipped specs and matched against the
trainer's own failure lines and the saved healthy runs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from engine_helpers import Engine, leg, write_spec

from engine.run.lines import Block
from engine.run.output import Capture, compile_rules, reharvest
from engine.spec.load import load_spec
from engine.spec.plan import build_plan

ROOT = Path(__file__).resolve().parents[2]
PREFIX = r"^\[(?:default|rank|worker)\d*\]:\s*"
FAIL_ON = ["^CKPT FAILED: ", r"^Traceback \(most recent call last\):"]
TOKEN = "hf_failonSECRETfailonSECRET0123"
# A healthy leg's lines, then the trainer's failed push as torchrun --tee prints it, then more.
PRINTS = [
    "[default0]:step 10/20 loss 5.1807",
    "[default0]:CKPT push step=20 -> ckpt/checkpoint-20",
    f"[default0]:CKPT FAILED: push of step 20 to https://u:{TOKEN}@hub/o/n failed: ConnectionError",
    "[default1]:Traceback (most recent call last):",
    '[default1]:  File "trainer/train.py", line 9, in main',
    "[default0]:RUN_JSON {}",
]


REPORTED = {"name": "reported", "why": "the leg reported", "expr": "steps.leg1.harvest.run_json == `{}`"}


def printing_spec(
    path: Path, fail_on: list[str] | None, prints: list[str] = PRINTS, warn_on: list[str] | None = None
) -> Path:
    """A spec whose one leg (leg1) prints `prints` and exits 0 (unless an `@rc:` says otherwise), read with the
    `fail_on` and `warn_on` rules given (None: no such rule); its check passes when the leg printed `RUN_JSON {}`."""
    output: dict = {"strip_prefix": PREFIX, "harvest": {"run_json": {"marker": "RUN_JSON "}}}
    if fail_on is not None:
        output["fail_on"] = fail_on
    if warn_on is not None:
        output["warn_on"] = warn_on
    step = leg(*prints, name="leg1", timeout_s=30, output=output)
    return write_spec(path, [step], name="printed", budget_s=100, values={"hub_token": TOKEN}, checks=[REPORTED])


SAID = 'leg1: exited 0 but printed a failure line: "CKPT FAILED: push of step 20 to https://u:'


def test_a_leg_that_exits_0_but_prints_a_failure_line_fails_quoting_the_line(engine: Engine, tmp_path: Path) -> None:
    spec, run = printing_spec(tmp_path / "s.yaml", FAIL_ON), tmp_path / "run"
    ran = engine("run", str(spec), "--run-dir", str(run), "--junit", str(tmp_path / "j.xml"))
    out = ran.out
    doc = json.loads((run / "evidence.json").read_text())
    leg1 = doc["steps"]["leg1"]
    assert (ran.code, leg1["rc"], leg1["status"]) == (5, 0, "failed")
    assert doc["verdict"]["failed"] == ["step:leg1"]  # the check itself passes: the leg did report
    assert [r["outcome"] for r in doc["checks"]] == ["PASS"]
    # Each line with its number in the leg's log and the rule that matched it, masked like the log.
    assert leg1["fail_on"] == {
        "count": 2,
        "lines": [
            {
                "line": 3,
                "text": "CKPT FAILED: push of step 20 to https://u:<redacted>@hub/o/n failed: ConnectionError",
                "pattern": "^CKPT FAILED: ",
            },
            {"line": 4, "text": "Traceback (most recent call last):", "pattern": FAIL_ON[1]},
        ],
    }
    assert TOKEN not in (run / "evidence.json").read_text() and TOKEN not in out
    lead = SAID + '<redacted>@hub/o/n failed: ConnectionError" (line 3), and 1 more failure line'
    # Said as the leg ends, and first in the report, right above the table.
    lines = out.splitlines()
    assert f"   {lead}" in lines
    table = next(i for i, line in enumerate(lines) if line.startswith("check "))
    assert lines[table - 1] == lead
    assert "step:leg1  failed   rc 0, printed a failure line (line 3)" in out
    failure = ET.parse(tmp_path / "j.xml").getroot().find("testcase[@name='leg1']/failure")
    assert failure is not None and failure.get("message", "").startswith("failed: exited 0 but printed a failure line")


def test_the_same_leg_without_the_rule_passes(engine: Engine, tmp_path: Path) -> None:
    """What `failure_patterns` alone does today: a leg that exits 0 passes, whatever it printed."""
    spec, run = printing_spec(tmp_path / "s.yaml", None), tmp_path / "run"
    assert (
        engine("run", str(spec), "--run-dir", str(run)).code == 0
        and "fail_on" not in json.loads((run / "evidence.json").read_text())["steps"]["leg1"]
    )


def test_replay_finds_the_failure_line_a_spec_now_names_and_check_refuses_the_run(
    engine: Engine, tmp_path: Path
) -> None:
    spec, run = printing_spec(tmp_path / "s.yaml", None), tmp_path / "run"
    assert engine("run", str(spec), "--run-dir", str(run)).code == 0
    printing_spec(spec, FAIL_ON)
    ran = engine("check", str(spec), "--evidence", str(run))
    said = ran.out + ran.err
    assert ran.code == 2 and "the output rules changed since the run" in said and "output.fail_on" in said
    ran = engine("replay", str(spec), "--evidence", str(run))
    assert ran.code == 5, ran.out + ran.err
    assert ran.out.splitlines()[1].startswith(SAID)
    assert "step leg1: the evidence says status 'ok', but it exited 0 but printed a failure line" in ran.err
    record = json.loads(next(run.glob("replay-*.json")).read_text())
    assert record["verdict"]["failed"] == ["step:leg1"]
    assert record["steps"]["leg1"]["fail_on"]["lines"][0]["line"] == 3
    assert record["steps"]["leg1"]["failure_lines"]  # kept as for any failed leg


def test_check_reads_the_recorded_failure_line_even_under_a_status_edited_to_ok(engine: Engine, tmp_path: Path) -> None:
    spec, run = printing_spec(tmp_path / "s.yaml", FAIL_ON), tmp_path / "run"
    assert engine("run", str(spec), "--run-dir", str(run)).code == 5
    ran = engine("check", str(spec), "--evidence", str(run))
    assert ran.code == 5 and ran.out.splitlines()[1].startswith(SAID)
    doc = json.loads((run / "evidence.json").read_text())
    doc["steps"]["leg1"]["status"] = "ok"
    (run / "evidence.json").write_text(json.dumps(doc))
    ran = engine("check", str(spec), "--evidence", str(run))
    assert ran.code == 5 and "but it exited 0 but printed a failure line" in ran.err
    # A replay whose rules no longer name the line lets the leg pass again: the lines are the rules'.
    printing_spec(spec, ["^never printed$"])
    assert engine("replay", str(spec), "--evidence", str(run)).code == 0


def test_a_leg_that_exits_nonzero_and_prints_a_failure_line_is_reported_by_its_exit(
    engine: Engine, tmp_path: Path
) -> None:
    spec, run = printing_spec(tmp_path / "s.yaml", FAIL_ON, [*PRINTS, "@rc:4"]), tmp_path / "run"
    ran = engine("run", str(spec), "--run-dir", str(run))
    assert ran.code == 5 and 'leg1: exited 4 and printed a failure line: "CKPT FAILED: ' in ran.out


def test_a_bad_fail_on_regex_is_an_invalid_spec_naming_where(engine: Engine, tmp_path: Path) -> None:
    spec = printing_spec(tmp_path / "s.yaml", ["^CKPT FAILED: ", "(unclosed"])
    ran = engine("validate", str(spec))
    assert ran.code == 2 and "$.steps[0].run.output.fail_on[1]" in ran.out and "bad regex '(unclosed'" in ran.out


# ---- the P4 specs' rule: the trainer's failure lines, and never a healthy leg's


def p4_rules(spec: str = "p4_smoke.yaml") -> dict:
    plan = build_plan(load_spec(ROOT / "specs" / spec), environ={})
    legs = [s for s in plan.steps if s["kind"] == "run" and "trainer.train" in s["run"]["argv"]]
    assert legs and all(s["run"]["output"] == legs[0]["run"]["output"] for s in legs)
    return legs[0]["run"]


@pytest.mark.parametrize(
    "line",
    [
        # trainer/train.py: a refusal (exit 3), a failed push (exit 4), bad flags (exit 2), argparse's own.
        "[default0]:refused: --resume must: repo file:///s/o/n does not exist",
        "[default0]:CKPT FAILED: push of step=20 to file:///s/o/n failed: StoreError: disk full",
        "[default1]:python -m trainer.train: error: --stop-after-steps 25 is not a push step",
        "[default0]:train.py: error: argument --lr: invalid float value: 'x'",
        # A rank's uncaught exception, and a push thread's (threading prints the same header).
        "[default1]:Traceback (most recent call last):",
    ],
)
def test_the_p4_legs_fail_on_each_failure_line_the_trainer_prints(line: str) -> None:
    rules = compile_rules(p4_rules())
    capture = Capture(rules)
    capture.feed(Block(f"[default0]:step 1/20 loss 6.2\n{line}", 2, 1, rules.strip_prefix))
    assert capture.fail_on_result() is not None and capture.fail_on_result()["lines"][0]["line"] == 2


@pytest.mark.parametrize("spec", ["p4_smoke", "p4_soak", "p4_preempt"])
def test_no_line_of_the_saved_healthy_runs_is_a_p4_failure_line(spec: str) -> None:
    """The saved runs under evidence/ are real runs of these specs that passed: every leg's raw log,
    re-read with the rule, names no failure line (the lookalikes a healthy leg prints included)."""
    run_dir = ROOT / "evidence" / spec
    saved = json.loads((run_dir / "evidence.json").read_text())
    legs = [name for name, s in saved["steps"].items() if s.get("kind") == "run" and name.startswith("leg")]
    assert legs == ["leg1", "leg2"]
    for name in legs:
        fresh = reharvest({"run": p4_rules(f"{spec}.yaml")}, run_dir / saved["steps"][name]["log"], run_dir)
        assert fresh["lines"] > 10 and fresh["fail_on"] is None, (spec, name, fresh["fail_on"])


# ---- `output.warn_on` and a crashed leg's last exception line: said in every report, fail nothing by themselves

CRASH = [
    "step 1 loss 2.0",
    "/lib/fit_loop.py:312: UserWarning: this dataloader is not resumable; restarting the epoch",
    "step 2 loss 1.9",
    "Traceback (most recent call last):",
    '  File "train.py", line 9, in main',
    "ValueError: inner failure",
    "During handling of the above exception, another exception occurred:",
    "FileExistsError: checkpoint_0 already exists",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "@rc:1",
]


def test_a_crashed_leg_shows_its_last_exception_line_and_its_warnings_in_every_report(
    engine: Engine, tmp_path: Path
) -> None:
    spec = printing_spec(tmp_path / "s.yaml", None, CRASH, warn_on=["Warning: "])
    run, html = tmp_path / "run", tmp_path / "r.html"
    ran = engine("run", str(spec), "--run-dir", str(run), "--html", str(html))
    leg1 = json.loads((run / "evidence.json").read_text())["steps"]["leg1"]
    # The launcher's own line names no reason (nothing after its name): the last one that does is kept.
    assert leg1["exception"] == {"line": 8, "text": "FileExistsError: checkpoint_0 already exists"}
    assert leg1["warn_on"] == {"count": 1, "lines": [{"line": 2, "text": CRASH[1], "pattern": "Warning: "}]}
    row = next(line for line in ran.out.splitlines() if line.startswith("step:leg1"))
    assert row.startswith("step:leg1  failed   rc 1,")
    assert 'last exception: "FileExistsError: checkpoint_0 already exists" (line 8)' in row
    assert f"warned: {json.dumps(CRASH[1])} (line 2)" in row
    page = html.read_text()
    assert "last exception: &quot;FileExistsError: checkpoint_0 already exists&quot;" in page
    assert "2: /lib/fit_loop.py:312: UserWarning: this dataloader is not resumable" in page
    # `engine replay` finds both again in the raw log, with the spec's current rules.
    replayed = engine("replay", str(spec), "--evidence", str(run))
    assert (ran.code, replayed.code) == (5, 5) and row in replayed.out


def test_a_leg_that_warned_and_exited_0_passes_with_its_warning_as_a_note(engine: Engine, tmp_path: Path) -> None:
    spec = printing_spec(tmp_path / "s.yaml", None, [*CRASH[:3], "RUN_JSON {}"], warn_on=["Warning: "])
    ran = engine("run", str(spec), "--run-dir", str(tmp_path / "run"))
    assert ran.code == 0 and "warned: " in ran.out and "last exception" not in ran.out


def test_capture_keeps_the_last_exception_line_across_blocks() -> None:
    capture = Capture(compile_rules({}))
    capture.feed(Block.from_lines(["[rank0]: RuntimeError: first", "ok"], 1))
    capture.feed(Block.from_lines(["KeyError: 'model'", "a line about an Error: not one"], 3))
    assert capture.exception_result() == {"line": 3, "text": "KeyError: 'model'"}
