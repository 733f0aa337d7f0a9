"""engine/cli.py end to end: `engine` commands on small specs whose legs are `python -c` (in this process;
as a program where the subject is a signal, or what a fresh interpreter imports)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

from engine_helpers import engine_started, write_spec
from processes import file_says

from engine.cli import main
from engine.judge.recheck import changed_keys
from engine.judge.verdict import Exit

# The leg prints RUN_JSON behind torchrun's `--tee` prefix, as a rank's line reaches the engine.
SPEC = """\
version: 1
name: demo
description: a tiny probe
budget_s: 100
env:
  DEMO_WANT: want
values:
  want: 10
  api_token: "s3cr3t-value"
modes:
  default: quick
  quick: {{}}
steps:
  - name: leg1
    run:
      argv: ["${{python}}", "-c", "{code}"]
      timeout_s: 20
      output:
{output}        harvest:
          run_json: {{marker: "RUN_JSON ", pick: last}}
checks:
{checks}"""

TEE_CODE = "print('[default0]: RUN_JSON {\\\"final_step\\\": 10}')"
STRIP = "        strip_prefix: '^\\[(?:default|rank|worker)\\d*\\]:\\s*'\n"
CHECK_STEP = """\
  - name: leg1_final_step
    why: the leg reports the step it stopped at
    expr: "steps.leg1.harvest.run_json.final_step == values.want"
"""
CHECK_RC = """\
  - name: leg1_exit_code
    why: the leg exits cleanly
    expr: "steps.leg1.rc == `0`"
"""


def demo_spec(code: str = TEE_CODE, output: str = "", checks: str = CHECK_STEP) -> str:
    return SPEC.format(code=code, output=output, checks=checks)


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_run_pass_writes_evidence_junit_markdown(engine, tmp_path):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(output=STRIP, checks=CHECK_STEP + CHECK_RC))
    r = engine(
        "run", str(spec), *"--run-dir r1 --junit out/j.xml --markdown out/s.md".split(), cwd=tmp_path, expect=Exit.PASS
    )
    assert last_line(r.out).startswith("VERDICT demo PASS [] seconds ")
    assert f"run dir: {tmp_path / 'r1'}" in r.out
    assert "\n8 values (mode quick); none overridden\n" in r.out
    assert "s3cr3t-value" not in r.out
    doc = json.loads((tmp_path / "r1" / "evidence.json").read_text())
    assert [c["outcome"] for c in doc["checks"]] == ["PASS", "PASS"]
    assert doc["verdict"]["outcome"] == "PASS" and doc["verdict"]["exit_code"] == 0
    assert "s3cr3t-value" not in (tmp_path / "r1" / "evidence.json").read_text()
    suite = ET.parse(tmp_path / "out" / "j.xml").getroot()
    assert (suite.get("tests"), suite.get("failures")) == ("3", "0")
    assert "**PASS**" in (tmp_path / "out" / "s.md").read_text().splitlines()[0]


def test_default_run_dir_is_named_after_spec_and_mode(engine, tmp_path):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(output=STRIP))
    engine("run", str(spec), cwd=tmp_path, expect=Exit.PASS)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("demo-quick-") and run_dir.name.endswith("Z")
    assert (run_dir / "evidence.json").is_file()


def test_env_override_and_set(engine, tmp_path):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(output=STRIP))
    r = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, env={"DEMO_WANT": "11"}, expect=Exit.FAILED)
    assert last_line(r.out).startswith('VERDICT demo FAIL ["leg1_final_step"]')
    assert "\n8 values (mode quick); overridden: want=11 (env DEMO_WANT)\n" in r.out
    r = engine(
        "run", str(spec), "--run-dir", "r2", "--set", "want=10", cwd=tmp_path, env={"DEMO_WANT": "11"}, expect=Exit.PASS
    )
    assert "\n8 values (mode quick); overridden: want=10 (--set)\n" in r.out


def test_run_says_the_values_in_one_line_and_lists_them_with_v(engine, tmp_path):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(output=STRIP))
    sets = ["--set", "api_token=t0k3n-from-set", "--set", "want=10"]
    r = engine("run", str(spec), "--run-dir", "r", *sets, cwd=tmp_path, expect=Exit.PASS)
    head = r.out.split("=== leg1")[0].splitlines()
    assert head[2:] == ['8 values (mode quick); overridden: want=10 (--set), api_token="<redacted>" (--set)']
    r = engine("run", str(spec), "--run-dir", "r2", *sets, "-v", cwd=tmp_path)
    head = r.out.split("=== leg1")[0].splitlines()
    assert head[2] == "values:" and len(head) == 3 + 8
    assert "  want      = 10  [--set]" in head and '  api_token = "<redacted>"  [--set]' in head
    assert "t0k3n-from-set" not in r.out + r.err


def test_failed_leg_fails_the_verdict(engine, tmp_path):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(code="import sys; sys.exit(4)", checks=CHECK_RC))
    r = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.FAILED)
    assert last_line(r.out).startswith('VERDICT demo FAIL ["step:leg1", "leg1_exit_code"]')


def test_precondition_exit_3(engine, tmp_path):
    text = write_spec(tmp_path / "demo.yaml", demo_spec(code="import sys; sys.exit(1)")).read_text()
    text = text.replace(
        "      timeout_s: 20\n", "      timeout_s: 20\n      precondition: could not fetch the published mix\n"
    )
    (tmp_path / "demo.yaml").write_text(text)
    r = engine("run", "demo.yaml", "--run-dir", "r", cwd=tmp_path, expect=Exit.PRECONDITION)
    assert last_line(r.out).startswith(
        'VERDICT demo PRECONDITION could not fetch the published mix ["step:leg1"] seconds '
    )


def test_invalid_spec_exit_2_names_file_and_line(engine, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(write_spec(tmp_path / "x.yaml", demo_spec()).read_text().replace("    why:", "    whyy:"))
    r = engine("validate", str(bad), str(tmp_path / "x.yaml"), cwd=tmp_path, expect=Exit.USAGE)
    assert "bad.yaml:" in r.out and f"OK {tmp_path / 'x.yaml'}" in r.out
    r = engine("run", str(bad), cwd=tmp_path, expect=Exit.USAGE)
    assert "bad.yaml:" in r.err
    assert not (tmp_path / "runs").exists()


def test_usage_errors_exit_2(engine, tmp_path):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec())
    engine("run", str(spec), "--mode", "nope", cwd=tmp_path, expect=Exit.USAGE)
    r = engine("plan", str(spec), "--set", "nothing=1", cwd=tmp_path, expect=Exit.USAGE)
    assert "nothing" in r.err
    assert main(["frobnicate"]) == Exit.USAGE
    assert main(["check", str(spec), "--evidence", str(tmp_path / "none")]) == Exit.USAGE


def test_markdown_dash_prints_markdown_instead_of_the_table(engine, tmp_path):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(output=STRIP))
    r = engine("run", str(spec), "--run-dir", "r", "--markdown", "-", cwd=tmp_path, expect=Exit.PASS)
    assert "### ✅ `demo` (quick): **PASS**" in r.out and "VERDICT demo" not in r.out
    assert not (tmp_path / "-").exists()
    r = engine("check", str(spec), "--evidence", "r", "--markdown", "-", cwd=tmp_path, expect=Exit.PASS)
    assert r.out.startswith("### ✅ `demo` (quick): **PASS**") and "| `leg1_final_step` |" in r.out
    r = engine("check", str(spec), "--evidence", "r", "--markdown", "md/check.md", cwd=tmp_path)
    assert last_line(r.out).startswith("VERDICT demo PASS")
    assert (tmp_path / "md" / "check.md").read_text().startswith("### ✅ `demo` (quick): **PASS**")


def test_evidence_of_a_killed_engine_still_says_what_changed_in_a_step(engine, tmp_path):
    # The leg copies evidence.json while it runs: what a SIGKILLed engine would leave behind.
    code = "import shutil; shutil.copy('r/evidence.json', 'mid-run.json'); " + TEE_CODE
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(code=code, output=STRIP))
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.PASS)
    killed = tmp_path / "killed"
    killed.mkdir()
    (tmp_path / "mid-run.json").rename(killed / "evidence.json")
    assert "verdict" not in json.loads((killed / "evidence.json").read_text())
    write_spec(spec, demo_spec(code=code.replace("10", "12"), output=STRIP))
    r = engine("check", str(spec), "--evidence", "killed", cwd=tmp_path, expect=Exit.USAGE)
    assert "step leg1: definition changed (run.argv: " in r.err and "fingerprint" not in r.err


def test_plan_schema_version_help(tmp_path, capsys):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec())
    assert main(["plan", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "leg1" in out and "s3cr3t-value" not in out
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out)["type"] == "object"
    assert main(["--version"]) == 0 and "engine 0.1.0" in capsys.readouterr().out
    assert main(["--help"]) == 0
    help_text = capsys.readouterr().out
    assert "130 interrupted" in help_text and "3 precondition" in help_text


def test_check_accepts_a_changed_check_and_leaves_evidence_alone(engine, tmp_path):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(output=STRIP))
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.PASS)
    saved = (tmp_path / "r" / "evidence.json").read_text()
    write_spec(spec, demo_spec(output=STRIP, checks=CHECK_STEP.replace("== values.want", "== `11`")))
    r = engine("check", str(spec), "--evidence", "r", "--junit", "j.xml", cwd=tmp_path, expect=Exit.FAILED)
    assert last_line(r.out).startswith('VERDICT demo FAIL ["leg1_final_step"]')
    assert "steps.leg1.harvest.run_json.final_step = 10" in r.out
    assert (tmp_path / "r" / "evidence.json").read_text() == saved
    (record,) = (tmp_path / "r").glob("check-*.json")
    assert json.loads(record.read_text())["verdict"]["outcome"] == "FAIL"
    assert ET.parse(tmp_path / "j.xml").getroot().get("failures") == "1"


def test_check_reapplies_env_and_set_values(engine, tmp_path):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(output=STRIP))
    engine("run", str(spec), "--run-dir", "r", "--set", "want=11", cwd=tmp_path, expect=Exit.FAILED)
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.FAILED)  # want=11: the run's --set
    assert "values.want = 11" in r.out


def test_check_refuses_changed_steps(engine, tmp_path):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(output=STRIP))
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.PASS)
    write_spec(spec, demo_spec(code=TEE_CODE.replace("10", "12"), output=STRIP))
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.USAGE)
    assert "step leg1: definition changed (run.argv:" in r.err
    write_spec(spec, demo_spec(output=STRIP))
    spec.write_text(
        spec.read_text().replace(
            "checks:\n",
            """\
  - name: leg2
    run: {argv: ["true"], timeout_s: 5}
checks:
""",
        )
    )
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.USAGE)
    assert "step leg2: added to the spec since the run" in r.err


def test_replay_fixes_the_tee_prefix_without_rerunning_the_leg(engine, tmp_path):
    # Without strip_prefix, "[default0]: RUN_JSON {...}" harvests nothing and the checks fail.
    marker = tmp_path / "leg-ran"
    code = f"open('{marker}', 'a').write('x'); " + TEE_CODE
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(code=code))
    r = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.FAILED)
    assert "no data: steps.leg1.harvest.run_json.final_step is missing" in r.out
    write_spec(spec, demo_spec(code=code, output=STRIP))
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path)
    assert r.code == Exit.USAGE  # check does not re-harvest: it refuses the run's stale harvest
    assert "step leg1: output rules changed (output.strip_prefix: null -> " in r.err
    r = engine("replay", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.PASS)
    assert last_line(r.out).startswith("VERDICT demo PASS []")
    assert marker.read_text() == "x"  # the leg ran once, at `run`
    (record,) = (tmp_path / "r").glob("replay-*.json")
    assert json.loads(record.read_text())["steps"]["leg1"]["harvest"]["run_json"] == {"final_step": 10}


def test_ctrl_c_writes_evidence_and_exits_130(tmp_path):
    code = "import time; print('started', flush=True); time.sleep(30)"
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(code=code, checks=CHECK_RC))
    proc = engine_started("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    file_says(tmp_path / "r" / "logs" / "leg1.log", "started")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == Exit.INTERRUPTED, out + err
    assert last_line(out).startswith("VERDICT demo INTERRUPTED")
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert doc["steps"]["leg1"]["status"] == "interrupted"
    assert doc["verdict"]["exit_code"] == Exit.INTERRUPTED


def test_check_never_imports_torch_or_the_trainer(engine, tmp_path):
    # `engine check` re-judges a saved run in a fraction of a second on a laptop (bench/engine_bench.py
    # measures it); what would break that is a heavy import, which this names.
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(output=STRIP))
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.PASS)
    leaked = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import sys; from engine.cli import main; main(['check', sys.argv[1], '--evidence', 'r']);"
                "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'huggingface_hub', 'trainer')))"
            ),
            str(spec),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert leaked.stdout.strip().splitlines()[-1] == "[]"


def test_changed_keys():
    assert changed_keys(
        {"run": {"argv": ["a"], "timeout_s": 1}, "kind": "run"},
        {"run": {"argv": ["b"], "timeout_s": 1}, "kind": "run", "when": "x"},
    ) == ["run.argv", "when"]


def test_check_accepts_a_step_that_differs_only_in_a_secret(engine, tmp_path):
    code = "import sys; print(len(sys.argv))"
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(code=code, checks=CHECK_RC))
    spec.write_text(spec.read_text().replace(f'"{code}"]', f'"{code}", "${{api_token}}"]'))
    r = engine("run", str(spec), "--run-dir", "r", "--set", "api_token=tok-from-cli", cwd=tmp_path, expect=Exit.PASS)
    assert "tok-from-cli" not in (tmp_path / "r" / "evidence.json").read_text()
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.PASS)
    assert "differs only in a secret value" in r.err


def test_diff_is_dispatched_to_engine_diff(tmp_path, capsys):
    old = write_spec(tmp_path / "old.yaml", demo_spec())
    new = write_spec(tmp_path / "new.yaml", demo_spec(code="print('other')"))
    assert main(["diff", str(old), str(old)]) == 0
    assert main(["diff", str(old), str(new)]) == 1
    assert "leg1" in capsys.readouterr().out


def test_check_with_an_invalid_check_expression_exits_2(engine, tmp_path):
    spec = write_spec(tmp_path / "demo.yaml", demo_spec(output=STRIP))
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.PASS)
    write_spec(spec, demo_spec(output=STRIP, checks=CHECK_STEP.replace("== values.want", "== == values.want")))
    r = engine("check", str(spec), "--evidence", "r", cwd=tmp_path, expect=Exit.USAGE)
    assert "demo.yaml:" in r.err
