"""The corruptions of a passing saved run that the P4 checks must catch, each class alone, by reading the
data rather than what the trainer says about itself: the steps the legs logged (every step from 1 to the
horizon once), the store at every stop (no final/, the pointer's path), the headline numbers against the
data they summarise (final loss, perplexity, validation tokens, per-rank peaks), and each step's lr and
batch.

Each case copies a saved run of `evidence/`, changes what that corruption changes, and runs `engine check`
(or `engine replay`, where the corruption is in the raw log) in process: the verdict is FAIL and names the
check that reads the contradicted fact. The unmodified copy passes. `test_every_check_can_fail.py` holds
the finer contract (exactly which checks flip); this file is the list of corruption classes, by name.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from bundles import SPECS, SPECS_DIR, check_names, copy_bundle, engine_check, read_evidence, run_json, write_evidence
from engine_helpers import Engine
from tamper_legs import (
    batch_repeated_in_leg,
    data_order_restarted_at_the_resume,
    final_leg_lost_its_last_step,
    leg1_lost_its_last_step,
    lrs_scaled,
    next_leg_also_reported,
    peak_max_below_a_rank,
    schedule_restarted_at_the_resume,
)
from tamper_store import (
    final_listed_at_the_stop,
    final_published_at_the_stop,
    leg1_pointer_names_an_older_complete_checkpoint,
)

from engine.judge.verdict import Exit

SEGMENT = ("p4_smoke", "p4_soak")  # the specs with a stop (leg 1 reports RUN_JSON)


def _final_val(**fields: float) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        run_json(d, d["values"]["final_leg"]).update(fields)

    return apply


def _ppl_not_exp_of_loss(d: dict) -> None:
    run = run_json(d, "leg2")
    run["val_ppl"] = math.exp(run["val_loss"]) + 1.0


def _final_loss(value: float) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        run_json(d, "leg2")["final_loss"] = value

    return apply


def _progress_step_twice(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # The log shows one step twice, with two losses: which one was trained is not for a harvest to pick.
        lines = d["steps"][leg]["harvest"]["progress"]
        lines.append({**lines[1], "loss": lines[1]["loss"] + 0.5})

    return apply


@dataclass(frozen=True)
class Corruption:
    what: str
    specs: tuple[str, ...]
    apply: Callable[[dict], object]
    check: str  # the check that must name it
    outcome: str = "FAIL"


CORRUPTIONS = (
    # ---- every step from 1 to the horizon trained once, read from the steps the legs logged
    Corruption(
        "leg 2 also reports the resume step (step 10)",
        SPECS,
        next_leg_also_reported(0),
        "resumed_leg_logged_each_step_after_the_resume_once[leg=leg1]",
    ),
    Corruption(
        "leg 2 also reports step 5",
        SPECS,
        next_leg_also_reported(5),
        "resumed_leg_logged_each_step_after_the_resume_once[leg=leg1]",
    ),
    Corruption(
        "leg 1 is missing its last step",
        SEGMENT,
        leg1_lost_its_last_step,
        "stopped_leg_logged_each_step_up_to_the_stop_once[leg=leg1]",
    ),
    Corruption(
        "leg 2 is missing its last step",
        SPECS,
        final_leg_lost_its_last_step,
        "run_logged_step_one_first_and_the_horizon_last",
    ),
    Corruption(
        "leg 2's log shows a step twice with two losses",
        SPECS,
        _progress_step_twice("leg2"),
        "logged_lines_agree_with_run_json[leg=leg2]",
        "ERROR",
    ),
    Corruption(
        "the killed leg's log shows a step twice with two losses",
        ("p4_preempt",),
        _progress_step_twice("leg1"),
        "killed_leg_logged_each_step_up_to_the_resume_once",
        "ERROR",
    ),
    # ---- final/ at a stop
    Corruption(
        "final/ published at the stop", SPECS, final_published_at_the_stop, "no_final_before_the_horizon[leg=leg1]"
    ),
    Corruption(
        "final/ weights listed at the stop", SPECS, final_listed_at_the_stop, "no_final_before_the_horizon[leg=leg1]"
    ),
    # ---- headline numbers against the data they summarise
    Corruption(
        "final_loss 1.0 while the last logged loss is not",
        SPECS,
        _final_loss(1.0),
        "summary_agrees_with_the_logged_losses[leg=leg2]",
    ),
    Corruption(
        "val_ppl 1.0 with val_loss 0.0",
        SPECS,
        _final_val(val_loss=0.0, val_ppl=1.0),
        "perplexity_is_exp_of_the_validation_loss",
    ),
    Corruption("val_ppl 0.5", SPECS, _final_val(val_ppl=0.5), "perplexity_is_exp_of_the_validation_loss"),
    Corruption("val_ppl is not exp(val_loss)", SPECS, _ppl_not_exp_of_loss, "perplexity_is_exp_of_the_validation_loss"),
    Corruption(
        "a NaN val_loss with a finite val_ppl",
        SPECS,
        _final_val(val_loss=math.nan),
        "perplexity_is_exp_of_the_validation_loss",
    ),
    Corruption("validation over no tokens", SPECS, _final_val(val_tokens=0), "validation_covered_the_tokens_asked_for"),
    Corruption(
        "per-rank peaks [12.0, 14.2] under a reported max of 12.0",
        SPECS,
        peak_max_below_a_rank("leg2"),
        "peak_memory_figures_agree_with_the_ranks[leg=leg2]",
    ),
    # ---- the pointer at a stop
    Corruption(
        "the pointer says the stop but names an older complete checkpoint",
        SEGMENT,
        leg1_pointer_names_an_older_complete_checkpoint,
        "pointer_at_the_stop[leg=leg1]",
    ),
    # ---- each step's lr and batch
    Corruption("leg 2 resumed on another lr", SPECS, lrs_scaled("leg2", 1.2), "lr_follows_the_schedule[leg=leg2]"),
    Corruption(
        "leg 2's schedule restarted at the resume",
        SPECS,
        schedule_restarted_at_the_resume,
        "lr_follows_the_schedule[leg=leg2]",
    ),
    Corruption(
        "leg 2's data order restarted at the resume",
        SEGMENT,
        data_order_restarted_at_the_resume,
        "next_leg_trained_other_batches_than_the_stopped_one[leg=leg1]",
    ),
    Corruption(
        "a batch trained twice in leg 2",
        SPECS,
        batch_repeated_in_leg("leg2"),
        "no_batch_trained_twice_in_a_leg[leg=leg2]",
    ),
)


def _cases() -> list:
    return [
        pytest.param(stem, c, id=f"{stem}-{re.sub(r'[^a-z0-9]+', '_', c.what.lower()).strip('_')}")
        for c in CORRUPTIONS
        for stem in c.specs
    ]


@pytest.mark.parametrize("stem", SPECS)
def test_the_unmodified_copy_of_each_saved_run_passes(stem: str, tmp_path: Path, engine: Engine) -> None:
    got = engine_check(engine, stem, copy_bundle(stem, tmp_path))
    assert got.rc == Exit.PASS and got.record["verdict"]["outcome"] == "PASS", got.record["verdict"]


@pytest.mark.parametrize("stem,corruption", _cases())
def test_each_corruption_fails_the_saved_run_naming_its_check(
    stem: str, corruption: Corruption, tmp_path: Path, engine: Engine
) -> None:
    bundle = copy_bundle(stem, tmp_path)
    doc = read_evidence(bundle)
    corruption.apply(doc)
    write_evidence(bundle, doc)
    got = engine_check(engine, stem, bundle)
    assert got.rc == Exit.FAILED, (corruption.what, got.record["verdict"])
    assert corruption.check in got.record["verdict"]["failed"], (corruption.what, got.record["verdict"]["failed"])
    result = got.result(corruption.check)
    assert result["outcome"] == corruption.outcome, (corruption.what, result["outcome"], result["reason"])
    assert f"VERDICT {stem} FAIL" in got.out and corruption.check in got.out


def test_a_step_logged_twice_in_the_killed_legs_log_is_an_error_naming_the_step_and_both_losses(
    tmp_path: Path, engine: Engine
) -> None:
    bundle = copy_bundle("p4_preempt", tmp_path)
    doc = read_evidence(bundle)
    _progress_step_twice("leg1")(doc)
    write_evidence(bundle, doc)
    result = engine_check(engine, "p4_preempt", bundle).result("killed_leg_logged_each_step_up_to_the_resume_once")
    line = doc["steps"]["leg1"]["harvest"]["progress"][1]
    assert result["outcome"] == "ERROR"
    assert f"by_step(): step {line['step']} is logged twice with different loss" in result["reason"]


def test_a_run_json_line_that_names_a_step_twice_fails_the_replay_as_malformed(tmp_path: Path, engine: Engine) -> None:
    """In the raw log, where a JSON parser would keep one of the two losses and lose the other."""
    bundle = copy_bundle("p4_smoke", tmp_path)
    log = bundle / "logs" / "leg2.log"
    text = log.read_text(encoding="utf-8")
    assert '"losses": {"11": ' in text
    log.write_text(text.replace('"losses": {"11": ', '"losses": {"11": 9.5, "11": ', 1), encoding="utf-8")
    ran = engine("replay", str(SPECS_DIR / "p4_smoke.yaml"), "--evidence", str(bundle), expect=Exit.FAILED)
    record = json.loads(next(bundle.glob("replay-*.json")).read_text(encoding="utf-8"))
    assert "harvest:leg2.run_json" in record["verdict"]["failed"]
    assert 'not harvested: duplicate key "11" in one object (9.5, then ' in ran.out


def test_a_saved_evidence_file_that_names_a_key_twice_is_refused_naming_it(tmp_path: Path, engine: Engine) -> None:
    bundle = copy_bundle("p4_smoke", tmp_path)
    path = bundle / "evidence.json"
    text = path.read_text(encoding="utf-8")
    first = re.search(r'"11": (\S+),', text)
    assert first is not None
    path.write_text(text.replace(first.group(0), f'"11": 9.5, {first.group(0)}', 1), encoding="utf-8")
    ran = engine("check", str(SPECS_DIR / "p4_smoke.yaml"), "--evidence", str(bundle), expect=Exit.USAGE)
    assert f'duplicate key "11" in one object (9.5, then {first.group(1)})' in ran.err


@pytest.mark.parametrize("stem,stops", [("examples/p4_two_stops", 2), ("examples/p4_three_stops", 3)])
def test_every_stop_of_a_probe_with_more_stops_gets_the_checks_of_a_resume(stem: str, stops: int) -> None:
    names = set(check_names(stem))
    for leg in range(1, stops + 1):
        for family in (
            "no_final_before_the_horizon",
            "resumed_leg_logged_each_step_after_the_resume_once",
            "stopped_leg_logged_each_step_up_to_the_stop_once",
            "pointer_at_the_stop",
            "next_leg_trained_other_batches_than_the_stopped_one",
        ):
            assert f"{family}[leg=leg{leg}]" in names
    for leg in range(1, stops + 2):
        for family in (
            "summary_agrees_with_the_logged_losses",
            "lr_follows_the_schedule",
            "no_batch_trained_twice_in_a_leg",
        ):
            assert f"{family}[leg=leg{leg}]" in names
