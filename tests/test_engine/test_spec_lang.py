"""The spec language's guards against silent weakening: duplicate names, explicit inheritance
(`override`, `disable`, `like`), named sub-expressions (`let`), checks that can never be true, and
`${x}` in checks. Real `engine` commands (in process) on small specs whose leg is `python -c`."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from engine.cli import main
from engine.expr.functions import RETURNS, known_functions
from engine.judge.verdict import Exit
from engine.show import report
from engine.spec.load import load_spec
from engine.spec.located import SpecErrors
from engine.spec.plan import build_plan
from engine.spec.validate import findings

# A parent with one leg that prints RUN_JSON, and three checks over it.
PARENT = """\
version: 1
name: parent
description: one leg that reports like the trainer
budget_s: 100
values:
  stop: 10
  leg_code: "import json; print('RUN_JSON ' + json.dumps({'final_step': 10, 'loss': 2.5, 'losses': {'1': 6.0, '10': 2.5}}))"
steps:
  - name: leg1
    run:
      argv: ["${python}", "-c", "${leg_code}"]
      timeout_s: 30
      grace_s: 5
      output:
        echo_prefixes: ["RUN_JSON "]
        failure_patterns: ["Traceback"]
        harvest:
          run_json: {marker: "RUN_JSON ", pick: last}
checks:
  - name: stopped_at_stop
    why: the leg stops where it was told
    expr: "steps.leg1.harvest.run_json.final_step == values.stop"
  - name: loss_is_low
    why: the leg learned something
    expr: "steps.leg1.harvest.run_json.loss < `3`"
  - name: leg_exit_clean
    why: the leg exits 0
    expr: "steps.leg1.rc == `0`"
"""


def line_of(text: str, needle: str) -> int:
    return text.splitlines().index(needle) + 1


LOSS_LINE = line_of(PARENT, "  - name: loss_is_low")
LEG1_LINE = line_of(PARENT, "  - name: leg1")


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def child(tmp_path: Path, body: str) -> Path:
    write(tmp_path, "parent.yaml", PARENT)
    return write(tmp_path, "child.yaml", "version: 1\nname: child\nextends: parent.yaml\n" + body)


def load_errors(path: Path) -> list[str]:
    with pytest.raises(SpecErrors) as e:
        load_spec(path)
    return [str(x) for x in e.value.errors]


def validate_cli(path: Path, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["validate", str(path)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # files are named relative to the cwd in messages


# ------------------------------------------------------------------ 1. duplicate names


@pytest.mark.parametrize(
    "section, text",
    [
        (
            "check",
            'checks:\n  - {name: twice, why: w, expr: "`true` == `true`"}\n'
            '  - {name: other, why: w, expr: "`true` == `true`"}\n'
            '  - {name: twice, why: copy-pasted, expr: "`false` == `true`"}\n',
        ),
        ("step", "steps:\n  - {name: again, remove: /tmp/specprobe-a}\n  - {name: again, remove: /tmp/specprobe-b}\n"),
    ],
)
def test_a_name_repeated_in_one_file_is_refused_naming_both_places(section, text, tmp_path, capsys):
    """With `extends` a second copy must not replace the first silently: a copy-pasted check that was not
    renamed would remove a gate while `engine validate` said OK."""
    path = child(tmp_path, text)
    rc, out, _ = validate_cli(path, capsys)
    assert rc == Exit.USAGE
    first, second = (5, 7) if section == "check" else (5, 6)
    assert f"duplicate {section} name" in out
    assert f"child.yaml:{first} and child.yaml:{second}" in out, out


def test_a_name_repeated_in_a_file_without_parent_is_refused_too(tmp_path, capsys):
    path = write(
        tmp_path, "solo.yaml", PARENT + '  - name: loss_is_low\n    why: again\n    expr: "`true` == `true`"\n'
    )
    rc, out, _ = validate_cli(path, capsys)
    assert rc == Exit.USAGE
    again = len(PARENT.splitlines()) + 1
    assert f"duplicate check name 'loss_is_low': solo.yaml:{LOSS_LINE} and solo.yaml:{again}" in out, out


# ------------------------------------------------------------------ 2. override / disable / like


def test_replacing_an_inherited_check_without_override_names_the_parents_line(tmp_path, capsys):
    path = child(
        tmp_path,
        'checks:\n  - name: loss_is_low\n    why: looser\n    expr: "steps.leg1.harvest.run_json.loss < `9`"\n',
    )
    (msg,) = load_errors(path)
    assert msg.startswith(
        "child.yaml:5:5: $.checks[0]: check 'loss_is_low' replaces the one inherited from "
        f"parent.yaml:{LOSS_LINE}; write `override: true`"
    )
    rc, out, _ = validate_cli(path, capsys)
    assert rc == Exit.USAGE and f"parent.yaml:{LOSS_LINE}" in out


def test_replacing_an_inherited_step_without_override_names_the_parents_line(tmp_path):
    path = child(tmp_path, 'steps:\n  - name: leg1\n    run: {argv: ["true"]}\n')
    (msg,) = load_errors(path)
    assert f"step 'leg1' replaces the one inherited from parent.yaml:{LEG1_LINE}" in msg


def test_override_on_a_name_nothing_defines_is_an_error(tmp_path):
    """A stale marker (the parent renamed its check) would otherwise add a second, unrelated gate."""
    path = child(
        tmp_path, 'checks:\n  - name: loss_is_lower\n    override: true\n    why: w\n    expr: "`true` == `true`"\n'
    )
    (msg,) = load_errors(path)
    assert "check 'loss_is_lower' has `override: true` but inherits no check of that name" in msg


def test_a_check_override_replaces_it_whole(tmp_path):
    path = child(
        tmp_path,
        "checks:\n  - name: loss_is_low\n    override: true\n    why: looser here\n"
        '    expr: "steps.leg1.harvest.run_json.loss < `9`"\n',
    )
    spec = load_spec(path)
    (check,) = [c for c in spec.data["checks"] if c["name"] == "loss_is_low"]
    assert check == {"name": "loss_is_low", "why": "looser here", "expr": "steps.leg1.harvest.run_json.loss < `9`"}
    assert [c["name"] for c in spec.data["checks"]] == ["stopped_at_stop", "loss_is_low", "leg_exit_clean"]
    assert spec.locate(("checks", 1)) == ("child.yaml", 5, 5)


def test_a_step_override_merges_mappings_deeply_and_replaces_lists(tmp_path):
    """Change one leg's argv without copying its output rules; a list is replaced, not appended to."""
    path = child(
        tmp_path,
        "steps:\n  - name: leg1\n    override: true\n    run:\n"
        '      argv: ["${python}", "-c", "print(1)"]\n'
        '      output: {failure_patterns: ["Error"]}\n',
    )
    spec = load_spec(path)
    (step,) = spec.data["steps"]
    assert step["run"]["argv"] == ["${python}", "-c", "print(1)"]
    assert step["run"]["timeout_s"] == 30 and step["run"]["grace_s"] == 5  # kept
    assert step["run"]["output"]["harvest"] == {"run_json": {"marker": "RUN_JSON ", "pick": "last"}}  # kept
    assert step["run"]["output"]["echo_prefixes"] == ["RUN_JSON "]  # kept
    assert step["run"]["output"]["failure_patterns"] == ["Error"]  # replaced, not merged
    assert "override" not in step
    # Each field is located where it is written: the new argv in the child, the timeout in the parent.
    assert spec.locate(("steps", 0, "run", "argv"))[:2] == ("child.yaml", 8)
    assert spec.locate(("steps", 0, "run", "timeout_s"))[:2] == ("parent.yaml", 12)


def test_like_starts_a_step_from_an_earlier_one(tmp_path):
    path = child(tmp_path, "steps:\n  - name: leg2\n    like: leg1\n    run: {timeout_s: 12}\n")
    spec = load_spec(path)
    leg1, leg2 = spec.data["steps"]
    assert leg2["name"] == "leg2" and "like" not in leg2
    assert leg2["run"]["argv"] == leg1["run"]["argv"] and leg2["run"]["output"] == leg1["run"]["output"]
    assert leg2["run"]["timeout_s"] == 12 and leg1["run"]["timeout_s"] == 30
    assert spec.locate(("steps", 1)) == ("child.yaml", 5, 5)


def test_like_must_name_an_earlier_step(tmp_path):
    path = child(tmp_path, "steps:\n  - name: leg0\n    like: leg2\n  - name: leg2\n    like: leg1\n")
    (msg,) = load_errors(path)
    assert "$.steps[1].like: like names 'leg2', which is not an earlier step; earlier steps: leg1" in msg


DISABLE = (
    "disable:\n  loss_is_low: this variant trains on noise; its loss is not expected to drop\n"
    "checks:\n  - name: leg_reported\n    why: the leg reported\n"
    '    expr: "steps.leg1.harvest.run_json != `null`"\n'
)


def test_disable_needs_a_reason_and_an_inherited_check(tmp_path):
    path = child(tmp_path, "disable:\n  loss_is_low: ''\n")
    (msg,) = load_errors(path)
    assert "$.disable.loss_is_low" in msg and "needs its reason" in msg
    path = child(tmp_path, "disable:\n  loss_is_lo: typo\n")
    (msg,) = load_errors(path)
    assert (
        "disable names 'loss_is_lo', which is not an inherited check; inherited: leg_exit_clean, "
        "loss_is_low, stopped_at_stop" in msg
    )
    path = child(
        tmp_path,
        "disable:\n  loss_is_low: why\nchecks:\n  - name: loss_is_low\n    override: true\n"
        '    why: w\n    expr: "`true` == `true`"\n',
    )
    (msg,) = load_errors(path)
    assert "check 'loss_is_low' is both disabled here and written at child.yaml:7" in msg


def test_a_disabled_check_shows_in_every_report_and_never_fails_the_verdict(tmp_path, capsys):
    # The parent's leg reports loss 2.5; the child makes it fail the (disabled) check.
    path = child(
        tmp_path,
        DISABLE + "values:\n  leg_code: \"import json; print('RUN_JSON ' + "
        "json.dumps({'final_step': 10, 'loss': 7.5}))\"\n",
    )
    run_dir = tmp_path / "run"
    capsys.readouterr()
    rc = main(
        [
            "run",
            str(path),
            "--run-dir",
            str(run_dir),
            "--junit",
            str(tmp_path / "j.xml"),
            "--markdown",
            str(tmp_path / "s.md"),
        ]
    )
    out, _ = capsys.readouterr()
    assert rc == Exit.PASS, out
    reason = "this variant trains on noise; its loss is not expected to drop (disabled at child.yaml:5)"
    row = next(line for line in out.splitlines() if line.startswith("loss_is_low"))
    assert row.split()[1] == "DISABLED" and row.split(None, 2)[2] == reason[:77] + "..."  # the table cuts at 80
    assert "VERDICT child PASS [] " in out
    doc = json.loads((run_dir / "evidence.json").read_text())
    result = next(r for r in doc["checks"] if r["name"] == "loss_is_low")
    assert (result["outcome"], result["reason"]) == ("DISABLED", reason)
    assert doc["verdict"]["disabled"] == ["loss_is_low"] and doc["verdict"]["failed"] == []
    case = next(c for c in ET.parse(tmp_path / "j.xml").getroot() if c.get("name") == "loss_is_low")
    assert [(e.tag, e.get("message")) for e in case] == [("skipped", "DISABLED: " + reason)]
    md = (tmp_path / "s.md").read_text()
    assert f"| `loss_is_low` | 🚫 DISABLED | {reason} |" in md

    # `engine check` on the run sees it as the spec says now: enabled again, it fails on that run.
    capsys.readouterr()
    assert main(["check", str(path), "--evidence", str(run_dir)]) == Exit.PASS
    assert "DISABLED" in capsys.readouterr().out
    path.write_text(
        path.read_text().replace(
            "disable:\n  loss_is_low: this variant trains on noise; its loss is not expected to drop\n", ""
        )
    )
    assert main(["check", str(path), "--evidence", str(run_dir)]) == Exit.FAILED
    assert 'VERDICT child FAIL ["loss_is_low"]' in capsys.readouterr().out


def test_engine_diff_reports_a_newly_disabled_check(tmp_path, capsys):
    old = child(tmp_path, "")
    new = write(tmp_path, "child2.yaml", "version: 1\nname: child\nextends: parent.yaml\n" + DISABLE)
    capsys.readouterr()
    assert main(["diff", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "~ loss_is_low: now DISABLED: this variant trains on noise; its loss is not expected to drop" in out
    assert main(["diff", str(new), str(old)]) == 1
    assert "~ loss_is_low: enabled again (was DISABLED: this variant" in capsys.readouterr().out


# ------------------------------------------------------------------ 5. checks that can never be true


@pytest.mark.parametrize(
    "expr, why",
    [
        ("steps.leg1.harvest.run_json.final_step", None),  # bare reference: a warning, below
        ("add(steps.leg1.rc, `1`)", "add() returns a number"),
        ("length(steps.leg1.harvest.run_json.losses)", "length() returns a number"),
        ("to_string(steps.leg1.rc)", "to_string() returns a string"),
        ("`120`", "it is a literal (a number)"),
        ("'done'", "it is a literal (a string)"),
        ("steps.leg1.harvest.run_json.losses.*", "a projection yields a list"),
        ("steps.*.rc", "a projection yields a list"),
        ("[steps.leg1.rc, `0`]", "it yields a list or null"),
        ("values.stop", "it yields a number"),  # a value known to be a number in every mode
        ("steps.leg1.rc || `0`", None),  # the left operand may be anything: the data decides
    ],
)
def test_a_check_that_can_never_be_true_is_a_spec_error(expr, why, tmp_path, capsys):
    path = child(tmp_path, f'checks:\n  - name: odd\n    why: w\n    expr: "{expr}"\n')
    errors, warnings = findings(load_spec(path), {})
    mine = [str(e) for e in errors if "$.checks[3].expr" in str(e)]
    if why is None:
        assert mine == []
        return
    assert mine == [
        f"child.yaml:7:11: $.checks[3].expr: expr {expr!r} can never be true: {why}, and a "
        f"check passes only on exactly true; compare it (e.g. `... == ...`)"
    ], mine


@pytest.mark.parametrize(
    "expr",
    [
        "steps.leg1.rc == `0`",
        "!(steps.leg1.rc == `1`)",
        "steps.leg1.rc < `3`",
        "is_finite(steps.leg1.rc)",
        "steps.leg1.rc == `0` && steps.leg1.harvest.run_json.loss < `3`",
        "contains(keys(steps), 'leg1')",
        "`true`",
        "get(steps, 'leg1') == `null`",
    ],
)
def test_boolean_checks_validate_without_a_word(expr, tmp_path):
    path = child(tmp_path, f'checks:\n  - name: fine\n    why: w\n    expr: "{expr}"\n')
    assert findings(load_spec(path), {}) == ([], [])


def test_a_bare_field_reference_is_a_warning_not_an_error(tmp_path, capsys):
    path = child(
        tmp_path,
        "values:\n  armed: true\nchecks:\n  - name: bare\n    why: w\n"
        '    expr: "steps.leg1.harvest.run_json.final_step"\n'
        '  - name: flag\n    why: w\n    expr: "values.armed"\n',
    )
    rc, out, err = validate_cli(path, capsys)
    assert rc == Exit.PASS and out.startswith("OK ")
    assert err.splitlines() == [
        "warning: child.yaml:9:11: $.checks[3].expr: expr 'steps.leg1.harvest.run_json.final_step' is a bare "
        "field reference: it holds only when that field is exactly true; compare it (e.g. "
        "steps.leg1.harvest.run_json.final_step == `true`) to say so"
    ]  # values.armed is a boolean


def test_a_when_that_can_never_be_a_boolean_is_a_spec_error(tmp_path):
    path = child(
        tmp_path, 'checks:\n  - name: odd\n    why: w\n    expr: "`true` == `true`"\n    when: "length(steps)"\n'
    )
    (error,) = findings(load_spec(path), {})[0]
    assert (
        "when 'length(steps)' can never be true: length() returns a number, and a condition must be "
        "exactly true or false" in str(error)
    )


def test_every_function_declares_what_it_returns():
    """A function added without a return type would make the boolean rule blind to it."""
    assert sorted(RETURNS) == known_functions()


# ------------------------------------------------------------------ 6. let

TRAJECTORY = """\
checks:
  - name: trajectory
    why: the last loss continues the first
    let:
      first: "get(steps.leg1.harvest.run_json.losses, '1')"
      last: "steps.leg1.harvest.run_json.loss"
      drop: "sub(let.first, let.last)"
    expr: "let.drop > `3` && is_finite(let.last)"
"""


def test_let_values_are_read_by_name_and_shown_in_the_failure_tree(tmp_path, capsys):
    path = child(tmp_path, TRAJECTORY)
    run_dir = tmp_path / "run"
    capsys.readouterr()
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == Exit.PASS
    result = next(r for r in json.loads((run_dir / "evidence.json").read_text())["checks"] if r["name"] == "trajectory")
    assert result["outcome"] == "PASS"
    assert result["explain"][:3] == [["let.first", "6.0"], ["let.last", "2.5"], ["let.drop", "3.5"]]
    assert result["let"]["drop"] == "sub(let.first, let.last)"
    # A drop of 3.5 fails a gate of 4: the failure tree names each value.
    capsys.readouterr()
    path.write_text(path.read_text().replace("let.drop > `3`", "let.drop > `4`"))
    assert main(["check", str(path), "--evidence", str(run_dir)]) == Exit.FAILED
    out = capsys.readouterr().out
    block = out[out.index("\ntrajectory") :]
    assert "    let first = get(steps.leg1.harvest.run_json.losses, '1')" in block
    assert "      let.first = 6.0\n      let.last = 2.5\n      let.drop = 3.5\n" in block
    assert "      let.drop > `4` = false" in block


def test_absent_data_through_a_let_is_no_data_naming_the_real_path(tmp_path, capsys):
    path = child(tmp_path, TRAJECTORY.replace('run_json.loss"', 'run_json.final_loss"'))
    run_dir = tmp_path / "run"
    capsys.readouterr()
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == Exit.FAILED
    doc = json.loads((run_dir / "evidence.json").read_text())
    result = next(r for r in doc["checks"] if r["name"] == "trajectory")
    assert result["outcome"] == "NO_DATA"
    assert result["missing"] == ["steps.leg1.harvest.run_json.final_loss"]
    assert ["let.last", "<absent>"] in result["explain"]
    assert doc["verdict"]["failed"] == ["trajectory"]


@pytest.mark.parametrize(
    "lets, expr, message",
    [
        ({"a": "steps.leg1.rc"}, "let.b == `0`", "let.b: this check has no let named 'b'; its lets: a"),
        ({"a": "let.b", "b": "steps.leg1.rc"}, "let.a == `0`", "let.a reads let.b, which is written after it"),
        ({"a": "let.a"}, "let.a == `0`", "let.a reads let.a, which is itself"),
        ({"a": "steps.leg1.rc"}, "length(let) == `1`", "`let` alone is not a value"),
        ({"a": "steps.nope.rc"}, "let.a == `0`", "steps.nope.rc: no step named 'nope'; steps: leg1"),
        ({"a": "steps.leg1.rc =="}, "let.a == `0`", "invalid JMESPath 'steps.leg1.rc =='"),
    ],
)
def test_let_is_validated_like_expr(lets, expr, message, tmp_path):
    let_yaml = "".join(f'      {k}: "{v}"\n' for k, v in lets.items())
    path = child(tmp_path, f'checks:\n  - name: c\n    why: w\n    let:\n{let_yaml}    expr: "{expr}"\n')
    errors, _ = findings(load_spec(path), {})
    assert any(message in str(e) and str(e).startswith("child.yaml:") for e in errors), [str(e) for e in errors]


def test_an_unused_let_is_a_warning(tmp_path):
    path = child(
        tmp_path,
        'checks:\n  - name: c\n    why: w\n    let: {a: "steps.leg1.rc", b: "steps.leg1.rc"}\n'
        '    expr: "let.a == `0`"\n',
    )
    errors, warnings = findings(load_spec(path), {})
    assert errors == [] and [w.message for w in warnings] == ["let.b is never read (by expr, when or another let)"]


# ------------------------------------------------------------------ ${x} in checks


def test_a_value_named_in_a_checks_reason_reads_as_its_text_and_an_unknown_one_is_refused(tmp_path):
    path = child(
        tmp_path,
        "checks:\n  - name: under\n    why: the loss stays under ${stop} in mode ${mode}\n"
        '    expr: "steps.leg1.rc == `0`"\n',
    )
    (check,) = [c for c in build_plan(load_spec(path), environ={}).checks if c["name"] == "under"]
    assert check["why"] == "the loss stays under 10 in mode default"
    path.write_text(path.read_text().replace("${stop}", "${ceilling}").replace("${mode}", "${run_dir}"))
    (error,) = findings(load_spec(path), {})[0]
    assert "$.checks[3].why: unknown value ${ceilling}" in str(error)


def test_a_check_can_name_a_step_through_a_value(tmp_path):
    path = child(
        tmp_path,
        "values:\n  final_leg: leg1\nchecks:\n  - name: final\n    why: w\n"
        '    expr: "steps.${final_leg}.harvest.run_json.final_step == values.stop"\n',
    )
    plan = build_plan(load_spec(path), environ={})
    (check,) = [c for c in plan.checks if c["name"] == "final"]
    assert check["expr"] == "steps.leg1.harvest.run_json.final_step == values.stop"
    assert findings(load_spec(path), {}) == ([], [])
    # Named wrongly, the spliced expression is checked like any other, in every mode.
    path.write_text(path.read_text().replace("final_leg: leg1", "final_leg: leg7"))
    (error,) = findings(load_spec(path), {})[0]
    assert "steps.leg7.harvest.run_json.final_step: no step named 'leg7'; steps: leg1" in str(error)


@pytest.mark.parametrize("value", ["'leg1 || `true`'", "1.5", "true", "[leg1]"])
def test_only_a_name_or_an_integer_can_be_spliced_into_a_check(value, tmp_path):
    path = child(
        tmp_path, f'values:\n  x: {value}\nchecks:\n  - name: c\n    why: w\n    expr: "steps.${{x}}.rc == `0`"\n'
    )
    (error,) = findings(load_spec(path), {})[0]
    assert "in a check, ${x} may only stand for a name or an integer" in str(error)


# ------------------------------------------------------------------ 4. step when


@pytest.mark.parametrize(
    "when, message",
    [
        ("stop", "must yield true or false, got 10"),
        ("env_map.MISSING == '1'", "reads env_map.MISSING, which is missing"),
    ],
)
def test_a_step_when_must_be_exactly_true_or_false(when, message, tmp_path):
    """A step condition reads values, all known before anything runs: a non-boolean or a missing key
    is a spec error (it would otherwise skip a leg silently)."""
    path = child(
        tmp_path, f"values:\n  env_map: {{A: '1'}}\nsteps:\n  - name: leg2\n    like: leg1\n    when: \"{when}\"\n"
    )
    errors, _ = findings(load_spec(path), {})
    assert any(message in str(e) and "$.steps[1].when" in str(e) for e in errors), [str(e) for e in errors]
    with pytest.raises(SpecErrors):
        build_plan(load_spec(path), environ={})


def test_an_exact_false_step_when_skips_the_step(tmp_path):
    path = child(tmp_path, 'steps:\n  - name: leg2\n    like: leg1\n    when: "stop == `11`"\n')
    steps = {s["name"]: s["enabled"] for s in build_plan(load_spec(path), environ={}).steps}
    assert steps == {"leg1": True, "leg2": False}


def test_report_marks_disabled_distinctly():
    result = {
        "name": "x",
        "expr": "`true`",
        "outcome": "DISABLED",
        "reason": "why (disabled at a.yaml:3)",
        "severity": "gate",
        "file": "a.yaml",
        "line": 1,
    }
    text = report.table({"spec": {"name": "s"}}, [result], {"outcome": "PASS", "seconds": 0})
    assert text.splitlines()[1].split(None, 2) == ["x", "DISABLED", "why (disabled at a.yaml:3)"]


# ------------------------------------------------------------------ comparisons with tolerances as values

TOLERANCES = Path(__file__).resolve().parents[1] / "specs" / "compare" / "tolerances.yaml"


def _compare_run(tmp_path: Path, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, dict]:
    run_dir = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    capsys.readouterr()
    rc = main(["run", str(TOLERANCES), "--run-dir", str(run_dir), *args])
    capsys.readouterr()
    doc = json.loads((run_dir / "evidence.json").read_text())
    return rc, doc


def _outcomes(doc: dict) -> dict[str, str]:
    return {r["name"]: r["outcome"] for r in doc["checks"]}


COMPARED_TEXT = "allclose(let.leg, restrict(let.reference, keys(let.leg)), values.loss_rtol, values.loss_atol)"


def test_tolerances_are_values_switched_by_target_and_a_resumed_leg_is_compared_on_its_steps(tmp_path, capsys):
    """The same spec is exact on the CPU's deterministic path and allows a measured floor on a GPU
    target; the resumed leg's steps are read from per-step marker lines and compared with the steps
    the reference trained."""
    assert validate_cli(TOLERANCES, capsys)[0] == Exit.PASS
    rc, doc = _compare_run(tmp_path, capsys)
    assert rc == Exit.PASS, doc["verdict"]
    assert (doc["values"]["loss_rtol"], doc["values"]["noise"]) == (0, 0)
    assert set(_outcomes(doc).values()) == {"PASS"}
    # On the gpu target the resumed leg moves by 3e-6 relative: within that target's rtol of 1e-5.
    rc, doc = _compare_run(tmp_path, capsys, "--set", "target=gpu")
    assert rc == Exit.PASS, doc["verdict"]
    assert (doc["values"]["loss_rtol"], doc["values"]["noise"]) == (1e-5, 3e-6)


def test_a_resumed_leg_off_the_reference_fails_naming_the_first_step_and_both_values(tmp_path, capsys):
    # The gpu's 3e-6 on the CPU target, whose tolerance is exact.
    rc, doc = _compare_run(tmp_path, capsys, "--set", "noise=3.0e-6")
    assert rc == Exit.FAILED
    assert _outcomes(doc) == {
        "every_step_trained_once": "PASS",
        "leg1_matches_the_reference": "PASS",
        "resumed_leg_matches_the_reference": "FAIL",
    }
    result = next(r for r in doc["checks"] if r["name"] == "resumed_leg_matches_the_reference")
    moved = (6.0 - 0.25 * 4) * (1 + 3e-06)
    assert dict(result["explain"])[COMPARED_TEXT] == (
        f"false: first difference at step 4: {moved!r} vs 5.0 (|d| {moved - 5.0:.1e} > atol 0 + rtol 0 x 5)"
    )
    # A mode whose resumed leg drifts fails on the gpu target too, past its floor.
    rc, doc = _compare_run(tmp_path, capsys, "--mode", "drifted", "--set", "target=gpu")
    assert rc == Exit.FAILED
    result = next(r for r in doc["checks"] if r["name"] == "resumed_leg_matches_the_reference")
    assert dict(result["explain"])[COMPARED_TEXT].endswith("(|d| 5.0e-03 > atol 0 + rtol 1e-05 x 5)")


def test_a_step_trained_by_two_legs_fails_the_coverage_read_from_the_logged_steps(tmp_path, capsys):
    rc, doc = _compare_run(tmp_path, capsys, "--set", "resume_at=3")  # leg 2 trains step 3 again
    assert rc == Exit.FAILED
    assert _outcomes(doc)["every_step_trained_once"] == "FAIL"
    result = next(r for r in doc["checks"] if r["name"] == "every_step_trained_once")
    coverage = next(text for text, _ in result["explain"] if text.startswith("step_coverage("))
    assert dict(result["explain"])[coverage] == "missing none; repeated 3; outside none"
