"""specs/probes/lightning.yaml on the shipped Lightning driver: stopped at an epoch end with a sampler seeded per
epoch, the resume is exact (PASS); stopped mid-epoch, or with an unseeded shuffle, it FAILs naming the first step and
quantity that differ. One engine run per mode, two references (seeded, unseeded) made once each (spec_runs.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.probe_spec("lightning")  # the spec its tests run (the fixture `spec_run`, conftest.py)


def test_stopped_at_an_epoch_end_with_a_sampler_seeded_per_epoch_the_fit_is_the_reference(spec_run) -> None:
    run = spec_run("correct", expect=0)
    assert "VERDICT lightning PASS []" in run.out


def test_stopped_mid_epoch_fails_at_step_13_and_the_report_shows_lightnings_warning(spec_run) -> None:
    run = spec_run("broken_mid_epoch", expect=5)
    # Step 13 trains the epoch's first batch again (the reference's step 9), with its loss.
    said = run.said_under("resumed_run_matches_the_reference[q=batches]")
    assert "first difference at step 13: " in said and "(not the same value)" in said
    assert "first difference at step 13: " in run.said_under("resumed_run_matches_the_reference[q=loss]")
    # Lightning exits 0 and only warns: the warning is kept with the leg and said in its row.
    leg2 = run.evidence["steps"]["leg2"]
    assert leg2["status"] == "ok"
    assert any("not resumable" in hit["text"] for hit in leg2["warn_on"]["lines"])
    assert "warned: " in run.step_row("leg2")


def test_an_unseeded_shuffle_stopped_at_an_epoch_end_fails_at_step_9(spec_run) -> None:
    run = spec_run("broken_unseeded_epoch", expect=5)
    assert not [f for f in run.failed if f.startswith("stopped_leg")]
    said = run.said_under("resumed_run_matches_the_reference[q=batches]")
    assert "first difference at step 9: " in said and "(not the same value)" in said


def test_a_resume_that_finds_no_checkpoint_and_starts_over_fails_where_it_started(spec_run) -> None:
    run = spec_run("broken_checkpoint_lost", expect=5)
    # Lightning only warns and trains from step 1: on the CPU every series and the final checkpoint are the
    # reference's, so only the session's start tells this resume from a correct one.
    assert run.failed == ["resumed_leg_started_after_the_checkpoint"]
    assert any("no last checkpoint" in hit["text"] for hit in run.evidence["steps"]["leg2"]["warn_on"]["lines"])
    said = run.said_under("resumed_leg_started_after_the_checkpoint")
    assert "let.session.start_step = 0" in said and "values.resume_step = 8" in said
