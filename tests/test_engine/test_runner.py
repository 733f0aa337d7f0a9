"""engine/run/runner.py + engine/run/evidence.py: whole plans over real legs, evidence on disk."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from legs.plan_stub import PlanStub, run_step
from processes import pid_in

from engine.run import evidence
from engine.run.remove import check_removable
from engine.run.runner import execute

STUB = str(Path(__file__).parents[1] / "legs" / "plan_stub.py")
ROOT = Path(__file__).resolve().parents[2]
TEE = r"^\[(?:default|rank|worker)\d*\]:\s*"


def run_plan(tmp_path: Path, steps: list[dict], **plan: object) -> tuple[dict, str]:
    out = io.StringIO()
    doc = execute(PlanStub(steps=steps, **plan), tmp_path / "run", out, is_tty=False)
    return doc, out.getvalue()


def test_steps_run_in_order_and_evidence_is_written(tmp_path: Path) -> None:
    leg1 = run_step(
        "leg1",
        "[default0]: step 1/2",
        '[default0]: RUN_JSON {"final_step": 2}',
        output={
            "strip_prefix": TEE,
            "echo_prefixes": ["RUN_JSON "],
            "harvest": {"run_json": {"marker": "RUN_JSON ", "pick": "last"}},
        },
    )
    skipped = dict(run_step("later", "x"), enabled=False, when="target == 'real'")
    doc, printed = run_plan(tmp_path, [leg1, skipped])
    stored = evidence.load(tmp_path / "run")
    assert stored == doc
    assert doc["evidence_version"] == 1 and doc["mode"] == "smoke"
    step = doc["steps"]["leg1"]
    assert step["status"] == "ok" and step["rc"] == 0 and step["kind"] == "run"
    assert step["harvest"] == {"run_json": {"final_step": 2}} and step["harvest_errors"] == []
    assert step["log"] == "logs/leg1.log" and step["lines"] == 2
    assert (tmp_path / "run" / "logs" / "leg1.log").read_text().startswith("[default0]: step 1/2")
    assert doc["steps"]["later"]["status"] == "skipped"
    assert "=== leg1" in printed and '  KEY> RUN_JSON {"final_step": 2}' in printed
    assert any(line.startswith("leg1_RC 0 seconds ") and " elapsed " in line for line in printed.splitlines())
    assert doc["finished_at"] and doc["seconds"] >= 0
    # The runner stores evidence and knows nothing of checks: `engine run` judges what it stored.
    assert "checks" not in stored and "verdict" not in stored


def test_failed_leg_shows_failure_lines_from_the_whole_capture_then_the_tail(tmp_path: Path) -> None:
    leg = run_step(
        "leg1",
        "Traceback (most recent call last):",
        "RuntimeError: rank 1 died",
        "@repeat:200:summary {i}",
        "@rc:1",
        output={"failure_patterns": ["Traceback", "Error"], "tail_lines": 5},
    )
    doc, printed = run_plan(tmp_path, [leg, run_step("leg2", "still runs")])
    step = doc["steps"]["leg1"]
    assert step["status"] == "failed" and step["rc"] == 1
    assert step["failure_lines"] == ["Traceback (most recent call last):", "RuntimeError: rank 1 died"]
    assert step["tail"] == [f"summary {i}" for i in range(195, 200)]
    assert "   FAILURE LINES (2 of 202):" in printed
    assert printed.index("RuntimeError: rank 1 died") < printed.index("   TAIL:")
    assert doc["steps"]["leg2"]["status"] == "ok"  # no stop_on_failure: later legs still run


def test_ok_exit_codes_and_timeout(tmp_path: Path) -> None:
    doc, printed = run_plan(
        tmp_path,
        [run_step("rc3", "@rc:3", ok_exit_codes=[0, 3]), run_step("slow", "@forever", timeout_s=0.5, grace_s=0.5)],
    )
    assert doc["steps"]["rc3"]["status"] == "ok"
    slow = doc["steps"]["slow"]
    assert slow["status"] == "failed" and slow["timed_out"] and slow["terminated_by"] == "timeout"
    assert "TIMEOUT after 0.5 s" in printed
    assert "timeout after 0.5 s: SIGTERM to the process group" in printed


def test_signal_rule_kills_the_leg_and_is_recorded(tmp_path: Path) -> None:
    leg = run_step(
        "leg1",
        "step 9",
        "[default0]: CKPT push step=10 -> ckpt",
        "@forever",
        timeout_s=30,
        output={"strip_prefix": TEE},
        signals=[{"match": "^CKPT push step=10 ", "signal": "SIGKILL", "after_s": 0}],
    )
    doc, _ = run_plan(tmp_path, [leg])
    step = doc["steps"]["leg1"]
    assert step["terminated_by"] == "signal_rule" and step["rc"] == -9
    assert step["signals_sent"][0]["signal"] == "SIGKILL" and step["signals_sent"][0]["line"] == 2


def test_diagnostics_on_failure_list_and_tail_everything(tmp_path: Path) -> None:
    tlog = tmp_path / "tlogs"
    (tlog / "attempt_0" / "1").mkdir(parents=True)
    (tlog / "attempt_0" / "1" / "stderr.log").write_text(
        "".join(f"line {i}\n" for i in range(100)) + "odd failure shape nobody greps for\n"
    )
    diag = {"dir": str(tlog), "tail_lines": 3, "max_files": 8, "list_max": 40}
    doc, printed = run_plan(
        tmp_path,
        [
            run_step("leg1", "@rc:2", on_failure={"diagnostics": diag}),
            run_step("leg2", "@rc:2", on_failure={"diagnostics": dict(diag, dir=str(tmp_path / "no"))}),
            run_step("leg3", "fine", on_failure={"diagnostics": diag}),
        ],
    )
    report = doc["steps"]["leg1"]["diagnostics"]
    assert report["listing"] == ["attempt_0/", "attempt_0/1/", "attempt_0/1/stderr.log"]
    assert report["files"][0]["tail"] == ["line 98", "line 99", "odd failure shape nobody greps for"]
    assert "odd failure shape nobody greps for" in printed
    missing = doc["steps"]["leg2"]["diagnostics"]
    assert missing["exists"] is False and "does not exist" in missing["message"]
    assert "does not exist" in printed
    assert doc["steps"]["leg3"]["diagnostics"] is None


def test_failed_precondition_stops_every_later_step(tmp_path: Path) -> None:
    doc, printed = run_plan(
        tmp_path,
        [
            run_step("fetch", "@rc:1", precondition="could not fetch the published mix"),
            run_step("leg1", "x"),
            {"name": "wipe", "enabled": True, "remove": str(tmp_path / "w")},
        ],
    )
    assert doc["precondition_failed"] == {"step": "fetch", "message": "could not fetch the published mix"}
    assert doc["steps"]["leg1"]["status"] == "not_run"
    assert doc["steps"]["wipe"] == {"kind": "remove", "status": "not_run"}
    assert "could not fetch the published mix" in printed
    assert "=== leg1" not in printed


def test_stop_on_failure_stops_later_steps(tmp_path: Path) -> None:
    doc, _ = run_plan(tmp_path, [run_step("a", "@rc:1", stop_on_failure=True), run_step("b")])
    assert doc["steps"]["b"]["status"] == "not_run"
    assert "precondition_failed" not in doc


def test_remove_deletes_and_refuses_dangerous_paths(tmp_path: Path, monkeypatch) -> None:
    work = tmp_path / "work"
    (tmp_path / "run" / "sub").mkdir(parents=True)
    (tmp_path / "run" / "sub" / "f").write_text("x")
    (work / "sub").mkdir(parents=True)
    monkeypatch.chdir(work)
    doc, printed = run_plan(
        tmp_path,
        [
            {
                "name": "wipe",
                "enabled": True,
                "remove": [str(tmp_path / "run" / "sub"), str(tmp_path / "run" / "absent")],
            },
            {"name": "wipe_cwd", "enabled": True, "remove": str(work)},
            {"name": "wipe_run", "enabled": True, "remove": str(tmp_path / "run")},
            {"name": "wipe_in_cwd", "enabled": True, "remove": "sub"},
        ],
    )
    assert not (tmp_path / "run" / "sub").exists()
    assert doc["steps"]["wipe"]["status"] == "ok"
    assert "outside the run directory" in doc["steps"]["wipe_in_cwd"]["error"] and (work / "sub").exists()
    assert doc["steps"]["wipe"]["absent"] == [str(tmp_path / "run" / "absent")]
    assert doc["steps"]["wipe_cwd"]["status"] == "failed"
    assert "working directory" in doc["steps"]["wipe_cwd"]["error"]
    assert "run directory" in doc["steps"]["wipe_run"]["error"]
    assert work.exists() and (tmp_path / "run" / "evidence.json").exists()
    for path in ("/", "~", ""):
        with pytest.raises(ValueError, match="refusing"):
            check_removable(path, tmp_path / "run")


def test_collect_puts_state_in_the_document_and_errors_in_the_step(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"checkpoints": [10]}')
    doc, _ = run_plan(
        tmp_path,
        [
            {
                "name": "hub1",
                "enabled": True,
                "collect": {"collector": "json_file", "args": {"path": str(tmp_path / "s.json")}},
            },
            {
                "name": "hub2",
                "enabled": True,
                "collect": {"collector": "json_file", "args": {"path": str(tmp_path / "none.json")}},
            },
        ],
    )
    assert doc["state"] == {"hub1": {"checkpoints": [10]}}
    assert doc["steps"]["hub1"]["status"] == "ok" and doc["steps"]["hub1"]["collector"] == "json_file"
    assert doc["steps"]["hub2"]["status"] == "failed"
    assert "none.json: no such file" in doc["steps"]["hub2"]["error"]


def test_progress_lines_are_printed_on_a_non_tty(tmp_path: Path) -> None:
    leg = run_step(
        "leg1",
        "step 1/20",
        "@sleep:0.4",
        "step 5/20",
        "@sleep:0.4",
        progress={"match": r"^step (?P<step>\d+)/(?P<total>\d+)", "every_s": 0.3},
    )
    doc, printed = run_plan(tmp_path, [leg])
    progress = [line for line in printed.splitlines() if line.startswith("  progress leg1: ")]
    assert len(progress) >= 2
    assert progress[-1].startswith("  progress leg1: step 5/20 (25%) ")
    assert doc["steps"]["leg1"]["progress"]["step"] == 5


def test_no_secret_reaches_evidence_logs_or_output(tmp_path: Path, monkeypatch) -> None:
    secret = "hf_FAKE_SECRET_123"
    monkeypatch.setenv("HF_TOKEN", secret)
    leg = run_step(
        "leg1",
        "@env:HF_TOKEN",
        f'RUN_JSON {{"token": "{secret}"}}',
        f"Traceback {secret}",
        "@rc:1",
        output={"echo_prefixes": ["HF_TOKEN", "RUN_JSON "], "harvest": {"rj": {"marker": "RUN_JSON "}}},
    )
    doc, printed = run_plan(
        tmp_path, [leg], values={"hub_token": "tok_VALUE_456", "steps": 2}, secret_names=["hub_token"]
    )
    run_dir = tmp_path / "run"
    stored = (run_dir / "evidence.json").read_text()
    log = (run_dir / "logs" / "leg1.log").read_text()
    for text in (stored, log, printed):
        assert secret not in text and "tok_VALUE_456" not in text
    assert "HF_TOKEN=<redacted>" in log and "HF_TOKEN=<redacted>" in printed
    assert doc["values"] == {"hub_token": "<redacted>", "steps": 2}
    assert doc["steps"]["leg1"]["harvest"]["rj"] == {"token": "<redacted>"}


def stub_started(steps: Path, run_dir: Path) -> subprocess.Popen[str]:
    """tests/legs/plan_stub.py running `steps` into `run_dir`, a program of its own to signal."""
    command = [sys.executable, STUB, str(steps), str(run_dir)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)


def test_ctrl_c_kills_the_leg_group_and_evidence_says_interrupted(tmp_path: Path) -> None:
    pidfile, child = tmp_path / "pid", tmp_path / "child"
    steps = [
        run_step("leg1", f"@pidfile:{pidfile}", f"@spawn:{child}", "@forever", timeout_s=60, grace_s=5),
        run_step("leg2", "never"),
    ]
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    run_dir = tmp_path / "run"
    engine = stub_started(tmp_path / "steps.json", run_dir)
    pid_in(child)
    engine.send_signal(signal.SIGINT)
    output, _ = engine.communicate(timeout=30)
    assert engine.returncode == 130, output
    with pytest.raises(ProcessLookupError):
        os.killpg(int(pidfile.read_text()), 0)
    doc = evidence.load(run_dir)
    assert doc["interrupted"] is True
    assert doc["steps"]["leg1"]["status"] == "interrupted"
    assert doc["steps"]["leg1"]["terminated_by"] == "interrupt"
    assert doc["steps"]["leg2"]["status"] == "not_run"


def test_evidence_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(evidence.EvidenceError, match="evidence.json: no evidence document"):
        evidence.load(tmp_path)
    (tmp_path / "evidence.json").write_text('{"evidence_version": 1,\n "x": }')
    with pytest.raises(evidence.EvidenceError, match=r"evidence\.json:2:7: not valid JSON"):
        evidence.load(tmp_path)
    (tmp_path / "evidence.json").write_text('{"evidence_version": 99}')
    with pytest.raises(evidence.EvidenceError, match="newer engine"):
        evidence.load(tmp_path)


def test_evidence_write_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    evidence.write(tmp_path, {"evidence_version": 1, "steps": {}})
    evidence.write(tmp_path, {"evidence_version": 1, "steps": {"a": {}}})
    assert [p.name for p in tmp_path.iterdir()] == ["evidence.json"]
    assert evidence.load(tmp_path)["steps"] == {"a": {}}


def test_sigterm_to_the_engine_cleans_up_like_ctrl_c(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    steps = [run_step("leg1", f"@pidfile:{pidfile}", "@forever", timeout_s=60, grace_s=5)]
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    engine = stub_started(tmp_path / "steps.json", tmp_path / "run")
    pid_in(pidfile)
    engine.terminate()
    output, _ = engine.communicate(timeout=30)
    assert engine.returncode == 130, output
    with pytest.raises(ProcessLookupError):
        os.killpg(int(pidfile.read_text()), 0)
    assert evidence.load(tmp_path / "run")["steps"]["leg1"]["status"] == "interrupted"


def test_remove_unlinks_a_symlink_to_the_working_directory_without_following_it(tmp_path: Path, monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep").write_text("x")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "link").symlink_to(work)
    monkeypatch.chdir(work)
    doc, _ = run_plan(tmp_path, [{"name": "wipe", "enabled": True, "remove": [str(tmp_path / "run" / "link")]}])
    assert doc["steps"]["wipe"]["status"] == "ok"
    assert not os.path.lexists(tmp_path / "run" / "link") and (work / "keep").exists()


def test_bad_output_rule_fails_the_step_naming_file_and_line(tmp_path: Path) -> None:
    leg = dict(run_step("leg1", "x", output={"strip_prefix": "(["}), line=17)
    doc, printed = run_plan(tmp_path, [leg, run_step("leg2", "y")])
    assert doc["steps"]["leg1"]["status"] == "failed"
    assert doc["steps"]["leg1"]["error"].startswith("specs/test.yaml:17: step leg1: output.strip_prefix")
    assert doc["steps"]["leg2"]["status"] == "ok"
