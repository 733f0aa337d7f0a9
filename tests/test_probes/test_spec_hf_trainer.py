"""specs/probes/hf_trainer.yaml on the shipped transformers.Trainer driver: the callback's stop resumes exactly (PASS),
and each known wrong way FAILs naming the first step and quantity that differ from the run that never stopped. One
engine run per mode; the reference is made once and reused by the others (spec_runs.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.probe_spec("hf_trainer")  # the spec its tests run (the fixture `spec_run`, conftest.py)


def test_stopped_by_the_callback_and_resumed_the_run_is_the_reference(spec_run) -> None:
    run = spec_run("correct", expect=0)
    assert "VERDICT hf_trainer PASS []" in run.out
    assert [r["outcome"] for r in run.evidence["checks"]] == ["PASS"] * 10


def test_a_session_ended_by_max_steps_fails_at_the_first_lr_of_its_shorter_schedule(spec_run) -> None:
    run = spec_run("broken_max_steps_stop", expect=5)
    assert "stopped_leg_matches_the_reference[q=lr]" in run.failed
    assert "first difference at step 5: 0.017142857142857144 vs 0.018823529411764708" in run.said_under(
        "stopped_leg_matches_the_reference[q=lr]"
    )
    assert "final_checkpoint_matches_the_reference" in run.failed


def test_a_checkpoint_without_optimizer_state_fails_at_step_11_trained_at_lr_0(spec_run) -> None:
    run = spec_run("broken_no_optimizer_state", expect=5)
    # Session 1 is the reference's; the resumed one starts a new warm-up with a fresh AdamW.
    assert not [f for f in run.failed if f.startswith("stopped_leg")]
    assert "first difference at step 11: 0.0 vs 0.011764705882352941" in run.said_under(
        "resumed_run_matches_the_reference[q=lr]"
    )
    assert "first difference at step 11: " in run.said_under("resumed_run_matches_the_reference[q=loss]")
