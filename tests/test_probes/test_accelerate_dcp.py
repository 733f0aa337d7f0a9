"""The plain-loop drivers: accelerate's save_state/load_state loop (in this process) and the 2-rank
torch.distributed.checkpoint loop (two forked gloo ranks, SIGKILLed inside a save)."""

from __future__ import annotations

from probe_helpers import Run, first_difference

from probes.ckpt import compare_paths

ACC_KEYS = ("loss", "lr", "samples", "epoch")
DCP_KEYS = ("loss", "lr", "samples")


def test_accelerate_seedable_sampler_resumes_every_step_exactly(accelerate_runs: dict[str, Run]) -> None:
    run, ref = accelerate_runs["default"], accelerate_runs["reference"]
    leg1, leg2 = run.sessions
    assert leg1.stop == {"step": 10, "checkpoint": str(run.out / "checkpoints" / "checkpoint_1"), "saved": True}
    assert leg2.error is None and [s["step"] for s in leg2.steps] == list(range(11, 25))
    assert first_difference(run.by_step(), ref.by_step(), ACC_KEYS) is None
    final = compare_paths(run.out / "checkpoints" / "checkpoint_4", ref.out / "checkpoints" / "checkpoint_4")
    for group in ("model", "optimizer", "scheduler", "trainer_state"):
        assert final["groups"][group]["equal"], final["groups"][group]["first_difference"]
    # The resumed session builds its epoch's iterator after load_state() restored the RNG, and a DataLoader
    # iterator draws its base seed from it: the final RNG state is not the uninterrupted run's.
    assert final["differing_groups"] == ["rng"]


def test_accelerate_skip_first_batches_over_an_unseeded_shuffle_sees_another_order(
    accelerate_runs: dict[str, Run],
) -> None:
    run, ref = accelerate_runs["broken_unseeded_sampler"], accelerate_runs["unseeded_reference"]
    steps, ref_steps = run.by_step(), ref.by_step()
    assert (
        first_difference({k: steps[k] for k in range(1, 11)}, {k: ref_steps[k] for k in range(1, 11)}, ACC_KEYS) is None
    )
    step, key, _, _ = first_difference(steps, ref_steps, ACC_KEYS)
    assert (step, key) == (11, "loss") and steps[11]["samples"] != ref_steps[11]["samples"]


def test_accelerate_automatic_naming_refuses_the_resumed_sessions_first_save(accelerate_runs: dict[str, Run]) -> None:
    leg1, leg2 = accelerate_runs["broken_checkpoint_naming"].sessions
    assert leg1.error is None and leg1.stop is not None
    assert (
        isinstance(leg2.error, ValueError) and "checkpoint_0" in str(leg2.error) and "already exists" in str(leg2.error)
    )
    assert [s["step"] for s in leg2.steps] == [11, 12, 13, 14, 15]  # it died at its first save, step 15


def test_dcp_stop_and_resume_match_the_uninterrupted_run(dcp_runs: dict[str, Run]) -> None:
    run, ref = dcp_runs["default"], dcp_runs["reference"]
    leg1, leg2 = run.sessions
    assert leg1.rc == 0 and leg2.rc == 0, leg1.lines[-5:] + leg2.lines[-5:]
    assert leg1.stop == {"step": 10, "checkpoint": str(run.out / "ckpt" / "step-10"), "saved": True}
    assert first_difference(run.by_step(), ref.by_step(), DCP_KEYS) is None
    final = compare_paths(run.out / "ckpt" / "step-20", ref.out / "ckpt" / "step-20")
    assert final["error"] is None and final["equal"], final["first_difference"]
    assert set(final["groups"]) == {"model", "optimizer", "scheduler", "rng", "trainer_state"}


def test_dcp_killed_inside_a_save_resumes_from_the_previous_checkpoint(dcp_runs: dict[str, Run]) -> None:
    run, ref = dcp_runs["killed_in_save"], dcp_runs["reference"]
    leg1, leg2 = run.sessions
    assert leg1.rc == -9 and "DCP_SAVE_FINISH step=10" in leg1.lines
    assert run.after_first == {"latest": "step-5", "step-10 complete": False}  # killed inside the save of step 10
    assert leg2.rc == 0 and leg2.session["start_step"] == 5
    assert [s["step"] for s in leg2.steps] == list(range(6, 21))
    assert first_difference(run.by_step(), ref.by_step(), DCP_KEYS) is None


def test_dcp_pointer_moved_before_the_save_points_the_resume_at_a_torn_checkpoint(dcp_runs: dict[str, Run]) -> None:
    run = dcp_runs["broken_pointer_before_save"]
    leg1, leg2 = run.sessions
    assert leg1.rc == -9 and "DCP_SAVE_FINISH step=10" in leg1.lines
    assert run.after_first == {"latest": "step-10", "step-10 complete": False}
    assert leg2.rc != 0 and leg2.steps == []
    assert any(".metadata" in line for line in leg2.lines), leg2.lines[-5:]
    torn = compare_paths(run.out / "ckpt" / "step-10", dcp_runs["reference"].out / "ckpt" / "step-10")
    assert (
        torn["error"]
        == f"{run.out / 'ckpt' / 'step-10' / '.metadata'} is missing: the save did not complete (DCP writes it last)"
    )
