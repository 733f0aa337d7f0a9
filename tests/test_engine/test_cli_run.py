"""`engine` as a process under the ordinary ways a run is cut short: a reader that closes the pipe,
a --set that breaks the budget, a storm of Ctrl-Cs. Real subprocesses, real pipes, real signals."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from engine_helpers import LEG, engine_started, write_spec
from processes import file_says, gone

from engine.judge.verdict import Exit
from engine.run.signals import StopSignals

SPEC = """\
version: 1
name: cut_short
description: one leg, one check
budget_s: 100
values:
  t_leg: 30
steps:
  - name: leg1
    run:
      argv: {argv}
      timeout_s: "${{t_leg}}"
      grace_s: {grace}
      ok_exit_codes: [0]
checks:
  - name: leg1_exit_code
    why: the leg exits cleanly
    expr: "steps.leg1.rc == `0`"
"""


def cut_short_spec(*actions: str, grace: int = 5) -> str:
    return SPEC.format(argv=json.dumps([sys.executable, LEG, *actions]), grace=grace)


def closed_early(args: list[str], cwd: Path, read_lines: int = 0) -> tuple[int, str]:
    """Run engine with stdout on a real pipe whose reader reads `read_lines` lines, then closes it
    (`engine ... | head -N`); (exit code, stderr)."""
    proc = engine_started(*args, cwd=cwd)
    assert proc.stdout is not None and proc.stderr is not None
    for _ in range(read_lines):
        proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(timeout=60), err


# ---------------------------------------------------------------- a closed stdout


def test_run_piped_into_head_exits_with_the_verdicts_code(tmp_path: Path) -> None:
    # The leg fails after the reader has gone: `engine run | head -1` must still exit with the failure.
    spec = write_spec(tmp_path / "s.yaml", cut_short_spec("working", "@sleep:1", "@rc:3"))
    rc, err = closed_early(["run", str(spec), "--run-dir", "r"], tmp_path, read_lines=1)
    assert rc == Exit.FAILED, err
    assert 'VERDICT cut_short FAIL ["step:leg1", "leg1_exit_code"]' in err
    assert "standard output was lost (Broken pipe)" in err and "Traceback" not in err
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert doc["verdict"]["exit_code"] == Exit.FAILED and doc["steps"]["leg1"]["rc"] == 3


def test_check_validate_and_diff_keep_their_exit_codes_on_a_closed_pipe(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", cut_short_spec("@rc:3"))
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.FAILED)
    rc, err = closed_early(["check", str(spec), "--evidence", "r"], tmp_path)
    assert rc == Exit.FAILED and "VERDICT cut_short FAIL" in err, err
    bad = tmp_path / "bad.yaml"
    bad.write_text(spec.read_text().replace("budget_s: 100", "budget_s: 1"))
    rc, err = closed_early(["validate", str(spec), str(bad)], tmp_path)
    assert rc == Exit.USAGE and "Traceback" not in err, err
    other = write_spec(tmp_path / "other.yaml", cut_short_spec("@rc:4"))
    rc, err = closed_early(["diff", str(spec), str(other)], tmp_path)
    assert rc == 1 and "Traceback" not in err, err


# ---------------------------------------------------------------- steps that are not legs


def test_a_failed_wipe_or_collector_fails_the_verdict(engine, tmp_path: Path) -> None:
    # Nothing reads either step, and the leg passes: only the failed wipe and collector can fail the run.
    spec = write_spec(tmp_path / "s.yaml", cut_short_spec("ran"))
    spec.write_text(
        spec.read_text().replace(
            "steps:\n",
            """steps:
  - name: wipe
    remove: ["${work_dir}"]
  - name: state
    collect: {collector: json_file, args: {path: "${work_dir}/absent.json"}}
""",
            1,
        )
    )
    r = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.FAILED)
    assert r.out.splitlines()[-1].startswith('VERDICT cut_short FAIL ["step:wipe", "step:state"]')
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    doc["steps"]["wipe"]["status"] = doc["steps"]["state"]["status"] = "ok"
    (tmp_path / "r" / "evidence.json").write_text(json.dumps(doc))
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.FAILED)
    assert 'FAIL ["step:wipe", "step:state"]' in r.out


# ---------------------------------------------------------------- the budget at run time


def test_a_set_that_breaks_the_budget_is_refused_like_validate(engine, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "s.yaml", cut_short_spec("ran"))
    r = engine("run", str(spec), "--run-dir", "r", "--set", "t_leg=200", cwd=tmp_path, expect=Exit.USAGE)
    assert r.out == ""
    assert not (tmp_path / "r").exists()
    same = tmp_path / "same.yaml"
    same.write_text(spec.read_text().replace("t_leg: 30", "t_leg: 200"))
    v = engine("validate", str(same), cwd=tmp_path)
    message = v.out.splitlines()[1]  # after "INVALID same.yaml: 1 problem"
    assert message.split(": ", 1)[1] == r.err.strip().split(": ", 1)[1]
    assert "mode 'default': worst case 205 s exceeds budget_s 100 s (biggest: leg1 205 s)" in r.err
    engine("run", str(spec), "--run-dir", "r", "--set", "t_leg=90", cwd=tmp_path, expect=Exit.PASS)


# ---------------------------------------------------------------- many Ctrl-Cs


@pytest.mark.parametrize("gap_s", [0.0, 0.01, 0.05])
def test_a_storm_of_ctrl_c_still_writes_the_evidence_and_exits_130(tmp_path: Path, gap_s: float) -> None:
    # The leg ignores SIGTERM with a 60 s grace: only the second Ctrl-C's SIGKILL ends it quickly.
    pidfile = tmp_path / "leg.pid"
    spec = write_spec(
        tmp_path / "s.yaml", cut_short_spec("@ignore_term", f"@pidfile:{pidfile}", "started", "@forever", grace=60)
    )
    proc = engine_started("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    file_says(tmp_path / "r" / "logs" / "leg1.log", "started")
    started = time.monotonic()
    for _ in range(30):
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGINT)
        time.sleep(gap_s)
    # The kernel keeps one pending SIGINT per process: a storm sent while the engine is not scheduled
    # (a loaded machine) arrives as ONE Ctrl-C, which waits out the leg's grace. Press again, as a person would.
    deadline = time.monotonic() + 20
    while proc.poll() is None and time.monotonic() < deadline:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.25)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == Exit.INTERRUPTED, out + err
    assert time.monotonic() - started < 30  # not the 60 s grace
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert out.strip().splitlines()[-1].startswith("VERDICT cut_short INTERRUPTED")
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert doc["verdict"]["outcome"] == "INTERRUPTED" and doc["interrupted"] is True
    assert doc["steps"]["leg1"]["status"] == "interrupted" and doc["steps"]["leg1"]["rc"] == -9
    assert gone(int(pidfile.read_text()))


def test_stop_signals_raise_once_hold_an_early_one_and_restore_the_handlers() -> None:
    before = signal.getsignal(signal.SIGINT)
    killed: list[int] = []
    with StopSignals(kill=lambda: killed.append(1) or []) as stops:
        os.kill(os.getpid(), signal.SIGINT)  # before the run is armed: held
        time.sleep(0.01)
        with pytest.raises(KeyboardInterrupt):
            stops.arm()
        for _ in range(3):  # the ones after the first never raise
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
        assert stops.count == 4 and not stops.armed
        assert killed == [1]  # the second one kills the running leg, the later ones do nothing
    assert signal.getsignal(signal.SIGINT) is before
