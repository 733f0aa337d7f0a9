"""Every check of the P4 specs, and the realistic ways its fact can be false: a tamper edits a copy of a saved
bundle's evidence so that exactly that fact is false (leg 1 stopped one step late, a checkpoint missing from the
store, a stale pointer, tokens off by one step, a NaN loss, 13.7 GB peak in a GPU soak, validation skipped on
leg 2, each step's lr off the schedule, a batch trained twice, final/ published at a stop, ...).
tests/test_engine/test_every_check_can_fail.py runs each. The tampers themselves are in tests/tamper_legs.py
(what the legs reported) and tests/tamper_store.py (what the store holds).

Import as `from tampers import ...` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import pytest
from bundles import SPECS, check_names
from tamper_legs import (
    batch_repeated_in_leg,
    data_order_restarted_at_the_resume,
    final_leg_lost_its_last_step,
    final_loss_not_the_last_logged,
    final_val,
    killed_by_someone_else,
    killed_by_timeout,
    killed_leg_skipped_a_logged_step,
    leg1_collector_stalled,
    leg1_ended_on_a_spike,
    leg1_grad_ckpt_on,
    leg1_logged_past_its_stop,
    leg1_lost_its_last_step,
    leg1_nan_as_the_trainer_writes_it,
    leg1_nan_mid_run,
    leg1_nan_the_count_missed,
    leg1_one_step_late,
    leg1_ppl_without_validation,
    leg1_progress_starts_after_step_one,
    leg1_ran_to_the_end,
    leg1_reported_horizon,
    leg1_tokens_one_step_short,
    leg1_validated,
    leg1_wrong_geometry,
    leg2_collector_stalled_just_at_the_gate,
    leg2_first_loss_jumped,
    leg2_fresh_start,
    leg2_loss_barely_moved,
    leg2_nan_as_the_trainer_writes_it,
    leg2_nan_literal,
    leg2_nan_mid_run,
    leg2_nan_the_count_missed,
    leg2_reported_a_segment,
    leg2_resumed_from_half_pushed,
    leg2_resumed_one_push_early,
    leg2_stopped_one_step_early,
    leg2_tokens_one_step_short,
    leg2_validation_gave_infinity,
    leg2_validation_gave_nan,
    leg2_validation_skipped,
    leg2_validation_swallowed_an_error,
    leg2_wrong_geometry,
    leg_counted_a_nonfinite_loss,
    lr_missing_at_the_last_step,
    lr_spike_after_warmup,
    lrs_scaled,
    next_leg_also_reported,
    next_leg_lost_a_middle_step,
    peak_max_below_a_rank,
    ppl_is_not_exp_of_the_loss,
    reference_batch_differs,
    reference_differs_at,
    reference_resumed_itself,
    run_json_contradicts_a_logged_line,
    schedule_restarted_at_the_resume,
    soak_peak_over_gate_on_gpu,
    val_loss_far_from_training,
    validated_other_weights,
    validation_over_fewer_tokens,
)
from tamper_store import (
    final_listed_at_the_stop,
    final_lost_its_rng_state,
    final_not_pushed,
    final_published_at_the_stop,
    first_checkpoint_pruned,
    horizon_checkpoint_missing_for_the_comparison,
    horizon_first_checkpoint_kept_only_its_state,
    horizon_newest_checkpoint_lost_optimizer_state,
    horizon_pointer_names_a_ckpt,
    horizon_pointer_names_no_weights,
    horizon_pointer_not_terminal,
    horizon_pointer_stale,
    horizon_rng_not_the_references,
    horizon_target_lost_its_weights,
    horizon_target_torn,
    horizon_weights_compared_are_not_the_stored,
    horizon_weights_hold_another_count,
    kill_tore_the_pointer_target,
    leg1_checkpoint_missing,
    leg1_newest_checkpoint_lost_optimizer_state,
    leg1_oldest_checkpoint_kept_only_its_state,
    leg1_pointer_names_an_older_complete_checkpoint,
    leg1_pointer_names_no_weights,
    leg1_pointer_stale,
    leg1_pointer_terminal,
    leg1_target_lost_its_weights,
    optimizer_state_left_behind,
    pointer_moved_before_verify,
    pointer_step_right_path_of_the_killed_push,
    stored_object_damaged_after_upload,
)


@dataclass(frozen=True)
class Tamper:
    """One realistic way the check's fact is false. `also`: checks that read the very same fact
    and therefore flip with it, with the outcome they must have (only those present in the spec
    under test are expected); `apply` may return more of them when that depends on the bundle
    (a damaged checkpoint directory that is, in one spec, the pointer's target)."""

    fact: str
    apply: Callable[[dict], Mapping[str, str] | None]
    also: Mapping[str, str] = field(default_factory=dict)


LEG2_LOSS_READERS = {"loss_at_horizon_below_step_one": "FAIL"}
# Each leg's summary figures and its logged lines, read against its per-step losses.
SUMMARY_LEG1 = {"summary_agrees_with_the_logged_losses[leg=leg1]": "FAIL"}
SUMMARY_LEG2 = {"summary_agrees_with_the_logged_losses[leg=leg2]": "FAIL"}
LINES_LEG1 = {"logged_lines_agree_with_run_json[leg=leg1]": "FAIL"}
LINES_LEG2 = {"logged_lines_agree_with_run_json[leg=leg2]": "FAIL"}
SERIES_LEG1 = {"every_logged_step_has_its_lr_and_batch[leg=leg1]": "FAIL"}
SERIES_LEG2 = {"every_logged_step_has_its_lr_and_batch[leg=leg2]": "FAIL"}
VAL_NEAR = {"validation_loss_near_the_training_loss": "FAIL"}
PPL = {"perplexity_is_exp_of_the_validation_loss": "FAIL"}
READ_BACK_LEG1 = {"pointer_target_read_back_intact_after[leg=leg1]": "FAIL"}
READ_BACK_LEG2 = {"pointer_target_read_back_intact_after[leg=leg2]": "FAIL"}
# A leg's series against the run that never stopped: a leg that reported other losses or lrs leaves it.
REF_LOSSES_LEG1 = {"losses_match_the_reference[leg=leg1]": "FAIL"}
REF_LOSSES_LEG2 = {"losses_match_the_reference[leg=leg2]": "FAIL"}
REF_LRS_LEG1 = {"lrs_match_the_reference[leg=leg1]": "FAIL"}
REF_LRS_LEG2 = {"lrs_match_the_reference[leg=leg2]": "FAIL"}
REF_BATCHES_LEG2 = {"batches_match_the_reference[leg=leg2]": "FAIL"}
# The horizon's validation against the reference's: a figure of the leg's own moved leaves it.
VAL_REF = {"validation_matches_the_reference": "FAIL"}
# The horizon's pointer target compared with the listing.
HORIZON_TARGET = {"pointer_target_complete_after[leg=leg2]": "FAIL"}
# The horizon's stored bytes read back against the files compared with the reference.
STORED_COMPARED = {"final_checkpoint_compared_is_the_one_stored": "FAIL"}
# A resume from no checkpoint at all, which the resume checks of a stop and of a kill each must see.
LEG2_STARTED_FRESH = Tamper("leg 2 started fresh", leg2_fresh_start, also=SUMMARY_LEG2)


def _nonfinite_counted(leg: str, nan_mid_run: Callable[[dict], None]) -> tuple[Tamper, ...]:
    """The trainer's count of non-finite losses in `leg`: counted alone, or with the NaN in the middle of the
    leg it counted (the final loss finite), which the every-loss check and the logged lines read too."""
    number = leg[-1]
    return (
        Tamper(f"the trainer counted a non-finite loss in leg {number}", leg_counted_a_nonfinite_loss(leg)),
        Tamper(
            f"a NaN in the middle of leg {number}, recovered from (final loss finite)",
            nan_mid_run,
            also={
                f"logged_lines_agree_with_run_json[leg={leg}]": "FAIL",
                f"every_logged_loss_finite[leg={leg}]": "FAIL",
                f"losses_match_the_reference[leg={leg}]": "FAIL",
            },
        ),
    )


def _own_series(leg: str) -> dict[str, tuple[Tamper, ...]]:
    """The checks each leg has of its own logged series (its lines, its ranks' peaks, each step's lr and batch,
    its losses and lrs against the reference's), each with the way that leg's fact is made false."""
    number = leg[-1]
    return {
        f"logged_lines_agree_with_run_json[leg={leg}]": (
            Tamper(
                f"leg {number}'s RUN_JSON contradicts a logged line",
                run_json_contradicts_a_logged_line(leg),
                also={f"losses_match_the_reference[leg={leg}]": "FAIL"},
            ),
        ),
        f"peak_memory_figures_agree_with_the_ranks[leg={leg}]": (
            Tamper(f"leg {number}'s ranks peaked at [12.0, 14.2] under a max of 12.0", peak_max_below_a_rank(leg)),
        ),
        f"every_logged_step_has_its_lr_and_batch[leg={leg}]": (
            Tamper(f"leg {number}'s last step has no lr", lr_missing_at_the_last_step(leg)),
        ),
        f"no_batch_trained_twice_in_a_leg[leg={leg}]": (
            Tamper(
                f"leg {number}'s last step trained its first step's batch",
                batch_repeated_in_leg(leg),
                also={f"batches_match_the_reference[leg={leg}]": "FAIL"},
            ),
        ),
        f"losses_match_the_reference[leg={leg}]": (
            Tamper(
                f"leg {number}'s second loss leaves the reference's in the 7th digit",
                reference_differs_at("losses", leg),
            ),
        ),
        f"lrs_match_the_reference[leg={leg}]": (
            Tamper(
                f"leg {number}'s second lr leaves the reference's in the 7th digit", reference_differs_at("lrs", leg)
            ),
        ),
        f"batches_match_the_reference[leg={leg}]": (
            Tamper(f"the reference trained other tokens at leg {number}'s second step", reference_batch_differs(leg)),
        ),
    }


TAMPERS: dict[str, tuple[Tamper, ...]] = {
    # ---- p4_common (all three specs)
    "final_leg_reached_the_horizon": (
        Tamper("leg 2 stopped one step before the horizon", leg2_stopped_one_step_early, also=SUMMARY_LEG2),
    ),
    "final_leg_was_not_a_segment": (Tamper("leg 2 reported a segment boundary", leg2_reported_a_segment),),
    "final_pushed": (
        # The pointer still names final/: the retention check finds its target's files gone too.
        Tamper(
            "final/ never reached the store", final_not_pushed, also={"checkpoints_complete_after[leg=leg2]": "FAIL"}
        ),
    ),
    "all_steps_present": (Tamper("the first push interval was pruned from ckpt/", first_checkpoint_pruned),),
    "pointer_terminal_at_horizon": (
        Tamper("the horizon pointer is not terminal", horizon_pointer_not_terminal),
        Tamper("the horizon pointer is one push stale", horizon_pointer_stale),
        Tamper("the horizon pointer names ckpt/ instead of final/", horizon_pointer_names_a_ckpt),
    ),
    "pointer_target_complete_after[leg=leg1]": (
        Tamper(
            "the kill left other bytes under the pointer's target", kill_tore_the_pointer_target, also=READ_BACK_LEG1
        ),
        Tamper("the pointer after leg 1 does not name the weights", leg1_pointer_names_no_weights),
        Tamper("the pointer's target after leg 1 lost its weights", leg1_target_lost_its_weights),
    ),
    "pointer_target_complete_after[leg=leg2]": (
        Tamper(
            "the store holds other bytes than the pointer recorded",
            horizon_target_torn,
            also={**READ_BACK_LEG2, **STORED_COMPARED},
        ),
        Tamper("the horizon pointer does not name the weights", horizon_pointer_names_no_weights),
        Tamper(
            "final/ lost its weights",
            horizon_target_lost_its_weights,
            also={
                **HORIZON_TARGET,
                **READ_BACK_LEG2,
                **STORED_COMPARED,
                "checkpoints_complete_after[leg=leg2]": "FAIL",
            },
        ),
    ),
    # leg 1's only in p4_soak (the smoke and the preempt read back after the final leg alone)
    "pointer_target_read_back_intact_after[leg=leg1]": (
        Tamper(
            "an object under leg 1's pointer target was damaged after its upload",
            stored_object_damaged_after_upload("hub_after_leg1"),
        ),
    ),
    "pointer_target_read_back_intact_after[leg=leg2]": (
        Tamper(
            "an object under the horizon pointer's target was damaged after its upload",
            stored_object_damaged_after_upload("hub_after_leg2"),
            also=STORED_COMPARED,
        ),
    ),
    "checkpoints_complete_after[leg=leg1]": (
        Tamper(
            "the oldest checkpoint after leg 1 kept only its trainer state", leg1_oldest_checkpoint_kept_only_its_state
        ),
        Tamper(
            "the newest checkpoint after leg 1 lost optimizer.pt and rng.pt",
            leg1_newest_checkpoint_lost_optimizer_state,
        ),
    ),
    "checkpoints_complete_after[leg=leg2]": (
        Tamper("the first checkpoint kept only its trainer state", horizon_first_checkpoint_kept_only_its_state),
        Tamper(
            "the newest ckpt/ directory lost optimizer.pt and rng.pt (the pointer names final/)",
            horizon_newest_checkpoint_lost_optimizer_state,
        ),
        Tamper(
            "final/ lost rng.pt", final_lost_its_rng_state, also={**HORIZON_TARGET, **READ_BACK_LEG2, **STORED_COMPARED}
        ),
    ),
    "old_optimizer_states_pruned_after[leg=leg1]": (
        Tamper(
            "an older checkpoint kept its optimizer state after leg 1", optimizer_state_left_behind("hub_after_leg1")
        ),
    ),
    "old_optimizer_states_pruned_after[leg=leg2]": (
        Tamper("the prune at the horizon failed", optimizer_state_left_behind("hub_after_leg2")),
    ),
    "params_are_the_expected_model": (Tamper("leg 2 trained another geometry", leg2_wrong_geometry),),
    "stored_weights_hold_the_expected_params": (
        Tamper("the horizon checkpoint holds more numbers than the count reported", horizon_weights_hold_another_count),
    ),
    "final_leg_validation_actually_ran": (
        Tamper("validation skipped on leg 2", leg2_validation_skipped, also={**PPL, **VAL_NEAR, **VAL_REF}),
        Tamper(
            "validation swallowed an error on leg 2",
            leg2_validation_swallowed_an_error,
            also={**PPL, **VAL_NEAR, **VAL_REF},
        ),
        # exp(1000) overflows to the same infinity: the perplexity follows from the loss, which is absurd.
        Tamper("validation gave an infinite perplexity", leg2_validation_gave_infinity, also={**VAL_NEAR, **VAL_REF}),
        Tamper("validation gave a NaN perplexity", leg2_validation_gave_nan, also={**PPL, **VAL_NEAR, **VAL_REF}),
    ),
    "horizon_tokens_match_the_arithmetic": (
        Tamper("leg 2 consumed one step's tokens too few", leg2_tokens_one_step_short),
    ),
    # p4_segment's loss check reads leg 2's final loss too; the count flips with a null loss.
    "final_loss_finite_and_below_ceiling": (
        Tamper(
            "leg 2 ended on a NaN loss (JSON NaN)",
            leg2_nan_literal,
            # NaN equals nothing, not even the NaN it summarises.
            also={
                **LEG2_LOSS_READERS,
                **SUMMARY_LEG2,
                **LINES_LEG2,
                **VAL_NEAR,
                "every_logged_loss_finite[leg=leg2]": "FAIL",
                **REF_LOSSES_LEG2,
            },
        ),
        Tamper(
            "leg 2 ended on a non-finite loss (null, as the trainer writes it)",
            leg2_nan_as_the_trainer_writes_it,
            also={
                **LEG2_LOSS_READERS,
                **LINES_LEG2,
                **VAL_NEAR,
                "no_nonfinite_loss[leg=leg2]": "FAIL",
                "every_logged_loss_finite[leg=leg2]": "FAIL",
                **REF_LOSSES_LEG2,
            },
        ),
    ),
    "no_nonfinite_loss[leg=leg1]": _nonfinite_counted("leg1", leg1_nan_mid_run),
    "no_nonfinite_loss[leg=leg2]": _nonfinite_counted("leg2", leg2_nan_mid_run),
    "every_logged_loss_finite[leg=leg1]": (
        Tamper(
            "a NaN in the middle of leg 1 that the count missed",
            leg1_nan_the_count_missed(float("nan")),
            also={
                **LINES_LEG1,
                **REF_LOSSES_LEG1,
            },
        ),
        Tamper(
            "an infinite loss in the middle of leg 1 that the count missed",
            leg1_nan_the_count_missed(math.inf),
            also={
                **LINES_LEG1,
                **REF_LOSSES_LEG1,
            },
        ),
    ),
    "every_logged_loss_finite[leg=leg2]": (
        Tamper(
            "a NaN in the middle of leg 2 that the count missed",
            leg2_nan_the_count_missed,
            also={
                **LINES_LEG2,
                **REF_LOSSES_LEG2,
            },
        ),
    ),
    # ---- p4_segment (p4_smoke, p4_soak): the checks of every stop, here the one stop after leg 1
    "stopped_at_the_stop_step[leg=leg1]": (
        Tamper("leg 1 stopped one step late", leg1_one_step_late, also=SUMMARY_LEG1),
    ),
    "reported_a_segment[leg=leg1]": (Tamper("leg 1 reported the horizon, not a segment", leg1_reported_horizon),),
    "pushed_every_interval[leg=leg1]": (
        Tamper("checkpoint push_every is missing after leg 1", leg1_checkpoint_missing),
    ),
    "pointer_at_the_stop[leg=leg1]": (
        Tamper("the pointer after leg 1 is stale", leg1_pointer_stale),
        Tamper("the pointer after leg 1 is terminal", leg1_pointer_terminal),
        Tamper(
            "the pointer after leg 1 says the stop but names an older, complete checkpoint",
            leg1_pointer_names_an_older_complete_checkpoint,
        ),
    ),
    "next_leg_resumed_from_exactly_the_stop[leg=leg1]": (
        Tamper("leg 2 resumed one push before the stop", leg2_resumed_one_push_early, also=SUMMARY_LEG2),
        LEG2_STARTED_FRESH,
    ),
    "next_leg_continues_the_trajectory[leg=leg1]": (
        Tamper(
            "leg 2's first loss jumped 50 % above leg 1's last",
            leg2_first_loss_jumped,
            also={
                **REF_LOSSES_LEG2,
            },
        ),
    ),
    "tokens_at_the_stop_match_the_arithmetic[leg=leg1]": (
        Tamper("leg 1 consumed one step's tokens too few", leg1_tokens_one_step_short),
    ),
    "params_are_the_frozen_model": (Tamper("leg 1 trained another geometry", leg1_wrong_geometry),),
    "checkpointing_really_off": (Tamper("leg 1 ran with gradient checkpointing", leg1_grad_ckpt_on),),
    "skipped_validation_by_design[leg=leg1]": (
        Tamper("leg 1 ran validation", leg1_validated),
        Tamper("leg 1 reports a perplexity although it skipped validation", leg1_ppl_without_validation),
    ),
    "loss_finite_and_below_ceiling_at_the_stop[leg=leg1]": (
        Tamper(
            "leg 1 ended on a loss spike above ln(vocab)",
            leg1_ended_on_a_spike,
            also={
                **REF_LOSSES_LEG1,
                **REF_LOSSES_LEG2,
            },
        ),
        # The trajectory check compares leg 2's first loss with leg 1's final loss: it cannot
        # hold when that loss is not a number, and says so by failing (is_finite guard).
        Tamper(
            "leg 1 ended on a non-finite loss (null, as the trainer writes it)",
            leg1_nan_as_the_trainer_writes_it,
            also={
                **LINES_LEG1,
                "next_leg_continues_the_trajectory[leg=leg1]": "FAIL",
                "no_nonfinite_loss[leg=leg1]": "FAIL",
                "every_logged_loss_finite[leg=leg1]": "FAIL",
                **REF_LOSSES_LEG1,
            },
        ),
    ),
    "loss_at_horizon_below_step_one": (
        Tamper(
            "leg 2's loss at the horizon is only 5 % below step 1's",
            leg2_loss_barely_moved,
            also={
                **REF_LOSSES_LEG2,
            },
        ),
    ),
    # ---- p4_soak
    "peak_memory_during_training_below_gate": (
        Tamper("a GPU soak peaked at 13.7 GB reserved on leg 1", soak_peak_over_gate_on_gpu),
    ),
    "collector_never_stalled_a_step[leg=leg1]": (
        Tamper("a full garbage collection stopped leg 1 for 0.62 s", leg1_collector_stalled),
    ),
    "collector_never_stalled_a_step[leg=leg2]": (
        Tamper("leg 2's longest full collection took exactly the 0.1 s gate", leg2_collector_stalled_just_at_the_gate),
    ),
    # ---- p4_preempt
    "leg1_was_killed_mid_push": (
        Tamper("leg 1 was killed by its timeout", killed_by_timeout),
        Tamper("leg 1 was SIGKILLed by something else (rc -9, no signal rule fired)", killed_by_someone_else),
    ),
    "leg1_left_no_run_json": (
        Tamper("leg 1 printed a RUN_JSON: the kill came after the run ended", leg1_ran_to_the_end),
    ),
    "pointer_never_named_the_unfinished_checkpoint": (
        Tamper(
            "the pointer names the checkpoint whose push was killed",
            pointer_moved_before_verify,
            # Killed once the pointer had moved, before its prune: the older optimizer state stayed too.
            also={"old_optimizer_states_pruned_after[leg=leg1]": "FAIL"},
        ),
        Tamper(
            "the pointer's step is the verified one, its path the killed push's",
            pointer_step_right_path_of_the_killed_push,
        ),
    ),
    "leg2_resumed_from_last_verified": (
        Tamper("leg 2 resumed from the half-pushed checkpoint", leg2_resumed_from_half_pushed, also=SUMMARY_LEG2),
        LEG2_STARTED_FRESH,
    ),
    "killed_leg_logged_each_step_up_to_the_resume_once": (
        Tamper("leg 1's progress lines skip a step before the resume point", killed_leg_skipped_a_logged_step),
    ),
    # ---- every resume, every leg's figures, validation, each step's lr and batch (p4_common)
    "no_final_before_the_horizon[leg=leg1]": (
        Tamper("final/ was published at the stop", final_published_at_the_stop),
        Tamper("the listing shows final/ weights at the stop (the flag says none)", final_listed_at_the_stop),
    ),
    "resumed_leg_logged_each_step_after_the_resume_once[leg=leg1]": (
        Tamper(
            "leg 2 also reports the resume step",
            next_leg_also_reported(0),
            also={
                **SUMMARY_LEG2,
                **SERIES_LEG2,
                **REF_LOSSES_LEG2,
            },
        ),
        Tamper(
            "leg 2 also reports a step 5 before the resume",
            next_leg_also_reported(5),
            also={
                **SUMMARY_LEG2,
                **SERIES_LEG2,
                **REF_LOSSES_LEG2,
            },
        ),
        Tamper("leg 2 skipped a step after the resume", next_leg_lost_a_middle_step, also=LINES_LEG2),
    ),
    "run_logged_step_one_first_and_the_horizon_last": (
        Tamper("the horizon leg lost its last step", final_leg_lost_its_last_step, also={**SUMMARY_LEG2, **LINES_LEG2}),
        Tamper(
            "leg 1's logged steps start after step 1",
            leg1_progress_starts_after_step_one,
            also={"killed_leg_logged_each_step_up_to_the_resume_once": "FAIL"},
        ),
    ),
    "validation_covered_the_tokens_asked_for": (
        Tamper("validation averaged over one window", validation_over_fewer_tokens(64), also=VAL_REF),
        Tamper("validation averaged over no tokens", validation_over_fewer_tokens(0), also=VAL_REF),
    ),
    "perplexity_is_exp_of_the_validation_loss": (
        Tamper("val_ppl 0.5", lambda d: final_val(d, val_ppl=0.5)),
        Tamper("val_ppl 1 % off exp(val_loss)", ppl_is_not_exp_of_the_loss),
        Tamper(
            "val_ppl 1.0 from a val_loss of 0.0",
            lambda d: final_val(d, val_loss=0.0, val_ppl=1.0),
            also={**VAL_NEAR, **VAL_REF},
        ),
        Tamper(
            "a NaN val_loss beside a finite val_ppl",
            lambda d: final_val(d, val_loss=math.nan),
            also={**VAL_NEAR, **VAL_REF},
        ),
    ),
    "validation_loss_near_the_training_loss": (
        Tamper("a consistent val_loss/val_ppl at half the training loss", val_loss_far_from_training, also=VAL_REF),
    ),
    "summary_agrees_with_the_logged_losses[leg=leg1]": (
        Tamper(
            "leg 1's final_loss is 1.0, its last logged loss not",
            final_loss_not_the_last_logged("leg1"),
            also={"next_leg_continues_the_trajectory[leg=leg1]": "FAIL"},
        ),
    ),
    "summary_agrees_with_the_logged_losses[leg=leg2]": (
        Tamper(
            "leg 2's final_loss is 1.0, its last logged loss not",
            final_loss_not_the_last_logged("leg2"),
            also=VAL_NEAR,
        ),
    ),
    **_own_series("leg1"),
    **_own_series("leg2"),
    "lr_follows_the_schedule[leg=leg1]": (
        Tamper("leg 1 ran at 1.2 x the peak lr", lrs_scaled("leg1", 1.2), also=REF_LRS_LEG1),
        Tamper("leg 1's lr rose in the middle of the decay", lr_spike_after_warmup("leg1"), also=REF_LRS_LEG1),
    ),
    "lr_follows_the_schedule[leg=leg2]": (
        Tamper("leg 2 resumed on 1.2 x the lr", lrs_scaled("leg2", 1.2), also=REF_LRS_LEG2),
        Tamper(
            "leg 2's schedule restarted its warm-up at the resume", schedule_restarted_at_the_resume, also=REF_LRS_LEG2
        ),
    ),
    "stopped_leg_logged_each_step_up_to_the_stop_once[leg=leg1]": (
        Tamper(
            "leg 1 lost its last step (the stop)",
            leg1_lost_its_last_step,
            also={**SUMMARY_LEG1, **LINES_LEG1},
        ),
        Tamper(
            "leg 1 also logged the step after its stop",
            leg1_logged_past_its_stop,
            also={
                **SUMMARY_LEG1,
                **SERIES_LEG1,
                **REF_LOSSES_LEG1,
            },
        ),
    ),
    "next_leg_trained_other_batches_than_the_stopped_one[leg=leg1]": (
        Tamper("leg 2's data order restarted at the resume", data_order_restarted_at_the_resume, also=REF_BATCHES_LEG2),
    ),
    # ---- the run that never stopped (each leg's series against it: _own_series)
    "reference_ran_uninterrupted_to_the_horizon": (
        Tamper("the reference resumed from a checkpoint itself", reference_resumed_itself),
    ),
    "final_checkpoint_matches_the_reference": (
        Tamper("rank 1's RNG state at the horizon is not the reference's", horizon_rng_not_the_references),
        Tamper(
            "no checkpoint at the horizon where the comparison looks",
            horizon_checkpoint_missing_for_the_comparison,
            also=STORED_COMPARED,
        ),
    ),
    "validation_matches_the_reference": (
        Tamper(
            "the horizon leg validated weights 0.1 % off the reference's (its figures agree)", validated_other_weights
        ),
    ),
    "final_checkpoint_compared_is_the_one_stored": (
        Tamper(
            "final/ in the store holds other weights than those compared", horizon_weights_compared_are_not_the_stored
        ),
    ),
}


def cases() -> list:
    cases = []
    for stem in SPECS:
        for name in check_names(stem):
            for i in range(len(TAMPERS.get(name, ()))):
                cases.append(pytest.param(stem, name, i, id=f"{stem}-{name}-{i}"))
    return cases
