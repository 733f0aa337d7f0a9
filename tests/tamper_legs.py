"""Tampers of what the legs reported (their RUN_JSON, progress lines and step records): a stop one step late, a
resume from the wrong step, other losses, lrs or batches, a NaN loss, validation skipped or inconsistent, a peak
over the gate, a kill by something else. Each edits a saved bundle's evidence in place; tests/tampers.py pairs
each with the check it must fail.

Import as `from tamper_legs import ...` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from bundles import first_resume, run_json, val


def relog(doc: dict, leg: str) -> None:
    """The leg's progress lines say what its RUN_JSON losses now say (to 4 decimals, as the trainer
    prints them): a tamper that models a trainer that really trained other losses changes both."""
    losses = run_json(doc, leg)["losses"]
    for line in doc["steps"][leg]["harvest"]["progress"]:
        line["loss"] = round(losses[str(line["step"])], 4)


def leg1_one_step_late(d: dict) -> None:
    run_json(d, "leg1")["final_step"] = val(d, "stop1") + 1


def leg1_reported_horizon(d: dict) -> None:
    run_json(d, "leg1")["segment_stop"] = False


def leg2_resumed_one_push_early(d: dict) -> None:
    resumed = val(d, "stop1") - val(d, "push_every")
    run_json(d, "leg2").update(resumed_from_step=resumed, first_step=resumed + 1)


def leg2_fresh_start(d: dict) -> None:
    run_json(d, "leg2").update(resumed_from_step=None, first_step=1)


def leg2_first_loss_jumped(d: dict) -> None:
    # A resume onto the wrong weights: the first loss after the stop jumps 50 % above leg 1's last.
    first = str(val(d, "stop1") + 1)
    run_json(d, "leg2")["losses"][first] = run_json(d, "leg1")["final_loss"] * 1.5
    relog(d, "leg2")


def leg2_restarted_from_random_weights(d: dict) -> None:
    # A restart from scratch replays leg 1's curve from its first step after the stop.
    leg1_losses, leg2 = run_json(d, "leg1")["losses"], run_json(d, "leg2")
    stop1 = val(d, "stop1")
    for k in list(leg2["losses"]):
        replayed = leg1_losses.get(str(int(k) - stop1))
        if replayed is not None:
            leg2["losses"][k] = replayed
    leg2["final_loss"] = leg2["losses"][str(leg2["final_step"])]
    relog(d, "leg2")


def leg1_tokens_one_step_short(d: dict) -> None:
    run_json(d, "leg1")["tokens_consumed"] -= val(d, "tokens_per_step")


def leg2_tokens_one_step_short(d: dict) -> None:
    run_json(d, "leg2")["tokens_consumed"] -= val(d, "tokens_per_step")


def _other_geometry(d: dict) -> int:
    return 106194240 if val(d, "expect_params") != 106194240 else 119104


def leg1_wrong_geometry(d: dict) -> None:
    run_json(d, "leg1")["params"] = _other_geometry(d)


def leg2_wrong_geometry(d: dict) -> None:
    run_json(d, "leg2")["params"] = _other_geometry(d)


def leg1_grad_ckpt_on(d: dict) -> None:
    run_json(d, "leg1")["grad_ckpt"] = True


def leg1_validated(d: dict) -> None:
    run_json(d, "leg1").update(val_skipped=False, val_loss=4.9, val_ppl=math.exp(4.9))


def leg1_ppl_without_validation(d: dict) -> None:
    run_json(d, "leg1")["val_ppl"] = 134.3


def leg1_ended_on_a_spike(d: dict) -> None:
    # Leg 1's last step spikes above ln(vocab); leg 2 resumes on the spike and recovers.
    spike = val(d, "loss_ceiling") + 0.2
    leg1 = run_json(d, "leg1")
    leg1["final_loss"] = leg1["losses"][str(val(d, "stop1"))] = spike
    run_json(d, "leg2")["losses"][str(val(d, "stop1") + 1)] = spike * 0.98
    relog(d, "leg1")
    relog(d, "leg2")


def leg1_nan_as_the_trainer_writes_it(d: dict) -> None:
    # trainer/train.py writes strict JSON: a non-finite loss becomes null and is counted.
    leg1 = run_json(d, "leg1")
    leg1["final_loss"] = leg1["losses"][str(val(d, "stop1"))] = None
    leg1["nonfinite_losses"] = 1


def leg2_nan_literal(d: dict) -> None:
    # A bare JSON `NaN` (what json.dumps writes for a float nan): the engine reads it as a float.
    leg2 = run_json(d, "leg2")
    leg2["final_loss"] = leg2["losses"][str(val(d, "steps"))] = float("nan")


def leg2_nan_as_the_trainer_writes_it(d: dict) -> None:
    leg2 = run_json(d, "leg2")
    leg2["final_loss"] = leg2["losses"][str(val(d, "steps"))] = None
    leg2["nonfinite_losses"] = 1


def leg2_loss_barely_moved(d: dict) -> Mapping[str, str]:
    # Finite and below ln(vocab), but only 5 % under the loss at step 1.
    step1 = run_json(d, "leg1")["losses"]["1"]
    leg2 = run_json(d, "leg2")
    leg2["final_loss"] = leg2["losses"][str(val(d, "steps"))] = step1 * 0.95
    relog(d, "leg2")
    # Validation's loss, near the real training loss, may now sit far from the tampered one.
    far = abs(leg2["val_loss"] - leg2["final_loss"]) > leg2["final_loss"] * val(d, "val_loss_gap_max")
    return {"validation_loss_near_the_training_loss": "FAIL"} if far else {}


def leg2_stopped_one_step_early(d: dict) -> None:
    run_json(d, "leg2")["final_step"] = val(d, "steps") - 1


def leg2_reported_a_segment(d: dict) -> None:
    run_json(d, "leg2")["segment_stop"] = True


def leg2_validation_skipped(d: dict) -> None:
    run_json(d, "leg2").update(val_skipped=True, val_loss=None, val_ppl=None)


def leg2_validation_swallowed_an_error(d: dict) -> None:
    run_json(d, "leg2").update(val_loss=None, val_ppl=None, val_error="RuntimeError: shard val-00000.bin is truncated")


def arm_peak_gate(d: dict) -> None:
    # `engine check` takes values from the spec, re-applying the run's own --set: a run made with
    # `--set gate_peak=true` is how a saved local run gets the gate armed.
    d["values"]["gate_peak"] = True
    d["sources"]["gate_peak"] = "--set"


def soak_peak_over_gate_on_gpu(d: dict) -> None:
    # What a GPU soak reports (gate_peak is true off the local target): 13.7 GB reserved on the
    # worst rank of leg 1, over the 13.6 GB gate.
    arm_peak_gate(d)
    run_json(d, "leg1").update(
        peak_gpu_gb=12.4,
        peak_gpu_gb_max_rank=12.5,
        peak_reserved_gb_max_rank=13.7,
        peak_reserved_gb_by_rank=[13.7, 13.2],
    )


def leg1_collector_stalled(d: dict) -> None:
    # What an unfrozen heap costs after a compile: one full collection of ~1M objects, 0.62 s.
    run_json(d, "leg1").update(gc_full_collections=1, gc_full_s_total=0.62, gc_full_s_max=0.62)


def leg2_collector_stalled_just_at_the_gate(d: dict) -> None:
    # The gate is strict: a 0.1 s stop is already one too long; leg 1 stays clean.
    run_json(d, "leg2").update(gc_full_collections=3, gc_full_s_total=0.12, gc_full_s_max=0.1)


def killed_by_timeout(d: dict) -> None:
    # As the runner records it: a timed-out leg is a failed step (the verdict derives it anyway).
    d["steps"]["leg1"].update(terminated_by="timeout", timed_out=True, signals_sent=[], status="failed")


def killed_by_someone_else(d: dict) -> None:
    # rc -9 is an accepted exit code: an OOM kill before the push would pass without this check.
    d["steps"]["leg1"].update(terminated_by=None, signals_sent=[])


def leg1_ran_to_the_end(d: dict) -> None:
    leg1 = d["steps"]["leg1"]
    leg1["harvest"]["run_json"] = {"final_step": val(d, "steps"), "segment_stop": False}
    leg1["harvest_errors"] = []


def leg2_resumed_from_half_pushed(d: dict) -> None:
    kill = val(d, "kill_step")
    run_json(d, "leg2").update(resumed_from_step=kill, first_step=kill + 1)


def next_leg_lost_a_middle_step(d: dict) -> None:
    # One step after the resume never trained (its loss, lr and batch all absent): the step between
    # the resume and the horizon that the progress lines also show.
    resume = first_resume(d)
    run = run_json(d, resume["next"])
    step = next(line["step"] for line in d["steps"][resume["next"]]["harvest"]["progress"][1:])
    for per_step in ("losses", "lrs", "batches"):
        del run[per_step][str(step)]


def next_leg_also_reported(offset: int) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # The resumed leg reports a step at or before the resume point too (here `offset` steps before
        # it), only in its losses: the trainer trained it again, or the report mixes two runs.
        resume = first_resume(d)
        run_json(d, resume["next"])["losses"][str(resume["stop"] - offset)] = 5.0

    return apply


def next_leg_trained_the_stop_again(d: dict) -> None:
    # A resume from the checkpoint before the stop's trains the stop step again, with its lr and batch.
    resume = first_resume(d)
    before, after, stop = run_json(d, resume["leg"]), run_json(d, resume["next"]), str(resume["stop"])
    for per_step in ("losses", "lrs", "batches"):
        after[per_step] = {stop: before[per_step][stop], **after[per_step]}


def leg1_nan_mid_run(d: dict) -> None:
    # A NaN in the middle of leg 1, recovered from: the final loss is finite, only the count says it.
    leg1 = run_json(d, "leg1")
    leg1["losses"][str(val(d, "stop1") // 2)] = None
    leg1["nonfinite_losses"] = 1


def leg2_nan_mid_run(d: dict) -> None:
    leg2 = run_json(d, "leg2")
    first = leg2["first_step"]
    leg2["losses"][str((first + val(d, "steps")) // 2)] = None
    leg2["nonfinite_losses"] = 1


def leg1_nan_the_count_missed(value: float) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # A non-finite loss logged as a number (a bare NaN or Infinity in RUN_JSON) that the trainer's
        # own count did not see: only the losses themselves show it.
        run_json(d, "leg1")["losses"][str(val(d, "stop1") // 2)] = value
        assert run_json(d, "leg1")["nonfinite_losses"] == 0

    return apply


def leg2_nan_the_count_missed(d: dict) -> None:
    leg2 = run_json(d, "leg2")
    leg2["losses"][str((leg2["first_step"] + val(d, "steps")) // 2)] = float("nan")
    assert leg2["nonfinite_losses"] == 0


def leg_counted_a_nonfinite_loss(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # The trainer counted a non-finite loss that its logged losses do not show (one every step
        # is logged, so the two must agree).
        run_json(d, leg)["nonfinite_losses"] = 1

    return apply


def leg2_validation_gave_infinity(d: dict) -> None:
    # A diverged model's perplexity overflows: `val_ppl != null` held, a finite one does not.
    run_json(d, "leg2").update(val_loss=1000.0, val_ppl=math.inf)


def leg2_validation_gave_nan(d: dict) -> None:
    run_json(d, "leg2").update(val_loss=float("nan"), val_ppl=float("nan"))


def final_leg_lost_its_last_step(d: dict) -> None:
    run = run_json(d, val(d, "final_leg"))
    for per_step in ("losses", "lrs", "batches"):
        del run[per_step][str(val(d, "steps"))]


def leg1_progress_starts_after_step_one(d: dict) -> None:
    d["steps"]["leg1"]["harvest"]["progress"].pop(0)


def validation_over_fewer_tokens(tokens: int) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        run_json(d, val(d, "final_leg"))["val_tokens"] = tokens

    return apply


def final_val(d: dict, **fields: Any) -> None:
    run_json(d, val(d, "final_leg")).update(fields)


def ppl_is_not_exp_of_the_loss(d: dict) -> None:
    run = run_json(d, val(d, "final_leg"))
    run["val_ppl"] = math.exp(run["val_loss"]) * 1.01


def val_loss_far_from_training(d: dict) -> None:
    # A consistent pair (ppl = exp(loss)), but half the training loss at the horizon.
    run = run_json(d, val(d, "final_leg"))
    run["val_loss"] = run["final_loss"] * 0.5
    run["val_ppl"] = math.exp(run["val_loss"])


def validated_other_weights(d: dict) -> None:
    # The horizon leg's validation, self-consistent (ppl = exp(loss), near the training loss, every window),
    # of weights a little off the run's: another checkpoint, or the right one loaded wrong.
    run = run_json(d, val(d, "final_leg"))
    run["val_loss"] *= 1.001
    run["val_ppl"] = math.exp(run["val_loss"])


def final_loss_not_the_last_logged(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        run_json(d, leg)["final_loss"] = 1.0

    return apply


def run_json_contradicts_a_logged_line(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # RUN_JSON's loss at a step the progress lines show (not the leg's last) is another one.
        line = d["steps"][leg]["harvest"]["progress"][1]
        run_json(d, leg)["losses"][str(line["step"])] += 0.01

    return apply


def peak_max_below_a_rank(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        run_json(d, leg).update(
            peak_gpu_gb=11.0,
            peak_gpu_gb_max_rank=11.5,
            peak_reserved_gb_max_rank=12.0,
            peak_reserved_gb_by_rank=[12.0, 14.2],
        )

    return apply


def lr_missing_at_the_last_step(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        lrs = run_json(d, leg)["lrs"]
        del lrs[max(lrs, key=int)]

    return apply


def lrs_scaled(leg: str, factor: float) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # The leg ran at another peak lr (a resume that changed --lr): every lr off by the same factor.
        lrs = run_json(d, leg)["lrs"]
        for k in lrs:
            lrs[k] *= factor

    return apply


def lr_spike_after_warmup(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        lrs = run_json(d, leg)["lrs"]
        inner = sorted(lrs, key=int)[len(lrs) // 2]
        lrs[inner] *= 1.5

    return apply


def schedule_restarted_at_the_resume(d: dict) -> None:
    # The resumed leg's first step trains at warm-up's first lr, as a fresh scheduler would.
    resume = first_resume(d)
    lrs = run_json(d, resume["next"])["lrs"]
    lrs[str(resume["stop"] + 1)] = val(d, "lr") / val(d, "warmup_steps")


def batch_repeated_in_leg(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        batches = run_json(d, leg)["batches"]
        steps = sorted(batches, key=int)
        batches[steps[-1]] = batches[steps[0]]

    return apply


def leg1_logged_past_its_stop(d: dict) -> None:
    # Leg 1 trained (and reported) the step after its stop too.
    leg1, stop = run_json(d, "leg1"), val(d, "stop1")
    leg1["losses"][str(stop + 1)] = leg1["losses"][str(stop)]


def leg1_lost_its_last_step(d: dict) -> None:
    leg1 = run_json(d, "leg1")
    for per_step in ("losses", "lrs", "batches"):
        del leg1[per_step][str(val(d, "stop1"))]


def data_order_restarted_at_the_resume(d: dict) -> None:
    # Leg 2 trains leg 1's batches again from the start of the data stream.
    leg1, leg2 = run_json(d, "leg1")["batches"], run_json(d, "leg2")["batches"]
    first = sorted(leg1, key=int)
    for i, step in enumerate(sorted(leg2, key=int)):
        leg2[step] = leg1[first[i % len(first)]]


def killed_leg_skipped_a_logged_step(d: dict) -> None:
    progress = d["steps"]["leg1"]["harvest"]["progress"]
    d["steps"]["leg1"]["harvest"]["progress"] = [line for line in progress if line["step"] != 5]


def reference_resumed_itself(d: dict) -> None:
    # The run that never stopped stopped: it resumed from a checkpoint, as a leg does.
    run_json(d, "reference").update(resumed_from_step=val(d, "push_every"))


def reference_batch_differs(leg: str) -> Callable[[dict], None]:
    """The reference's batch at `leg`'s second step is another one (the digest of its next step): the leg
    trained tokens the run that never stopped did not train there, though every digest is still unique."""

    def apply(d: dict) -> None:
        steps = sorted(map(int, run_json(d, leg)["batches"]))
        reference = run_json(d, "reference")["batches"]
        reference[str(steps[1])] = reference[str(steps[1] + 1)]

    return apply


def reference_differs_at(series: str, leg: str) -> Callable[[dict], None]:
    """One step of `leg` (its second) differs from the reference's in the 7th digit: the leg trained a
    trajectory the run that never stopped did not (the reference's record is edited, so that nothing of the
    leg's own report moves)."""

    def apply(d: dict) -> None:
        step = sorted(map(int, run_json(d, leg)[series]))[1]
        run_json(d, "reference")[series][str(step)] *= 1 + 1e-6

    return apply
