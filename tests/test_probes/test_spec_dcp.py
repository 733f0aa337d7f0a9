"""specs/probes/dcp.yaml on the shipped 2-rank torch.distributed.checkpoint loop under torchrun: SIGKILLed inside
the save of step 10 (held there, so the kill always lands between the data and the .metadata), the loop that moves
its pointer after the save resumes from step 5 to the reference (PASS); the one that moves it before FAILs, its
resumed session crashing on the torn checkpoint. One engine run per mode, one reference (spec_runs.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.probe_spec("dcp")  # the spec its tests run (the fixture `spec_run`, conftest.py)


def test_killed_inside_a_save_the_loop_resumes_from_the_previous_checkpoint_to_the_reference(spec_run) -> None:
    run = spec_run("correct", expect=0)
    assert "VERDICT dcp PASS []" in run.out
    leg1 = run.evidence["steps"]["leg1"]
    assert leg1["terminated_by"] == "signal_rule" and leg1["signals_sent"][0]["held"]["stopped"] is True
    # Session 2 retrained steps 6-10 from the last complete checkpoint, step 5.
    assert run.evidence["steps"]["leg2"]["harvest"]["steps"][0]["step"] == 6


def test_a_pointer_moved_before_the_save_fails_the_resume_and_every_step_after_the_kill(spec_run) -> None:
    run = spec_run("broken_pointer_before_save", expect=5)
    assert "step:leg2" in run.failed and "last exception: " in run.step_row("leg2")
    assert "first difference at step 11: only in b" in run.said_under("resumed_run_matches_the_reference[q=loss]")
