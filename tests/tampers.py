"""Every check of the P4 specs, and the realistic ways its fact can be false: a tamper edits a copy of a saved
bundle's evidence so that exactly that fact is false (leg 1 stopped one step late, a checkpoint missing from the
store, a stale pointer, tokens off by one step, a NaN loss, 13.7 GB peak in a GPU soak, validation skipped on
leg 2, ...). tests/test_engine/test_every_check_can_fail.py runs each.

Import as `from tampers import ...` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import pytest
from bundles import SPECS, check_names, hub, run_json, val


def _drop_checkpoint(state: dict, step: int) -> bool:
    """The store lost ckpt/checkpoint-<step>/ (pruned too far): gone from the list and the listing, and
    from what the collector found under the pointer's target when it was that. Returns whether it was."""
    prefix = f"ckpt/checkpoint-{step}/"
    assert step in state["checkpoints"], (step, state["checkpoints"])
    state["checkpoints"] = [c for c in state["checkpoints"] if c != step]
    state["files"] = [f for f in state["files"] if not f.startswith(prefix)]
    state["sha256"] = {k: v for k, v in state["sha256"].items() if not k.startswith(prefix)}
    target = state["pointer"]["path_in_repo"] == prefix[:-1]
    if target:
        for key in ("pointer_target_sha256", "pointer_target_sha256_stored"):
            if key in state:
                state[key] = {n: None for n in state[key]}
    return target


def _torn_model_file(state: dict) -> None:
    """The bytes the pointer names changed after it was written (a torn or overwritten push):
    the store now holds another sha256 for the pointer's model.safetensors."""
    pointer = state["pointer"]
    bad = hashlib.sha256(b"torn write").hexdigest()
    assert pointer["files"]["model.safetensors"] != bad
    state["pointer_target_sha256"]["model.safetensors"] = bad
    state["sha256"][f"{pointer['path_in_repo']}/model.safetensors"] = bad
    if "pointer_target_sha256_stored" in state:  # p4_soak's collector read the bytes back too
        state["pointer_target_sha256_stored"]["model.safetensors"] = bad


def _lose_files(state: dict, directory: str, names: tuple[str, ...]) -> bool:
    """The store lost these files of `directory` (a prune gone too far, a bad commit): gone from the
    listing, and, when the directory is the pointer's target, missing from what the collector found
    there. Returns whether it was the pointer's target."""
    gone = {f"{directory}/{n}" for n in names}
    assert gone <= set(state["files"]), (gone, state["files"])
    state["files"] = [f for f in state["files"] if f not in gone]
    state["sha256"] = {k: v for k, v in state["sha256"].items() if k not in gone}
    target = state["pointer"]["path_in_repo"] == directory
    if target:
        for key in ("pointer_target_sha256", "pointer_target_sha256_stored"):
            if key in state:
                state[key].update({n: None for n in names if n in state[key]})
    return target


# Checks that read what the store holds under the pointer's target: they flip with it.
TARGET_READERS_AFTER_LEG1 = {
    "pointer_target_complete_after[leg=leg1]": "FAIL",
    "pointer_target_read_back_intact_after[leg=leg1]": "FAIL",
}


@dataclass(frozen=True)
class Tamper:
    """One realistic way the check's fact is false. `also`: checks that read the very same fact
    and therefore flip with it, with the outcome they must have (only those present in the spec
    under test are expected); `apply` may return more of them when that depends on the bundle
    (a damaged checkpoint directory that is, in one spec, the pointer's target)."""

    fact: str
    apply: Callable[[dict], Mapping[str, str] | None]
    also: Mapping[str, str] = field(default_factory=dict)


def leg1_one_step_late(d: dict) -> None:
    run_json(d, "leg1")["final_step"] = val(d, "stop1") + 1


def _leg1_reported_horizon(d: dict) -> None:
    run_json(d, "leg1")["segment_stop"] = False


def _leg1_checkpoint_missing(d: dict) -> Mapping[str, str]:
    # In the smoke the first push is also the stop: the pointer's target went with it.
    target = _drop_checkpoint(hub(d, "hub_after_leg1"), val(d, "push_every"))
    return {**TARGET_READERS_AFTER_LEG1, "checkpoints_complete_after[leg=leg1]": "FAIL"} if target else {}


def _leg1_pointer_stale(d: dict) -> None:
    # The pointer still names the push before the stop (0 = none yet, when stop1 == push_every).
    hub(d, "hub_after_leg1")["pointer"]["step"] = val(d, "stop1") - val(d, "push_every")


def _leg1_pointer_terminal(d: dict) -> None:
    hub(d, "hub_after_leg1")["pointer"]["terminal"] = True


def _leg2_resumed_one_push_early(d: dict) -> None:
    resumed = val(d, "stop1") - val(d, "push_every")
    run_json(d, "leg2").update(resumed_from_step=resumed, first_step=resumed + 1)


def _leg2_fresh_start(d: dict) -> None:
    run_json(d, "leg2").update(resumed_from_step=None, first_step=1)


def _leg2_first_loss_jumped(d: dict) -> None:
    # A resume onto the wrong weights: the first loss after the stop jumps 50 % above leg 1's last.
    first = str(val(d, "stop1") + 1)
    run_json(d, "leg2")["losses"][first] = run_json(d, "leg1")["final_loss"] * 1.5


def leg2_restarted_from_random_weights(d: dict) -> None:
    # A restart from scratch replays leg 1's curve from its first step after the stop.
    leg1_losses, leg2 = run_json(d, "leg1")["losses"], run_json(d, "leg2")
    stop1 = val(d, "stop1")
    for k in list(leg2["losses"]):
        replayed = leg1_losses.get(str(int(k) - stop1))
        if replayed is not None:
            leg2["losses"][k] = replayed


def _leg1_tokens_one_step_short(d: dict) -> None:
    run_json(d, "leg1")["tokens_consumed"] -= val(d, "tokens_per_step")


def _leg2_tokens_one_step_short(d: dict) -> None:
    run_json(d, "leg2")["tokens_consumed"] -= val(d, "tokens_per_step")


def _other_geometry(d: dict) -> int:
    return 106194240 if val(d, "expect_params") != 106194240 else 119104


def _leg1_wrong_geometry(d: dict) -> None:
    run_json(d, "leg1")["params"] = _other_geometry(d)


def _leg2_wrong_geometry(d: dict) -> None:
    run_json(d, "leg2")["params"] = _other_geometry(d)


def _leg1_grad_ckpt_on(d: dict) -> None:
    run_json(d, "leg1")["grad_ckpt"] = True


def _leg1_validated(d: dict) -> None:
    run_json(d, "leg1").update(val_skipped=False, val_loss=4.9, val_ppl=math.exp(4.9))


def _leg1_ppl_without_validation(d: dict) -> None:
    run_json(d, "leg1")["val_ppl"] = 134.3


def _leg1_ended_on_a_spike(d: dict) -> None:
    # Leg 1's last step spikes above ln(vocab); leg 2 resumes on the spike and recovers.
    spike = val(d, "loss_ceiling") + 0.2
    leg1 = run_json(d, "leg1")
    leg1["final_loss"] = leg1["losses"][str(val(d, "stop1"))] = spike
    run_json(d, "leg2")["losses"][str(val(d, "stop1") + 1)] = spike * 0.98


def _leg1_nan_as_the_trainer_writes_it(d: dict) -> None:
    # trainer/train.py writes strict JSON: a non-finite loss becomes null and is counted.
    leg1 = run_json(d, "leg1")
    leg1["final_loss"] = leg1["losses"][str(val(d, "stop1"))] = None
    leg1["nonfinite_losses"] = 1


def _leg2_nan_literal(d: dict) -> None:
    # A bare JSON `NaN` (what json.dumps writes for a float nan): the engine reads it as a float.
    leg2 = run_json(d, "leg2")
    leg2["final_loss"] = leg2["losses"][str(val(d, "steps"))] = float("nan")


def _leg2_nan_as_the_trainer_writes_it(d: dict) -> None:
    leg2 = run_json(d, "leg2")
    leg2["final_loss"] = leg2["losses"][str(val(d, "steps"))] = None
    leg2["nonfinite_losses"] = 1


def _leg2_loss_barely_moved(d: dict) -> None:
    # Finite and below ln(vocab), but only 5 % under the loss at step 1.
    step1 = run_json(d, "leg1")["losses"]["1"]
    leg2 = run_json(d, "leg2")
    leg2["final_loss"] = leg2["losses"][str(val(d, "steps"))] = step1 * 0.95


def _leg2_stopped_one_step_early(d: dict) -> None:
    run_json(d, "leg2")["final_step"] = val(d, "steps") - 1


def _leg2_reported_a_segment(d: dict) -> None:
    run_json(d, "leg2")["segment_stop"] = True


def _final_not_pushed(d: dict) -> None:
    state = hub(d, "hub_after_leg2")
    state["has_final"] = False
    state["files"] = [f for f in state["files"] if not f.startswith("final/")]
    state["sha256"] = {k: v for k, v in state["sha256"].items() if not k.startswith("final/")}


def _first_checkpoint_pruned(d: dict) -> None:
    _drop_checkpoint(hub(d, "hub_after_leg2"), val(d, "push_every"))


def _horizon_pointer_not_terminal(d: dict) -> None:
    hub(d, "hub_after_leg2")["pointer"]["terminal"] = False


def _horizon_pointer_stale(d: dict) -> None:
    hub(d, "hub_after_leg2")["pointer"]["step"] = val(d, "steps") - val(d, "push_every")


def _horizon_pointer_names_a_ckpt(d: dict) -> None:
    hub(d, "hub_after_leg2")["pointer"]["path_in_repo"] = f"ckpt/checkpoint-{val(d, 'steps')}"


def _horizon_target_torn(d: dict) -> None:
    _torn_model_file(hub(d, "hub_after_leg2"))


def _leg2_validation_skipped(d: dict) -> None:
    run_json(d, "leg2").update(val_skipped=True, val_loss=None, val_ppl=None)


def _leg2_validation_swallowed_an_error(d: dict) -> None:
    run_json(d, "leg2").update(val_loss=None, val_ppl=None, val_error="RuntimeError: shard val-00000.bin is truncated")


def arm_peak_gate(d: dict) -> None:
    # `engine check` takes values from the spec, re-applying the run's own --set: a run made with
    # `--set gate_peak=true` is how a saved local run gets the gate armed.
    d["values"]["gate_peak"] = True
    d["sources"]["gate_peak"] = "--set"


def _soak_peak_over_gate_on_gpu(d: dict) -> None:
    # What a GPU soak reports (gate_peak is true off the local target): 13.7 GB reserved on the
    # worst rank of leg 1, over the 13.6 GB gate.
    arm_peak_gate(d)
    run_json(d, "leg1").update(peak_gpu_gb=12.4, peak_gpu_gb_max_rank=12.5, peak_reserved_gb_max_rank=13.7)


def _leg1_collector_stalled(d: dict) -> None:
    # What an unfrozen heap costs after a compile: one full collection of ~1M objects, 0.62 s.
    run_json(d, "leg1").update(gc_full_collections=1, gc_full_s_total=0.62, gc_full_s_max=0.62)


def _leg2_collector_stalled_just_at_the_gate(d: dict) -> None:
    # The gate is strict: a 0.1 s stop is already one too long; leg 1 stays clean.
    run_json(d, "leg2").update(gc_full_collections=3, gc_full_s_total=0.12, gc_full_s_max=0.1)


def _killed_by_timeout(d: dict) -> None:
    # As the runner records it: a timed-out leg is a failed step (the verdict derives it anyway).
    d["steps"]["leg1"].update(terminated_by="timeout", timed_out=True, signals_sent=[], status="failed")


def _killed_by_someone_else(d: dict) -> None:
    # rc -9 is an accepted exit code: an OOM kill before the push would pass without this check.
    d["steps"]["leg1"].update(terminated_by=None, signals_sent=[])


def _leg1_ran_to_the_end(d: dict) -> None:
    leg1 = d["steps"]["leg1"]
    leg1["harvest"] = {"run_json": {"final_step": val(d, "steps"), "segment_stop": False}}
    leg1["harvest_errors"] = []


def _pointer_moved_before_verify(d: dict) -> None:
    # The push of kill_step committed and the pointer moved to it before the verify ran; the
    # collector re-read that target, so its hashes agree with the pointer: only the step (the
    # checkpoint the pointer names) gives it away.
    state = hub(d, "hub_after_leg1")
    kill = val(d, "kill_step")
    path = f"ckpt/checkpoint-{kill}"
    files = {name: hashlib.sha256(f"{path}/{name}".encode()).hexdigest() for name in state["pointer"]["files"]}
    if kill not in state["checkpoints"]:
        state["checkpoints"] = sorted(state["checkpoints"] + [kill])
        state["files"] = sorted(state["files"] + [f"{path}/{n}" for n in files])
        state["sha256"].update({f"{path}/{n}": h for n, h in files.items()})
    files = {n: state["sha256"][f"{path}/{n}"] for n in files}
    state["pointer"].update(step=kill, path_in_repo=path, files=files)
    state["pointer_target_sha256"] = dict(files)


def _kill_tore_the_pointer_target(d: dict) -> None:
    _torn_model_file(hub(d, "hub_after_leg1"))


def _leg2_resumed_from_half_pushed(d: dict) -> None:
    kill = val(d, "kill_step")
    run_json(d, "leg2").update(resumed_from_step=kill, first_step=kill + 1)


def _leg2_lost_a_step(d: dict) -> None:
    del run_json(d, "leg2")["losses"][str(val(d, "kill_step"))]


def _leg2_repeated_a_step(d: dict) -> None:
    # Resumed one push early but reported the right resume point: step last_verified is trained again.
    run_json(d, "leg2")["losses"][str(val(d, "last_verified_step"))] = 5.0


def _leg1_nan_mid_run(d: dict) -> None:
    # A NaN in the middle of leg 1, recovered from: the final loss is finite, only the count says it.
    leg1 = run_json(d, "leg1")
    leg1["losses"][str(val(d, "stop1") // 2)] = None
    leg1["nonfinite_losses"] = 1


def _leg2_nan_mid_run(d: dict) -> None:
    leg2 = run_json(d, "leg2")
    first = leg2["first_step"]
    leg2["losses"][str((first + val(d, "steps")) // 2)] = None
    leg2["nonfinite_losses"] = 1


def _leg1_pointer_names_no_weights(d: dict) -> None:
    # A pointer written from a partial file list: the weights are not among the files it names, so
    # the collector (which looks up what the pointer names) has no hash for them either.
    state = hub(d, "hub_after_leg1")
    del state["pointer"]["files"]["model.safetensors"]
    for key in ("pointer_target_sha256", "pointer_target_sha256_stored"):
        state.get(key, {}).pop("model.safetensors", None)


def _leg1_target_lost_its_weights(d: dict) -> Mapping[str, str]:
    state = hub(d, "hub_after_leg1")
    _lose_files(state, state["pointer"]["path_in_repo"], ("model.safetensors",))
    return {"checkpoints_complete_after[leg=leg1]": "FAIL", "pointer_target_read_back_intact_after[leg=leg1]": "FAIL"}


def _leg1_oldest_checkpoint_kept_only_its_state(d: dict) -> Mapping[str, str]:
    # Pruning that went too far: the oldest checkpoint lists, but holds only trainer_state.json.
    state = hub(d, "hub_after_leg1")
    oldest = f"ckpt/checkpoint-{min(state['checkpoints'])}"
    names = tuple(
        n for n in ("model.safetensors", "config.json", "optimizer.pt", "rng.pt") if f"{oldest}/{n}" in state["files"]
    )
    return TARGET_READERS_AFTER_LEG1 if _lose_files(state, oldest, names) else {}


def _leg1_newest_checkpoint_lost_optimizer_state(d: dict) -> Mapping[str, str]:
    state = hub(d, "hub_after_leg1")
    newest = f"ckpt/checkpoint-{max(state['checkpoints'])}"
    return TARGET_READERS_AFTER_LEG1 if _lose_files(state, newest, ("optimizer.pt", "rng.pt")) else {}


def _horizon_first_checkpoint_kept_only_its_state(d: dict) -> None:
    _lose_files(
        hub(d, "hub_after_leg2"), f"ckpt/checkpoint-{val(d, 'push_every')}", ("model.safetensors", "config.json")
    )


def _horizon_newest_checkpoint_lost_optimizer_state(d: dict) -> None:
    # The pointer names final/ at the horizon: the newest ckpt/ directory must keep its state anyway.
    _lose_files(hub(d, "hub_after_leg2"), f"ckpt/checkpoint-{val(d, 'steps')}", ("optimizer.pt", "rng.pt"))


def _final_lost_its_rng_state(d: dict) -> None:
    assert _lose_files(hub(d, "hub_after_leg2"), "final", ("rng.pt",))


def _leg1_nan_the_count_missed(value: float) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # A non-finite loss logged as a number (a bare NaN or Infinity in RUN_JSON) that the trainer's
        # own count did not see: only the losses themselves show it.
        run_json(d, "leg1")["losses"][str(val(d, "stop1") // 2)] = value
        assert run_json(d, "leg1")["nonfinite_losses"] == 0

    return apply


def _leg2_nan_the_count_missed(d: dict) -> None:
    leg2 = run_json(d, "leg2")
    leg2["losses"][str((leg2["first_step"] + val(d, "steps")) // 2)] = float("nan")
    assert leg2["nonfinite_losses"] == 0


def _leg_counted_a_nonfinite_loss(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # The trainer counted a non-finite loss that its logged losses do not show (one every step
        # is logged, so the two must agree).
        run_json(d, leg)["nonfinite_losses"] = 1

    return apply


def _leg2_validation_gave_infinity(d: dict) -> None:
    # A diverged model's perplexity overflows: `val_ppl != null` held, a finite one does not.
    run_json(d, "leg2").update(val_loss=1000.0, val_ppl=math.inf)


def _leg2_validation_gave_nan(d: dict) -> None:
    run_json(d, "leg2").update(val_loss=float("nan"), val_ppl=float("nan"))


def _horizon_pointer_names_no_weights(d: dict) -> None:
    state = hub(d, "hub_after_leg2")
    del state["pointer"]["files"]["model.safetensors"]
    for key in ("pointer_target_sha256", "pointer_target_sha256_stored"):
        state.get(key, {}).pop("model.safetensors", None)


def _horizon_target_lost_its_weights(d: dict) -> None:
    assert _lose_files(hub(d, "hub_after_leg2"), "final", ("model.safetensors",))


def _stored_object_damaged_after_upload(state_name: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # The bytes under the pointer's target changed after the upload: the listing still gives the
        # hash recorded then, only reading the bytes back shows it.
        state = hub(d, state_name)
        state["pointer_target_sha256_stored"]["model.safetensors"] = hashlib.sha256(b"bit rot").hexdigest()

    return apply


LEG2_LOSS_READERS = {"loss_at_horizon_below_step_one": "FAIL"}
READ_BACK_LEG1 = {"pointer_target_read_back_intact_after[leg=leg1]": "FAIL"}
READ_BACK_LEG2 = {"pointer_target_read_back_intact_after[leg=leg2]": "FAIL"}


# The horizon's pointer target compared with the listing.
def _nonfinite_counted(leg: str, nan_mid_run: Callable[[dict], None]) -> tuple[Tamper, ...]:
    """The trainer's count of non-finite losses in `leg`: counted alone, or with the NaN in the middle of the
    leg it counted (the final loss finite), which the every-loss check reads too."""
    number = leg[-1]
    return (
        Tamper(f"the trainer counted a non-finite loss in leg {number}", _leg_counted_a_nonfinite_loss(leg)),
        Tamper(
            f"a NaN in the middle of leg {number}, recovered from (final loss finite)",
            nan_mid_run,
            also={f"every_logged_loss_finite[leg={leg}]": "FAIL"},
        ),
    )


HORIZON_TARGET = {"pointer_target_complete_after[leg=leg2]": "FAIL"}

TAMPERS: dict[str, tuple[Tamper, ...]] = {
    # ---- p4_common (all three specs)
    "final_leg_reached_the_horizon": (
        Tamper("leg 2 stopped one step before the horizon", _leg2_stopped_one_step_early),
    ),
    "final_leg_was_not_a_segment": (Tamper("leg 2 reported a segment boundary", _leg2_reported_a_segment),),
    "final_pushed": (
        # The pointer still names final/: the retention check finds its target's files gone too.
        Tamper(
            "final/ never reached the store", _final_not_pushed, also={"checkpoints_complete_after[leg=leg2]": "FAIL"}
        ),
    ),
    "all_steps_present": (Tamper("the first push interval was pruned from ckpt/", _first_checkpoint_pruned),),
    "pointer_terminal_at_horizon": (
        Tamper("the horizon pointer is not terminal", _horizon_pointer_not_terminal),
        Tamper("the horizon pointer is one push stale", _horizon_pointer_stale),
        Tamper("the horizon pointer names ckpt/ instead of final/", _horizon_pointer_names_a_ckpt),
    ),
    "pointer_target_complete_after[leg=leg1]": (
        Tamper(
            "the kill left other bytes under the pointer's target", _kill_tore_the_pointer_target, also=READ_BACK_LEG1
        ),
        Tamper("the pointer after leg 1 does not name the weights", _leg1_pointer_names_no_weights),
        Tamper("the pointer's target after leg 1 lost its weights", _leg1_target_lost_its_weights),
    ),
    "pointer_target_complete_after[leg=leg2]": (
        Tamper("the store holds other bytes than the pointer recorded", _horizon_target_torn, also=READ_BACK_LEG2),
        Tamper("the horizon pointer does not name the weights", _horizon_pointer_names_no_weights),
        Tamper(
            "final/ lost its weights",
            _horizon_target_lost_its_weights,
            also={**HORIZON_TARGET, **READ_BACK_LEG2, "checkpoints_complete_after[leg=leg2]": "FAIL"},
        ),
    ),
    # leg 1's only in p4_soak (the smoke and the preempt read back after the final leg alone)
    "pointer_target_read_back_intact_after[leg=leg1]": (
        Tamper(
            "an object under leg 1's pointer target was damaged after its upload",
            _stored_object_damaged_after_upload("hub_after_leg1"),
        ),
    ),
    "pointer_target_read_back_intact_after[leg=leg2]": (
        Tamper(
            "an object under the horizon pointer's target was damaged after its upload",
            _stored_object_damaged_after_upload("hub_after_leg2"),
        ),
    ),
    "checkpoints_complete_after[leg=leg1]": (
        Tamper(
            "the oldest checkpoint after leg 1 kept only its trainer state", _leg1_oldest_checkpoint_kept_only_its_state
        ),
        Tamper(
            "the newest checkpoint after leg 1 lost optimizer.pt and rng.pt",
            _leg1_newest_checkpoint_lost_optimizer_state,
        ),
    ),
    "checkpoints_complete_after[leg=leg2]": (
        Tamper("the first checkpoint kept only its trainer state", _horizon_first_checkpoint_kept_only_its_state),
        Tamper(
            "the newest ckpt/ directory lost optimizer.pt and rng.pt (the pointer names final/)",
            _horizon_newest_checkpoint_lost_optimizer_state,
        ),
        Tamper("final/ lost rng.pt", _final_lost_its_rng_state, also={**HORIZON_TARGET, **READ_BACK_LEG2}),
    ),
    "params_are_the_expected_model": (Tamper("leg 2 trained another geometry", _leg2_wrong_geometry),),
    "final_leg_validation_actually_ran": (
        Tamper("validation skipped on leg 2", _leg2_validation_skipped),
        Tamper("validation swallowed an error on leg 2", _leg2_validation_swallowed_an_error),
        Tamper("validation gave an infinite perplexity", _leg2_validation_gave_infinity),
        Tamper("validation gave a NaN perplexity", _leg2_validation_gave_nan),
    ),
    "horizon_tokens_match_the_arithmetic": (
        Tamper("leg 2 consumed one step's tokens too few", _leg2_tokens_one_step_short),
    ),
    # p4_segment's loss check reads leg 2's final loss too; the count flips with a null loss.
    "final_loss_finite_and_below_ceiling": (
        Tamper(
            "leg 2 ended on a NaN loss (JSON NaN)",
            _leg2_nan_literal,
            also={**LEG2_LOSS_READERS, "every_logged_loss_finite[leg=leg2]": "FAIL"},
        ),
        Tamper(
            "leg 2 ended on a non-finite loss (null, as the trainer writes it)",
            _leg2_nan_as_the_trainer_writes_it,
            also={
                **LEG2_LOSS_READERS,
                "no_nonfinite_loss[leg=leg2]": "FAIL",
                "every_logged_loss_finite[leg=leg2]": "FAIL",
            },
        ),
    ),
    "no_nonfinite_loss[leg=leg1]": _nonfinite_counted("leg1", _leg1_nan_mid_run),
    "no_nonfinite_loss[leg=leg2]": _nonfinite_counted("leg2", _leg2_nan_mid_run),
    "every_logged_loss_finite[leg=leg1]": (
        Tamper("a NaN in the middle of leg 1 that the count missed", _leg1_nan_the_count_missed(float("nan"))),
        Tamper("an infinite loss in the middle of leg 1 that the count missed", _leg1_nan_the_count_missed(math.inf)),
    ),
    "every_logged_loss_finite[leg=leg2]": (
        Tamper("a NaN in the middle of leg 2 that the count missed", _leg2_nan_the_count_missed),
    ),
    # ---- p4_segment (p4_smoke, p4_soak): the checks of every stop, here the one stop after leg 1
    "stopped_at_the_stop_step[leg=leg1]": (Tamper("leg 1 stopped one step late", leg1_one_step_late),),
    "reported_a_segment[leg=leg1]": (Tamper("leg 1 reported the horizon, not a segment", _leg1_reported_horizon),),
    "pushed_every_interval[leg=leg1]": (
        Tamper("checkpoint push_every is missing after leg 1", _leg1_checkpoint_missing),
    ),
    "pointer_at_the_stop[leg=leg1]": (
        Tamper("the pointer after leg 1 is stale", _leg1_pointer_stale),
        Tamper("the pointer after leg 1 is terminal", _leg1_pointer_terminal),
    ),
    "next_leg_resumed_from_exactly_the_stop[leg=leg1]": (
        Tamper("leg 2 resumed one push before the stop", _leg2_resumed_one_push_early),
        Tamper("leg 2 started fresh", _leg2_fresh_start),
    ),
    "next_leg_continues_the_trajectory[leg=leg1]": (
        Tamper("leg 2's first loss jumped 50 % above leg 1's last", _leg2_first_loss_jumped),
    ),
    "tokens_at_the_stop_match_the_arithmetic[leg=leg1]": (
        Tamper("leg 1 consumed one step's tokens too few", _leg1_tokens_one_step_short),
    ),
    "params_are_the_frozen_model": (Tamper("leg 1 trained another geometry", _leg1_wrong_geometry),),
    "checkpointing_really_off": (Tamper("leg 1 ran with gradient checkpointing", _leg1_grad_ckpt_on),),
    "skipped_validation_by_design[leg=leg1]": (
        Tamper("leg 1 ran validation", _leg1_validated),
        Tamper("leg 1 reports a perplexity although it skipped validation", _leg1_ppl_without_validation),
    ),
    "loss_finite_and_below_ceiling_at_the_stop[leg=leg1]": (
        Tamper("leg 1 ended on a loss spike above ln(vocab)", _leg1_ended_on_a_spike),
        # The trajectory check compares leg 2's first loss with leg 1's final loss: it cannot
        # hold when that loss is not a number, and says so by failing (is_finite guard).
        Tamper(
            "leg 1 ended on a non-finite loss (null, as the trainer writes it)",
            _leg1_nan_as_the_trainer_writes_it,
            also={
                "next_leg_continues_the_trajectory[leg=leg1]": "FAIL",
                "no_nonfinite_loss[leg=leg1]": "FAIL",
                "every_logged_loss_finite[leg=leg1]": "FAIL",
            },
        ),
    ),
    "loss_at_horizon_below_step_one": (
        Tamper("leg 2's loss at the horizon is only 5 % below step 1's", _leg2_loss_barely_moved),
    ),
    # ---- p4_soak
    "peak_memory_during_training_below_gate": (
        Tamper("a GPU soak peaked at 13.7 GB reserved on leg 1", _soak_peak_over_gate_on_gpu),
    ),
    "collector_never_stalled_a_step[leg=leg1]": (
        Tamper("a full garbage collection stopped leg 1 for 0.62 s", _leg1_collector_stalled),
    ),
    "collector_never_stalled_a_step[leg=leg2]": (
        Tamper("leg 2's longest full collection took exactly the 0.1 s gate", _leg2_collector_stalled_just_at_the_gate),
    ),
    # ---- p4_preempt
    "leg1_was_killed_mid_push": (
        Tamper("leg 1 was killed by its timeout", _killed_by_timeout),
        Tamper("leg 1 was SIGKILLed by something else (rc -9, no signal rule fired)", _killed_by_someone_else),
    ),
    "leg1_left_no_run_json": (
        Tamper("leg 1 printed a RUN_JSON: the kill came after the run ended", _leg1_ran_to_the_end),
    ),
    "pointer_never_named_the_unfinished_checkpoint": (
        Tamper("the pointer names the checkpoint whose push was killed", _pointer_moved_before_verify),
    ),
    "leg2_resumed_from_last_verified": (
        Tamper("leg 2 resumed from the half-pushed checkpoint", _leg2_resumed_from_half_pushed),
        Tamper("leg 2 started fresh", _leg2_fresh_start),
    ),
    "nothing_was_lost": (
        Tamper("leg 2 has no loss for one step", _leg2_lost_a_step),
        Tamper("leg 2 trained the last verified step again", _leg2_repeated_a_step),
    ),
}


def cases() -> list:
    cases = []
    for stem in SPECS:
        for name in check_names(stem):
            for i in range(len(TAMPERS.get(name, ()))):
                cases.append(pytest.param(stem, name, i, id=f"{stem}-{name}-{i}"))
    return cases
