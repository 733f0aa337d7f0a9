"""`require:`: what a spec states about its own values and steps, checked by `engine validate` in every
mode and whenever the spec is planned (run, plan, check, replay), before anything runs. The P4 library
requires every leg that a later leg resumes from to be listed in `stops`: a four-leg spec that leaves
a middle stop out, and a spec written before `for_each` that lists only the first stop, are refused,
naming the leg, instead of running the stop's leg unchecked."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from engine_helpers import Engine, write_spec

from engine.spec.load import load_spec
from engine.spec.located import SpecErrors
from engine.spec.plan import build_plan
from engine.spec.validate import validate

ROOT = Path(__file__).resolve().parents[2]
RULE = "every_leg_a_later_leg_resumes_from_is_a_stop"
LEGS = 'let.legs = ["leg1","leg2","leg3","leg4"]'


@pytest.fixture
def specs(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    return tmp_path / "specs"


def require_line() -> int:
    """The line of the P4 requirement in the library (what every refusal is located at)."""
    lines = (ROOT / "specs" / "lib" / "p4_segment.yaml").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip() == f"- name: {RULE}")


@pytest.mark.parametrize("leg", ["leg2", "leg3"])
def test_the_four_leg_spec_without_a_middle_stop_is_refused_naming_the_leg(
    engine: Engine, specs: Path, leg: str
) -> None:
    path = specs / "examples" / "p4_three_stops.yaml"
    text = path.read_text()
    stop = f'    - {{leg: {leg}, stop: "${{stop{leg[-1]}}}", next: leg{int(leg[-1]) + 1}}}\n'
    assert stop in text
    path.write_text(text.replace(stop, ""))
    stops_line = text.splitlines().index("  stops:") + 2  # its first element, where the list starts
    ran = engine("validate", str(path))
    assert ran.code == 2, ran
    (problem,) = [line for line in (ran.out + ran.err).splitlines() if RULE in line]
    assert problem.startswith(f"{specs}/lib/p4_segment.yaml:{require_line()}:")
    assert f"{path}" in problem and " in mode " not in problem  # every mode: said once
    assert f'{LEGS}; let.not_in_stops = ["{leg}"]' in problem
    assert f"values.stops ({path}:{stops_line})" in problem
    # Planned for a run, a check or a replay it is refused the same way, before anything runs.
    ran = engine("run", str(path), "--run-dir", str(specs.parent / "run"))
    assert ran.code == 2 and f'let.not_in_stops = ["{leg}"]' in ran.out + ran.err
    assert not (specs.parent / "run").exists()
    with pytest.raises(SpecErrors) as refused:
        build_plan(load_spec(path), mode="soak", environ={})
    assert f'in mode soak: {LEGS}; let.not_in_stops = ["{leg}"]' in str(refused.value.errors[0])


def test_the_shipped_four_leg_spec_satisfies_the_requirement_and_plans_every_stops_checks() -> None:
    spec = load_spec(ROOT / "specs" / "examples" / "p4_three_stops.yaml")
    assert validate(spec, {}) == []
    checks = {c["name"] for c in build_plan(spec, environ={}).checks}
    assert {f"pointer_at_the_stop[leg={leg}]" for leg in ("leg1", "leg2", "leg3")} <= checks


OLD_STYLE = """\
version: 1
name: old_two_stops
description: Three legs written before for_each; the middle stop checked by hand, stops never listed.
extends: ../lib/p4_segment.yaml
modes:
  default: smoke
  smoke: {steps: 30}
  soak: {steps: 240}
values:
  final_leg: leg3
  stop2: {eval: "add(stop1, push_every)"}
steps:
  - name: leg2
    override: true
    run:
      argv: ["${torchrun}", "${train_args}", "--resume", "must", "--stop-after-steps", "${stop2}"]
  - name: wipe_before_leg3
    remove: ["${train_out}", "${tlog}"]
  - name: leg3
    like: leg2
    run:
      argv: ["${torchrun}", "${train_args}", "--resume", "must", "--stop-after-steps", "0"]
  - name: hub_after_leg3
    like: hub_after_leg2
checks:
  - name: leg2_stopped_at_stop2
    why: The middle session must end at its stop.
    expr: "steps.leg2.harvest.run_json.final_step == values.stop2"
"""


def test_an_old_style_spec_that_lists_only_the_first_stop_is_refused_naming_the_middle_leg(
    engine: Engine, specs: Path
) -> None:
    path = specs / "examples" / "old_two_stops.yaml"
    path.write_text(OLD_STYLE)
    ran = engine("validate", str(path))
    assert ran.code == 2 and 'let.legs = ["leg1","leg2","leg3"]; let.not_in_stops = ["leg2"]' in ran.out + ran.err, ran
    # Listing the stop is the whole fix, with the last leg's checkpoint compared with the reference's after it
    # (`engine validate` names the comparison step it lacks otherwise).
    path.write_text(
        OLD_STYLE.replace(
            'stop2: {eval: "add(stop1, push_every)"}\n',
            'stop2: {eval: "add(stop1, push_every)"}\n  stops:\n'
            '    - {leg: leg1, stop: "${stop1}", next: leg2}\n    - {leg: leg2, stop: "${stop2}", next: leg3}\n',
        ).replace(
            "    like: hub_after_leg2\n",
            "    like: hub_after_leg2\n  - name: leg3_vs_reference\n    like: leg2_vs_reference\n"
            "    when: \"final_leg == 'leg3'\"\n",
        )
    )
    ran = engine("validate", str(path))
    assert (ran.code, ran.out + ran.err) == (0, f"OK {path}\n")


def test_a_final_leg_that_is_not_the_last_leg_and_a_wrong_next_are_refused(engine: Engine, specs: Path) -> None:
    path = specs / "examples" / "p4_three_stops.yaml"
    text = path.read_text()
    path.write_text(text.replace("final_leg: leg4", "final_leg: leg3"))
    ran = engine("validate", str(path))
    said = ran.out + ran.err
    assert ran.code == 2 and RULE in said and f"{LEGS}; let.not_in_stops = []" in said
    path.write_text(text.replace("next: leg3}", "next: leg4}"))
    ran = engine("validate", str(path))
    assert ran.code == 2 and RULE in ran.out + ran.err


# ---- the engine's part: generic, over values, mode and the plan's steps

BASE = {
    "version": 1,
    "name": "r",
    "budget_s": 100,
    "modes": {"default": "a", "a": {"legs": ["one"]}, "b": {"legs": ["one", "two"]}},
    "values": {"api_token": "tok_requireSECRET0123"},
    "steps": [{"name": "one", "run": {"argv": ["true", "${api_token}"], "timeout_s": 5}}],
    "checks": [{"name": "c", "why": "w", "expr": "steps.one.rc == `0`"}],
    "require": [
        {
            "name": "every_listed_leg_runs",
            "why": "A leg listed in legs that no step runs would be checked against nothing.",
            "let": {"absent": "difference(values.legs, steps[?kind == 'run'].name)"},
            "expr": "let.absent == `[]`",
        }
    ],
}


def test_a_requirement_that_fails_in_one_mode_names_that_mode_and_its_lets(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path / "s.yaml", BASE))
    (error,) = validate(spec, {})
    assert (error.path, error.line) == ("$.require[0]", spec.locate(("require", 0))[1])
    assert error.message.startswith(
        f"{spec.path} breaks requirement 'every_listed_leg_runs' in mode b: let.absent = [\"two\"]. "
        "A leg listed in legs that no step runs would be checked against nothing."
    )
    assert build_plan(spec, mode="a", environ={}).name == "r"
    with pytest.raises(SpecErrors) as refused:
        build_plan(spec, mode="b", environ={})
    assert "in mode b: let.absent" in str(refused.value.errors[0])


def test_a_requirement_that_reads_what_the_plan_lacks_and_one_that_shows_a_secret(tmp_path: Path) -> None:
    doc = dict(BASE, require=[{"name": "typo", "why": "w", "expr": "value.legs == `[]`"}])
    (error,) = validate(load_spec(write_spec(tmp_path / "s.yaml", doc)), {})
    assert "breaks requirement 'typo': it reads value.legs, which the plan does not have" in error.message
    doc = dict(
        BASE, require=[{"name": "argv", "why": "w", "let": {"a": "steps[0].run.argv"}, "expr": "length(let.a) == `0`"}]
    )
    (error,) = validate(load_spec(write_spec(tmp_path / "s.yaml", doc)), {})
    assert 'let.a = ["true","<redacted>"]' in error.message and "SECRET" not in error.message


def test_requirements_merge_by_name_and_an_inherited_one_is_replaced_only_on_purpose(
    engine: Engine, tmp_path: Path
) -> None:
    write_spec(tmp_path / "base.yaml", BASE)
    child = {"extends": "base.yaml", "require": [{"name": "every_listed_leg_runs", "why": "w", "expr": "`true`"}]}
    ran = engine("validate", str(write_spec(tmp_path / "child.yaml", child)))
    assert ran.code == 2 and "requirement 'every_listed_leg_runs' replaces the one inherited from" in ran.out + ran.err
    child["require"][0]["override"] = True
    assert engine("validate", str(write_spec(tmp_path / "child.yaml", child))).code == 0
