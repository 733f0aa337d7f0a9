"""specs/probes/accelerate.yaml on the shipped accelerate loop: the seedable sampler resumes exactly (PASS);
skip_first_batches over an unseeded shuffle, and automatic checkpoint naming with the counter load_state leaves,
FAIL naming the first step and quantity that differ (and the crashed session's exception). One engine run per mode;
two references (seedable, unseeded) made once each (spec_runs.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.probe_spec("accelerate")  # the spec its tests run (the fixture `spec_run`, conftest.py)


def test_the_seedable_sampler_resumes_mid_epoch_to_the_reference(spec_run) -> None:
    run = spec_run("correct", expect=0)
    assert "VERDICT accelerate PASS []" in run.out


def test_skip_first_batches_over_an_unseeded_shuffle_fails_at_step_11(spec_run) -> None:
    run = spec_run("broken_unseeded_sampler", expect=5)
    assert not [f for f in run.failed if f.startswith("stopped_leg")]
    said = run.said_under("resumed_run_matches_the_reference[q=samples]")
    assert "first difference at step 11: " in said and "(not the same value)" in said


def test_automatic_naming_crashes_the_resumed_session_and_fails_at_step_16(spec_run) -> None:
    run = spec_run("broken_checkpoint_naming", expect=5)
    assert "step:leg2" in run.failed
    row = run.step_row("leg2")
    assert "last exception: " in row and "checkpoint_0" in row and "already exists" in row
    # Steps 11-15 are the reference's; the crash at step 15's save leaves steps 16-24 untrained.
    assert "first difference at step 16: only in b" in run.said_under("resumed_run_matches_the_reference[q=loss]")
