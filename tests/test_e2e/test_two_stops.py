"""The recipe "write your own probe: two stops" (docs/two-stops.md, specs/examples/p4_two_stops.yaml) and its
three-stops sibling (specs/examples/p4_three_stops.yaml): the library's checks reach every stop and
every leg through `for_each`, nothing is disabled or copied, and a real run of the three stops passes on
the embedded default (CPU, tiny model, local store; one rank under torchrun: the stops are what is tested here,
and the 2-rank legs are the smoke's, in test_e2e_local). The same run shows that
a middle stop is checked as closely as the first: its pointer target losing its weights fails the middle
stop's own checks. One real run, of the longer topology: the two specs expand the same library over their
stops (the static tests below hold that for both), and a second run would cost the suite its 4 sessions
and its own reference again."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from p4_runs import SharedP4
from test_e2e_local import EngineRun, assert_every_check_passed, run_engine, workdir_with_specs

from engine.cli import main as engine_main
from engine.judge.verdict import Exit
from engine.run import evidence as evmod
from engine.show.plots import for_spec
from engine.spec.load import load_spec
from engine.spec.plan import build_plan
from engine.spec.validate import findings

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "specs" / "examples"
# spec stem -> (its legs in order, the step each stop leg ends at in the smoke)
TOPOLOGIES = {
    "p4_two_stops": (["leg1", "leg2", "leg3"], [10, 20]),
    "p4_three_stops": (["leg1", "leg2", "leg3", "leg4"], [10, 20, 30]),
}
PER_STOP = (
    "stopped_at_the_stop_step",
    "reported_a_segment",
    "pushed_every_interval",
    "pointer_at_the_stop",
    "next_leg_resumed_from_exactly_the_stop",
    "next_leg_continues_the_trajectory",
    "tokens_at_the_stop_match_the_arithmetic",
    "skipped_validation_by_design",
    "loss_finite_and_below_ceiling_at_the_stop",
    "no_final_before_the_horizon",
    "resumed_leg_logged_each_step_after_the_resume_once",
    "stopped_leg_logged_each_step_up_to_the_stop_once",
    "next_leg_trained_other_batches_than_the_stopped_one",
)
PER_LEG = (
    "pointer_target_complete_after",
    "checkpoints_complete_after",
    "old_optimizer_states_pruned_after",
    "no_nonfinite_loss",
    "every_logged_loss_finite",
    "summary_agrees_with_the_logged_losses",
    "logged_lines_agree_with_run_json",
    "every_logged_step_has_its_lr_and_batch",
    "lr_follows_the_schedule",
    "no_batch_trained_twice_in_a_leg",
    "losses_match_the_reference",
    "lrs_match_the_reference",
    "batches_match_the_reference",
)


def test_the_two_stops_page_shows_the_spec_file_as_it_is() -> None:
    page = (REPO_ROOT / "docs" / "two-stops.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(.*?)```", page, re.S)
    assert block is not None
    assert block.group(1) == (EXAMPLES / "p4_two_stops.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize("stem", sorted(TOPOLOGIES))
def test_every_stop_and_every_leg_get_the_librarys_checks_and_none_is_disabled(stem: str) -> None:
    spec = load_spec(EXAMPLES / f"{stem}.yaml")
    assert findings(spec, {}) == ([], [])
    assert "disable" not in spec.data
    assert all(c["file"] != f"specs/examples/{stem}.yaml" for c in build_plan(spec, environ={}).checks)
    legs, stops = TOPOLOGIES[stem]
    for mode in ("smoke", "soak"):
        plan = build_plan(spec, mode=mode, environ={})
        mine = {c["name"]: c for c in plan.checks}
        expected = {f"{family}[leg={leg}]" for family in PER_STOP for leg in legs[:-1]}
        expected |= {f"{family}[leg={leg}]" for family in PER_LEG for leg in legs}
        assert expected <= set(mine), sorted(expected - set(mine))
        assert not any(c.get("disabled") for c in plan.checks)
        # Each expansion reads its own leg and the store after it, written once in the library.
        middle = legs[-2]
        assert mine[f"pointer_target_complete_after[leg={middle}]"]["let"] == {
            "named": f"keys(state.hub_after_{middle}.pointer.files)"
        }
        assert mine[f"pointer_target_complete_after[leg={middle}]"]["file"] == "specs/lib/p4_common.yaml"
        assert mine[f"next_leg_resumed_from_exactly_the_stop[leg={middle}]"]["let"] == {
            "run": f"steps.{legs[-1]}.harvest.run_json"
        }
        horizon = mine["final_leg_reached_the_horizon"]["expr"]
        assert horizon == f"steps.{legs[-1]}.harvest.run_json.final_step == values.steps"
        # The inherited plots draw every leg.
        assert {p.name: [s.label for s in p.series] for p in plan.plots} == {
            "loss": ["reference (never stopped)", *legs],
            "tokens_per_s": legs,
            "peak_memory": legs,
        }
    smoke = {c["name"]: c for c in build_plan(spec, environ={}).checks}
    for leg, stop in zip(legs, stops):
        assert smoke[f"stopped_at_the_stop_step[leg={leg}]"]["expr"].endswith(f"final_step == `{stop}`")
    steps = {s["name"]: s for s in build_plan(spec, environ={}).steps}
    for leg, stop in zip(legs[1:], stops[1:] + [0]):
        assert steps[leg]["run"]["output"] == steps["leg2"]["run"]["output"]
        assert steps[leg]["run"]["argv"][-2:] == ["--stop-after-steps", str(stop)]


@pytest.mark.parametrize(
    "spec",
    ["p4_smoke.yaml", "p4_soak.yaml", "p4_preempt.yaml", "examples/p4_two_stops.yaml", "examples/p4_three_stops.yaml"],
)
def test_every_leg_after_the_first_continues_the_run_with_resume_must(spec: str) -> None:
    """Leg 1 may create the scratch repo; a later leg that finds none (deleted between legs) must fail, not start
    the run afresh: `--resume must`, in every mode and on every target."""
    for mode in ("smoke", "soak") if "preempt" not in spec else ("smoke",):
        for target in ("local", "gpu", "real"):
            plan = build_plan(load_spec(REPO_ROOT / "specs" / spec), mode=mode, environ={"SPECPROBE_TARGET": target})
            trains = [s for s in plan.steps if s["kind"] == "run" and "trainer.train" in s["run"]["argv"]]
            legs = [s["run"]["argv"] for s in trains if "reference" not in s]
            resumes = [argv[argv.index("--resume") + 1] for argv in legs]
            # The run that never stopped starts fresh in its own store, whatever it finds there.
            (reference,) = [s["run"]["argv"] for s in trains if "reference" in s]
            assert reference[reference.index("--resume") :][:2] == ["--resume", "never"], reference
            assert [argv.count("--resume") for argv in legs] == [1] * len(legs), (spec, mode, target)
            assert resumes == ["auto"] + ["must"] * (len(legs) - 1), (spec, mode, target, resumes)


@pytest.fixture(scope="module")
def stops_run(tmp_path_factory: pytest.TempPathFactory, p4_shared: SharedP4) -> tuple[str, EngineRun]:
    """One real run of the three-stops example, shared by the tests below."""
    stem = "p4_three_stops"
    work = workdir_with_specs(tmp_path_factory.mktemp(stem) / "work")
    return stem, run_engine(work, f"specs/examples/{stem}.yaml", *p4_shared.sets(stem), "nproc=1", timeout=600)


@pytest.mark.slow
def test_passes_end_to_end_on_the_embedded_default(stops_run: tuple[str, EngineRun]) -> None:
    stem, run = stops_run
    legs, stops = TOPOLOGIES[stem]
    assert_every_check_passed(run, stem, min_checks=len(PER_STOP) * len(stops) + len(PER_LEG) * len(legs))
    assert "disabled" not in run.evidence["verdict"]
    resumed = [(r["resumed_from_step"], r["final_step"], r["segment_stop"]) for r in map(run.run_json, legs)]
    assert resumed == [(None, 10, True)] + [(s, s + 10, True) for s in stops[:-1]] + [
        (stops[-1], stops[-1] + 10, False)
    ]
    state = run.evidence["state"]
    for leg, stop in zip(legs, stops):
        assert state[f"hub_after_{leg}"]["pointer"]["step"] == stop
    horizon = state[f"hub_after_{legs[-1]}"]
    assert horizon["checkpoints"] == stops + [stops[-1] + 10] and horizon["pointer"]["path_in_repo"] == "final"
    # The inherited plots draw every leg: the tokens/s plot has a line for each of them.
    plots = {f.name: f for f in for_spec(load_spec(EXAMPLES / f"{stem}.yaml"), run.evidence)}
    rates = plots["tokens_per_s"].series
    assert [s.label for s in rates] == legs and all(len(s.drawn()) >= 2 for s in rates), rates
    assert [s.label for s in plots["loss"].series] == ["reference (never stopped)", *legs]
    # The last leg's checkpoint was compared with the reference's, after it (the library's comparison after
    # leg 2 is skipped: leg 2 is not the last leg here).
    assert run.evidence["steps"]["leg2_vs_reference"]["status"] == "skipped"
    compared = state[f"{legs[-1]}_vs_reference"]
    assert compared["error"] is None and compared["equal"] is True, compared


@pytest.mark.slow
def test_a_middle_stop_whose_pointer_target_lost_its_weights_fails_its_own_checks(
    stops_run: tuple[str, EngineRun], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The store after leg 2 (a middle stop in both examples) loses the weights of the checkpoint its
    pointer names: the pointer still lists them, the store no longer does. The middle stop's own
    expansions fail, by name; nothing about the other stops moves."""
    stem, run = stops_run
    copy = tmp_path / "run"
    shutil.copytree(run.run_dir, copy)
    doc = evmod.load(copy)
    state = doc["state"]["hub_after_leg2"]
    gone = f"{state['pointer']['path_in_repo']}/model.safetensors"
    assert state["pointer"]["path_in_repo"] == "ckpt/checkpoint-20" and gone in state["files"]
    state["files"].remove(gone)
    del state["sha256"][gone]
    state["pointer_target_sha256"]["model.safetensors"] = None  # what the collector records for an absent file
    (copy / "evidence.json").write_text(evmod.dumps(doc), encoding="utf-8")

    capsys.readouterr()
    rc = engine_main(["check", str(EXAMPLES / f"{stem}.yaml"), "--evidence", str(copy)])
    out = capsys.readouterr().out
    assert rc == Exit.FAILED, out
    (record,) = [evmod.loads(p.read_text(encoding="utf-8")) for p in copy.glob("check-*.json")]
    assert record["verdict"]["failed"] == [
        "pointer_target_complete_after[leg=leg2]",
        "checkpoints_complete_after[leg=leg2]",
    ]
    assert f'VERDICT {stem} FAIL ["pointer_target_complete_after[leg=leg2]", ' in out
    mine = next(r for r in record["checks"] if r["name"] == "pointer_target_complete_after[leg=leg2]")
    assert (mine["file"], mine["outcome"]) == ("specs/lib/p4_common.yaml", "FAIL")
