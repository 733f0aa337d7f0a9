"""`engine review` sees every target, never believes a saved run's account of itself, and says what it
finds in the spec's own terms. Real git repositories as in test_review.py: the shipped specs and saved
runs (their `switch: target` cases: local, gpu, real; the saved runs are local ones), or the small
probe with its real saved run; one change committed on a branch, reviewed against main."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from test_review import (
    LIB,
    WHY_RISKY,
    commit,
    edit,
    git,
    line_of,
    repo,
    review,
    run_probe,
    shipped,
    shipped_template,
    template,
)

from engine.diff.review import EXIT_RISKY, EXIT_SAFE
from engine.spec.load import load_spec
from engine.spec.plan import build_plan, step_definition
from engine.spec.values import PER_RUN_BUILTINS

# test_review's fixtures, found by pytest under these names: the probe's repository and the shipped one.
FIXTURES = (repo, shipped, shipped_template, template)
COMMON = "specs/lib/p4_common.yaml"
SEGMENT = "specs/lib/p4_segment.yaml"


def reviewed(exit_code: int) -> str:
    """What `engine review` says of the change, its exit code asserted to be `exit_code` (its text shown if not)."""
    rc, text, _ = review()
    assert rc == exit_code, text
    return text


def risky(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("  ! ")]


def review_is_risky_saying(*lines: str) -> None:
    """`engine review` exits EXIT_RISKY, and `lines` are its risky lines, all of them (its text shown if not)."""
    text = reviewed(EXIT_RISKY)
    assert risky(text) == list(lines), text


def line_for(text: str, *parts: str) -> str:
    """The one risky line holding every one of `parts`."""
    found = [line for line in risky(text) if all(p in line for p in parts)]
    assert len(found) == 1, f"{parts} in {len(found)} risky lines of:\n{text}"
    return found[0]


# ---------------------------------------------------------------- every target


def test_a_loss_ceiling_raised_on_the_gpu_target_only_is_a_loosened_gate_with_its_values(shipped: Path) -> None:
    """The saved runs are local; the 106M geometry's ceiling 10.7 -> 12.0 (above ln 49152 = 10.8) moves
    nothing they can show, so it is judged by the spec's values, on the targets it moves on."""
    edit(shipped, COMMON, "cases: {tiny: 6.0, ounce100m-22l: 10.7}", "cases: {tiny: 6.0, ounce100m-22l: 12.0}")
    rc, text, err = review()
    assert (rc, err) == (EXIT_RISKY, ""), text
    line = line_for(text, "gate `final_loss_finite_and_below_ceiling` loosened", "specs/p4_smoke.yaml")
    assert "specs/p4_smoke.yaml [mode smoke, soak; target gpu, real]" in line
    assert "loosened `loss_ceiling` 10.7 -> 12.0 by the spec's values" in line
    assert "every mode (smoke, soak) on target gpu, real:" in text
    assert "~ loss_ceiling: 10.7 -> 12.0  (specs/lib/p4_common.yaml:" in text


def test_the_gpu_geometrys_parameter_count_changed_is_risky_where_no_saved_run_shows_it(shipped: Path) -> None:
    edit(shipped, COMMON, "ounce100m-22l: 106194240}", "ounce100m-22l: 106194241}")
    text = reviewed(EXIT_RISKY)
    line = line_for(text, "gate `params_are_the_expected_model`", "specs/p4_smoke.yaml")
    assert line.startswith("  ! gate asks for another value in ")
    assert "asks for `expect_params` 106194240 -> 106194241 by the spec's values" in line
    assert "[mode smoke, soak; target gpu, real]" in line
    assert f"why risky: {WHY_RISKY['gate asks for another value']}" in text


def test_a_required_loss_drop_made_negative_on_the_gpu_target_is_a_loosened_gate(shipped: Path) -> None:
    """`let.horizon < sub(let.step1, values.loss_drop_min)` reads the run on both sides; the bound still
    rises as the value falls, whatever the run's step-1 loss."""
    edit(shipped, COMMON, "cases: {tiny: 0.8, ounce100m-22l: 0.15}", "cases: {tiny: 0.8, ounce100m-22l: -0.5}")
    text = reviewed(EXIT_RISKY)
    line = line_for(text, "gate `loss_at_horizon_below_step_one` loosened")
    assert "loosened `loss_drop_min` 0.15 -> -0.5 by the spec's values" in line
    assert "specs/p4_smoke.yaml [mode smoke, soak; target gpu, real]" in line


def test_the_memory_gates_when_moved_from_soak_to_smoke_names_the_modes_it_no_longer_runs_in(shipped: Path) -> None:
    edit(shipped, SEGMENT, "mode == 'soak' && target != 'local'", "mode == 'smoke' && target != 'local'")
    review_is_risky_saying(
        "  ! gate skipped in some modes in specs/p4_soak.yaml [mode soak; target gpu, real]: gate "
        "`peak_memory_during_training_below_gate` no longer runs in mode soak on target gpu, real: "
        f"`when: values.gate_peak` is false there now  (specs/lib/p4_segment.yaml:{line_of(SEGMENT, 'gate_peak:')})"
    )


# ---------------------------------------------------------------- a saved run's account of itself


def _forge(where: Path, spec_path: str, stem: str, **extra: object) -> None:
    """Rewrite evidence/<stem>'s fingerprints and definitions to those of the working tree's spec, as a
    hand would: nothing is run."""
    path = where / "evidence" / stem / "evidence.json"
    doc = json.loads(path.read_text())
    builtins = {k: doc["values"][k] for k in PER_RUN_BUILTINS if k in doc["values"]}
    plan = build_plan(load_spec(where / spec_path), mode=doc["mode"], environ={}, builtins=builtins)
    doc["fingerprints"] = dict(plan.fingerprints)
    doc["definitions"] = {s["name"]: step_definition(s) for s in plan.steps}
    doc.update(extra)
    path.write_text(json.dumps(doc, indent=1))


RESUME = '"--resume", "must", "--stop-after-steps", "0"]'


def test_a_leg_changed_with_the_saved_runs_fingerprints_rewritten_to_match_is_still_a_leg_change(
    shipped: Path,
) -> None:
    edit(shipped, COMMON, RESUME, RESUME.replace("must", "auto"))
    _forge(shipped, "specs/p4_smoke.yaml", "p4_smoke")
    text = reviewed(EXIT_RISKY)
    line_for(text, "legs changed in specs/p4_smoke.yaml", "`leg2` argv `--resume must` -> `--resume auto`")
    rewritten = line_for(text, "saved run rewritten in specs/p4_smoke.yaml")
    assert "with its `definitions`, `fingerprints` edited in this change: read as the base has it" in rewritten


def test_a_new_runs_legs_are_those_of_the_spec_files_it_ran_never_its_fingerprints(shipped: Path) -> None:
    """Another start and other step times make it a new run, but its spec files are the base's: its legs
    are recomputed from the base revision, whatever fingerprints it carries."""
    doc = json.loads((shipped / "evidence" / "p4_smoke" / "evidence.json").read_text())
    at_base = {path: hashlib.sha256((shipped / path).read_bytes()).hexdigest() for path in doc["spec"]["files"]}
    edit(shipped, COMMON, RESUME, RESUME.replace("must", "auto"))
    steps = {name: {**rec, "seconds": 1.0} for name, rec in doc["steps"].items()}
    again = {"started_at": "2030-01-01T00:00:00.000000Z", "steps": steps, "spec": {**doc["spec"], "files": at_base}}
    _forge(shipped, "specs/p4_smoke.yaml", "p4_smoke", **again)
    text = reviewed(EXIT_RISKY)
    line = line_for(text, "legs changed in specs/p4_smoke.yaml")
    assert "evidence/p4_smoke is a run of other legs (`leg2` differ: `engine check` refuses it)" in line


def test_a_renewed_run_of_spec_files_of_neither_side_is_refused(shipped: Path) -> None:
    doc = json.loads((shipped / "evidence" / "p4_smoke" / "evidence.json").read_text())
    files = {path: "0" * 64 for path in doc["spec"]["files"]}
    steps = {name: {**rec, "seconds": 1.0} for name, rec in doc["steps"].items()}  # another run than the base's
    _forge(
        shipped,
        "specs/p4_smoke.yaml",
        "p4_smoke",
        started_at="2030-01-01T00:00:00Z",
        steps=steps,
        spec={**doc["spec"], "files": files},
    )
    text = reviewed(EXIT_RISKY)
    line = line_for(text, "saved run refused in specs/p4_smoke.yaml")
    assert "made with spec files that are neither the base's nor this change's" in line
    assert "saved run: not re-checked: its legs cannot be recomputed" in text


def test_a_harvest_rule_that_stops_failing_on_conflicting_lines_is_risky_with_a_new_run(repo: Path) -> None:
    rule = '{marker: "RUN_JSON ", pick: last}'
    text = (repo / LIB).read_text()
    (repo / LIB).write_text(text.replace(rule, '{marker: "RUN_JSON ", pick: last, on_conflict: pick}'))
    run_probe(repo)  # a real run of the new rules, committed with them: the legs are shown to pass
    commit(repo, "pick between conflicting RUN_JSON lines")
    review_is_risky_saying(
        "  ! harvest rule loosened in specs/probe.yaml [mode smoke, soak]: harvest rule `run_json` of `leg1`, "
        "`leg2`: on_conflict fail -> pick: two different `RUN_JSON` lines no longer fail the run  "
        "(specs/lib/common.yaml:20)"
    )


def test_a_variable_that_can_now_set_a_gates_bound_is_risky(repo: Path) -> None:
    edit(repo, LIB, "values:\n", "env:\n  PROBE_LOSS_MAX: loss_max\nvalues:\n")
    commit(repo, "the loss ceiling from the environment")
    review_is_risky_saying(
        "  ! value made overridable in specs/probe.yaml [mode smoke, soak]: `loss_max` can now be set by the "
        "environment variable `PROBE_LOSS_MAX`: it decides gate `loss_below_max`  (specs/lib/common.yaml:7)"
    )


def test_a_new_spec_that_extends_a_spec_with_no_saved_run_and_disables_a_gate_there_is_risky(shipped: Path) -> None:
    (shipped / "specs" / "p4_lean.yaml").write_text(
        "version: 1\nname: p4_lean\ndescription: two stops, no final weights\n"
        "extends: examples/p4_two_stops.yaml\ndisable:\n  final_pushed: not needed here\n"
    )
    review_is_risky_saying(
        "  ! spec turned into a fragment in specs/examples/p4_two_stops.yaml: `specs/examples/p4_two_stops.yaml`, "
        "a spec at the base with no saved run, is now read through `specs/p4_lean.yaml`, which disables its gate "
        "`final_pushed`: `engine review` no longer reviews it as a spec"
    )


# ---------------------------------------------------------------- the review's words


def test_a_consistent_rename_of_a_leg_is_one_line_and_exits_0(shipped: Path) -> None:
    """leg3 -> leg_last in its steps, `final_leg`, `stops`, the collector and the comparison with the reference
    (its name and its `when`): one change, nothing risky."""
    spec = shipped / "specs" / "examples" / "p4_two_stops.yaml"
    spec.write_text(re.sub(r"leg3(?![0-9])", "leg_last", spec.read_text()))
    rc, text, err = review()
    assert (rc, err) == (EXIT_SAFE, ""), text
    assert risky(text) == []
    assert "  specs/examples/p4_two_stops.yaml    renamed leg3 -> leg_last" in text
    shown = [line for line in text.splitlines() if "leg_last" in line]
    assert shown == [
        "  specs/examples/p4_two_stops.yaml    renamed leg3 -> leg_last",
        "renamed leg3 -> leg_last",
        "    ~ renamed leg3 -> leg_last (with wipe_before_leg3, hub_after_leg3, leg3_vs_reference), in every step, "
        "value and check that names it  (specs/examples/p4_two_stops.yaml:41)",
    ], text


def test_a_check_renamed_that_asks_the_same_is_a_rename_not_a_gate_removed(repo: Path) -> None:
    edit(repo, LIB, "- name: leg2_exit_clean", "- name: leg2_exited_zero")
    commit(repo, "a better name")
    text = reviewed(EXIT_SAFE)
    assert "~ renamed check leg2_exit_clean -> leg2_exited_zero (it checks exactly what it did)" in text


def test_a_when_false_in_some_modes_names_them(repo: Path) -> None:
    edit(
        repo,
        LIB,
        'expr: "steps.leg2.harvest.run_json.final_loss < values.loss_max"',
        'expr: "steps.leg2.harvest.run_json.final_loss < values.loss_max"\n    when: "mode == \'soak\'"',
    )
    commit(repo, "the ceiling in the soak only")
    text = reviewed(EXIT_RISKY)
    assert line_for(text, "gate given a when").endswith(
        "gate `loss_below_max` given `when: mode == 'soak'`, false in mode smoke: it is skipped there  "
        "(specs/lib/common.yaml:40)"
    ), text


def test_a_bound_written_as_a_literal_for_a_value_reads_loosened_with_both_numbers(repo: Path) -> None:
    """`values.tol` -> `1.0` where tol is 0.0 in every mode: a bound that moved from 0 to 1, not a check
    that compares something else."""
    git(repo, "checkout", "-q", "main")
    edit(repo, LIB, "  loss_max: 3.0\n", "  loss_max: 3.0\n  tol: 0.0\n")
    edit(
        repo,
        LIB,
        "checks:\n",
        "checks:\n  - name: loss_as_reported\n    why: Leg 2 reports the loss it was built to.\n"
        '    expr: "abs(sub(steps.leg2.harvest.run_json.final_loss, `2.25`)) <= values.tol"\n',
    )
    commit(repo, "a tolerance gate, on main")
    git(repo, "checkout", "-q", "-B", "pr")
    edit(repo, LIB, "<= values.tol", "<= `1.0`")
    shutil.rmtree(repo / "evidence")  # no saved run: the spec's values alone judge it
    commit(repo, "a looser tolerance")
    text = reviewed(EXIT_RISKY)
    line = line_for(text, "gate `loss_as_reported`")
    assert line.startswith(
        "  ! gate loosened in specs/probe.yaml [mode smoke, soak]: gate `loss_as_reported` loosened 0 -> 1"
    )
    assert "by the spec's values: `values.tol` -> `` `1.0` ``" in line


def test_a_check_that_now_compares_one_value_where_it_compared_twenty_says_so(shipped: Path) -> None:
    """p4_preempt's leg 2 logs 20 losses; the rewritten check reads only the last one."""
    edit(
        shipped,
        COMMON,
        'expr: "all_finite(values(steps.${leg}.harvest.run_json.losses))"',
        'expr: "all_finite([steps.${leg}.harvest.run_json.final_loss])"',
    )
    text = reviewed(EXIT_RISKY)
    line = line_for(text, "specs/p4_preempt.yaml", "every_logged_loss_finite[leg=leg2]")
    assert "it now compares 1 value of the run where it compared 20" in line, line


def test_a_target_taken_away_from_a_switch_is_a_gate_removed_under_it(shipped: Path) -> None:
    """Without the `real` case the spec cannot be planned on the real target: its gates no longer run there."""
    edit(shipped, COMMON, "    cases: {local: cpu, gpu: cuda, real: cuda}", "    cases: {local: cpu, gpu: cuda}")
    text = reviewed(EXIT_RISKY)
    line = line_for(text, "gate removed in ", "mode `soak` on target real removed")
    assert "specs/p4_soak.yaml [mode soak; target real]" in line
    assert "mode smoke (target real) (removed):" in text
