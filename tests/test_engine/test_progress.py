"""A leg's progress line (engine/run/output.py ProgressState, engine/run/console.py ProgressDisplay,
the runner): its own last step, the time left before its timeout, the phase after its last step, and
one warning when the ETA passes the timeout. Real legs (tests/legs/leg.py) under the real runner."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

from engine_helpers import write_spec
from legs.plan_stub import LEG, PlanStub, run_step

from engine.run.console import Console, ProgressDisplay
from engine.run.lines import Block
from engine.run.output import Capture, compile_rules
from engine.run.runner import execute

STEP = r"^step (?P<step>\d+)/(?P<total>\d+)"
PHASES = {"pushing": "^CKPT save ", "validating": "^validation start"}


def run_leg(tmp_path: Path, *actions: str, timeout_s: float = 30, **progress: object) -> tuple[dict, list[str], str]:
    """One leg with a progress rule printing every 0.2 s: (its evidence record, its progress lines, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    leg = run_step("leg1", *actions, timeout_s=timeout_s, progress={"match": STEP, "every_s": 0.2, **progress})
    doc = execute(PlanStub(steps=[leg]), tmp_path / "run", out, is_tty=False, err=err)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("  progress leg1: ")]
    return doc["steps"]["leg1"], lines, err.getvalue()


def test_every_progress_line_says_the_time_left_before_the_timeout(tmp_path: Path) -> None:
    record, lines, _ = run_leg(tmp_path, "@sleep:0.5", "step 1/20", "@sleep:0.3", "step 2/20", "@sleep:0.5")
    first = re.fullmatch(
        r"  progress leg1: no step line yet \((\d+)s elapsed\), (\d+)s left before the 30s timeout", lines[0]
    )
    assert first and int(first[1]) + int(first[2]) == 30, lines
    assert re.fullmatch(
        r"  progress leg1: step 2/20 \(10%\) \S+ step/s ETA \S+, 2\ds left before the 30s timeout", lines[-1]
    ), lines
    assert record["status"] == "ok" and "progress_warning" not in record


def test_a_segment_legs_line_counts_to_its_own_stop_not_the_horizon_it_prints(tmp_path: Path) -> None:
    record, lines, _ = run_leg(tmp_path, "step 1/20", "@sleep:0.3", "step 5/20", "@sleep:0.4", total=10)
    assert any(line.startswith("  progress leg1: step 5/10 (50%) ") for line in lines), lines
    assert record["progress"]["total"] == 10 and record["progress"]["step"] == 5


def test_after_the_last_step_the_line_names_the_phase_and_how_long_instead_of_100_percent(tmp_path: Path) -> None:
    record, lines, _ = run_leg(
        tmp_path,
        "step 1/20",
        "CKPT save step=5 files=5",  # a push before the last step is not the phase after it
        "@sleep:0.3",
        "step 10/20",
        "CKPT save step=10 files=5",
        "@sleep:0.7",
        "validation start tokens=8192",
        "@sleep:0.3",
        # The push thread's line after the validation started: the leg is validating, not back to pushing.
        "CKPT save step=10 files=5",
        "@sleep:1.0",
        total=10,
        phases=PHASES,
    )
    assert not any("pushing" in line for line in lines if "step 1/10" in line), lines
    done = [line for line in lines if "step 10/10" in line]
    assert done and not any("ETA" in line or "step/s" in line for line in done), done
    assert any(re.search(r"step 10/10 \(100%\) done; pushing for \d+s, \S+ left before", line) for line in done), done
    last = re.search(r"step 10/10 \(100%\) done; validating for (\d+)s, \S+ left before the 30s timeout$", done[-1])
    assert last and int(last[1]) >= 1, done  # counted from the validation's own start line
    assert record["status"] == "ok"


def test_without_a_phase_line_the_line_says_how_long_ago_the_last_step_was(tmp_path: Path) -> None:
    _, lines, _ = run_leg(tmp_path, "step 1/4", "@sleep:0.2", "step 4/4", "@sleep:1.3", phases=PHASES)
    last = re.search(r"step 4/4 \(100%\) done (\d+)s ago, \S+ left before the 30s timeout$", lines[-1])
    assert last and int(last[1]) >= 1, lines


def test_an_eta_past_the_timeout_warns_once_on_stderr_and_in_the_evidence(tmp_path: Path) -> None:
    # About 3 steps a second with 990 to go: some 5 minutes, and the leg has 20 s.
    steps = [a for i in range(1, 7) for a in (f"step {i}/1000", "@sleep:0.3")]
    record, lines, err = run_leg(tmp_path, *steps, timeout_s=20)
    warnings = err.splitlines()
    assert len(warnings) == 1, err
    assert re.fullmatch(
        r"WARNING leg1 will not finish before its timeout: at \S+ step/s, step \d/1000 needs about \dm\d\ds "
        r"more, but (1\d|20)s are left before the 20s timeout",
        warnings[0],
    )
    warning = record["progress_warning"]
    assert warning["total"] == 1000 and warning["timeout_s"] == 20 and 2 <= warning["step"] <= 6
    assert warning["eta_s"] > 100 > 20 >= warning["left_s"] > 10
    assert warning["message"] in warnings[0]
    assert record["status"] == "ok"  # a warning, not a failure: the leg ran and exited 0


def test_an_eta_inside_the_timeout_warns_nothing(tmp_path: Path) -> None:
    steps = [a for i in range(1, 7) for a in (f"step {i}/8", "@sleep:0.3")]
    record, _, err = run_leg(tmp_path, *steps, timeout_s=20)
    assert err == "" and "progress_warning" not in record


def test_a_rule_without_a_total_shows_the_step_and_its_rate() -> None:
    # The schema's `total` group is optional: a rule without it must not fail the leg at its start.
    out = io.StringIO()
    rules = compile_rules({"progress": {"match": r"^step (?P<step>\d+)"}})
    capture = Capture(rules)
    capture.feed(Block.from_lines(["step 3"], 1))
    ProgressDisplay("leg1", capture.progress, 0.5, Console(out, is_tty=False), 20).tick(1.0)
    assert out.getvalue() == "  progress leg1: step 3 -- step/s ETA --, 19s left before the 20s timeout\n"


def test_on_a_terminal_the_live_line_carries_the_time_left_and_a_warning_wipes_it_first() -> None:
    out = io.StringIO()
    console = Console(out, is_tty=True, err=out)
    rules = compile_rules({"progress": {"match": STEP}})
    capture = Capture(rules, console)
    display = ProgressDisplay("leg1", capture.progress, rules.progress.every_s, console, 600)
    capture.feed(Block.from_lines(["step 3/10"], 1))
    display.tick(12.0)
    live = "progress leg1: step 3/10 (30%) -- step/s ETA --, 9m48s left before the 10m timeout"
    assert out.getvalue() == "\r" + live
    console.warn("WARNING leg1 will not finish")
    # The live line is wiped before the warning, and drawn again on the next tick.
    assert out.getvalue().endswith("\r" + " " * len(live) + "\rWARNING leg1 will not finish\n")
    display.tick(13.0)
    assert out.getvalue().endswith(
        "\rprogress leg1: step 3/10 (30%) -- step/s ETA --, 9m47s left before the 10m timeout"
    )


WATCHED = """\
version: 1
name: watched
description: a slow leg, then a leg that stops before the horizon its lines print
budget_s: 200
values:
  stop: 3
steps:
  - name: slow
    run:
      argv: {slow}
      timeout_s: 20
      progress: {{match: '{step}', every_s: 0.2}}
  - name: segment
    run:
      argv: {segment}
      timeout_s: 30
      progress: {{match: '{step}', every_s: 0.2, total: "${{stop}}", phases: {phases}}}
checks:
  - name: both_legs_ran
    why: the legs exit cleanly
    expr: "steps.slow.rc == `0` && steps.segment.rc == `0`"
"""


def test_engine_run_shows_the_time_left_warns_past_the_timeout_and_reports_it(engine, tmp_path: Path) -> None:
    slow = [sys.executable, LEG] + [a for i in range(1, 7) for a in (f"step {i}/1000", "@sleep:0.3")]
    segment = [sys.executable, LEG, "step 1/1000", "@sleep:0.3", "step 3/1000", "CKPT save step=3", "@sleep:0.6"]
    text = WATCHED.format(slow=json.dumps(slow), segment=json.dumps(segment), step=STEP, phases=json.dumps(PHASES))
    spec = write_spec(tmp_path / "watched.yaml", text)
    r = engine("run", str(spec), "--run-dir", "r", "--markdown", "m.md", cwd=tmp_path, expect=0)
    assert re.search(
        r"^  progress slow: step \d/1000 \(0%\) \S+ step/s ETA \S+, 1\ds left before the 20s timeout$", r.out, re.M
    )
    assert re.search(
        r"^  progress segment: step 3/3 \(100%\) done; pushing for \d+s, 2\ds left before the 30s timeout$",
        r.out,
        re.M,
    )
    (warning,) = r.err.splitlines()
    assert warning.startswith("WARNING slow will not finish before its timeout: at ")
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    message = doc["steps"]["slow"]["progress_warning"]["message"]
    assert "progress_warning" not in doc["steps"]["segment"] and doc["steps"]["segment"]["progress"]["total"] == 3
    row = f"WARNING the ETA passed the timeout: {message}"
    assert re.search(rf"^step:slow +ok +rc 0, \S+ s, {re.escape(row)}$", r.out, re.M), r.out
    assert f"| `slow` | ok | rc 0, {doc['steps']['slow']['seconds']} s, {row} |" in (tmp_path / "m.md").read_text()


def test_in_a_log_the_first_line_comes_after_10_s_then_one_every_every_s() -> None:
    # A local soak leg lasts 25 s: with only `every 30 s` its log would never show the line.
    out = io.StringIO()
    capture = Capture(compile_rules({"progress": {"match": STEP, "every_s": 30}}))
    display = ProgressDisplay("leg1", capture.progress, 30, Console(out, is_tty=False), 600)
    printed_at = []
    for tenth in range(0, 800):
        before = out.getvalue().count("\n")
        display.tick(tenth / 10)
        if out.getvalue().count("\n") > before:
            printed_at.append(tenth / 10)
    assert printed_at == [10.0, 40.0, 70.0]
    assert out.getvalue().splitlines()[0] == (
        "  progress leg1: no step line yet (10s elapsed), 9m50s left before the 10m timeout"
    )
