"""Every check can fail: each check of the P4 specs is shown to FAIL when its fact is false.

The input is real evidence: `evidence/<spec stem>/` holds the `evidence.json` and raw `logs/` of a
real `engine run` of that spec on the embedded default (CPU, 2 gloo ranks, tiny model, local store).
For every check of p4_smoke, p4_soak and p4_preempt, a copy of that bundle is tampered so that the
check's fact is false (leg 1 stopped one step late, a checkpoint missing from the store, a stale
pointer, tokens off by one step, a NaN loss, 13.7 GB peak in a GPU soak, validation skipped on
leg 2, ...). `engine check` is then run on the copy and must report exactly that check as FAIL,
every other check as in the untampered run, and a failing verdict (exit 5).

The second family deletes data instead: a harvested field, a collected state, a whole step, a
value. The checks that read it must say NO_DATA (never FAIL, never PASS) and name the missing path.

The check list is read from the specs themselves (load_spec + build_plan): a check added to a spec
without a tamper case below makes `test_every_check_has_a_tamper_case` fail.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest

from engine.cli import main as engine_main
from engine.judge.verdict import Exit
from engine.spec.load import load_spec
from engine.spec.plan import build_plan

ROOT = Path(__file__).resolve().parents[2]
SPECS_DIR = ROOT / "specs"
EVIDENCE_DIR = ROOT / "evidence"
SPECS = ("p4_smoke", "p4_soak", "p4_preempt")


# ------------------------------------------------------------------ the spec side


@lru_cache(maxsize=None)
def _checks(stem: str) -> tuple[dict, ...]:
    """The spec's checks as the engine resolves them (environment ignored: default mode)."""
    plan = build_plan(load_spec(SPECS_DIR / f"{stem}.yaml"), environ={})
    return tuple(plan.checks)


def check_names(stem: str) -> list[str]:
    return [c["name"] for c in _checks(stem)]


def check_by_name(stem: str, name: str) -> dict:
    return next(c for c in _checks(stem) if c["name"] == name)


# ------------------------------------------------------------------ bundles and `engine check`


def copy_bundle(stem: str, dest: Path) -> Path:
    """A private copy of the saved bundle; the original is never written to."""
    target = dest / stem
    shutil.copytree(EVIDENCE_DIR / stem, target)
    return target


def read_evidence(bundle: Path) -> dict:
    # json.loads accepts NaN/Infinity, exactly as engine/run/evidence.py's load() does.
    return json.loads((bundle / "evidence.json").read_text(encoding="utf-8"))


def write_evidence(bundle: Path, doc: dict) -> None:
    # allow_nan (the default) writes a bare `NaN`, which the engine's loader reads back as a float.
    (bundle / "evidence.json").write_text(json.dumps(doc, indent=1), encoding="utf-8")


@dataclass
class Checked:
    rc: int
    record: dict
    out: str
    err: str

    @property
    def outcomes(self) -> dict[str, str]:
        return {r["name"]: r["outcome"] for r in self.record["checks"]}

    def result(self, name: str) -> dict:
        return next(r for r in self.record["checks"] if r["name"] == name)


def engine_check(stem: str, bundle: Path, capsys: pytest.CaptureFixture) -> Checked:
    """`engine check specs/<stem>.yaml --evidence <bundle>`, in process; returns the check record."""
    capsys.readouterr()
    before = set(bundle.glob("check-*.json"))
    rc = engine_main(["check", str(SPECS_DIR / f"{stem}.yaml"), "--evidence", str(bundle)])
    out, err = capsys.readouterr()
    new = sorted(set(bundle.glob("check-*.json")) - before)
    assert rc != Exit.USAGE, f"engine check refused the bundle (stale evidence?):\n{err}"
    assert len(new) == 1, f"expected one new check-<stamp>.json in {bundle}, found {new}"
    record = json.loads(new[0].read_text(encoding="utf-8"))
    return Checked(rc, record, out, err)


class _Baselines(dict):
    """Outcome of every check on each untampered bundle, computed once per spec on first use."""

    def __init__(self, base: Path) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, stem: str) -> dict[str, str]:
        bundle = copy_bundle(stem, self.base)
        rc = engine_main(["check", str(SPECS_DIR / f"{stem}.yaml"), "--evidence", str(bundle)])
        records = list(bundle.glob("check-*.json"))
        assert rc != Exit.USAGE and records, f"{stem}: engine check refused the saved bundle"
        record = json.loads(records[0].read_text(encoding="utf-8"))
        assert rc == Exit.PASS, f"{stem}: the untampered bundle does not pass: {record['verdict']}"
        self[stem] = {r["name"]: r["outcome"] for r in record["checks"]}
        return self[stem]


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> _Baselines:
    return _Baselines(tmp_path_factory.mktemp("baseline"))


# ------------------------------------------------------------------ evidence accessors


def run_json(doc: dict, leg: str) -> dict:
    return doc["steps"][leg]["harvest"]["run_json"]


def hub(doc: dict, name: str) -> dict:
    return doc["state"][name]


def val(doc: dict, name: str) -> Any:
    return doc["values"][name]


def first_resume(doc: dict) -> dict:
    """The run's first resume, {leg, stop, next}: leg 1's stop in a segment probe, its kill in p4_preempt."""
    return val(doc, "resumes")[0]


def relog(doc: dict, leg: str) -> None:
    """The leg's progress lines say what its RUN_JSON losses now say (to 4 decimals, as the trainer
    prints them): a tamper that models a trainer that really trained other losses changes both."""
    losses = run_json(doc, leg)["losses"]
    for line in doc["steps"][leg]["harvest"]["progress"]:
        line["loss"] = round(losses[str(line["step"])], 4)


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


# ------------------------------------------------------------------ the tamper cases


@dataclass(frozen=True)
class Tamper:
    """One realistic way the check's fact is false. `also`: checks that read the very same fact
    and therefore flip with it, with the outcome they must have (only those present in the spec
    under test are expected); `apply` may return more of them when that depends on the bundle
    (a damaged checkpoint directory that is, in one spec, the pointer's target)."""

    fact: str
    apply: Callable[[dict], Mapping[str, str] | None]
    also: Mapping[str, str] = field(default_factory=dict)


def _leg1_one_step_late(d: dict) -> None:
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


def _leg1_pointer_names_an_older_complete_checkpoint(d: dict) -> None:
    # The pointer says the stop's step but names an older checkpoint, complete in the store (weights,
    # state, optimizer and RNG, each with the hash the pointer records): a resume would read that one.
    stop, every = val(d, "stop1"), val(d, "push_every")
    older = stop - every if stop > every else stop // 2
    state = hub(d, "hub_after_leg1")
    pointer, path = state["pointer"], f"ckpt/checkpoint-{older}"
    for name in pointer["files"]:
        key = f"{path}/{name}"
        if key not in state["sha256"]:
            state["files"].append(key)
            state["sha256"][key] = hashlib.sha256(key.encode()).hexdigest()
    state["files"].sort()
    files = {name: state["sha256"][f"{path}/{name}"] for name in pointer["files"]}
    pointer.update(path_in_repo=path, files=files)
    for key in ("pointer_target_sha256", "pointer_target_sha256_stored"):
        if key in state:
            state[key] = dict(files)


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
    relog(d, "leg2")


def _leg2_restarted_from_random_weights(d: dict) -> None:
    # A restart from scratch replays leg 1's curve from its first step after the stop.
    leg1_losses, leg2 = run_json(d, "leg1")["losses"], run_json(d, "leg2")
    stop1 = val(d, "stop1")
    for k in list(leg2["losses"]):
        replayed = leg1_losses.get(str(int(k) - stop1))
        if replayed is not None:
            leg2["losses"][k] = replayed
    leg2["final_loss"] = leg2["losses"][str(leg2["final_step"])]
    relog(d, "leg2")


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
    relog(d, "leg1")
    relog(d, "leg2")


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


def _leg2_loss_barely_moved(d: dict) -> Mapping[str, str]:
    # Finite and below ln(vocab), but only 5 % under the loss at step 1.
    step1 = run_json(d, "leg1")["losses"]["1"]
    leg2 = run_json(d, "leg2")
    leg2["final_loss"] = leg2["losses"][str(val(d, "steps"))] = step1 * 0.95
    relog(d, "leg2")
    # Validation's loss, near the real training loss, may now sit far from the tampered one.
    far = abs(leg2["val_loss"] - leg2["final_loss"]) > leg2["final_loss"] * val(d, "val_loss_gap_max")
    return {"validation_loss_near_the_training_loss": "FAIL"} if far else {}


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


def _arm_peak_gate(d: dict) -> None:
    # `engine check` takes values from the spec, re-applying the run's own --set: a run made with
    # `--set gate_peak=true` is how a saved local run gets the gate armed.
    d["values"]["gate_peak"] = True
    d["sources"]["gate_peak"] = "--set"


def _soak_peak_over_gate_on_gpu(d: dict) -> None:
    # What a GPU soak reports (gate_peak is true off the local target): 13.7 GB reserved on the
    # worst rank of leg 1, over the 13.6 GB gate.
    _arm_peak_gate(d)
    run_json(d, "leg1").update(
        peak_gpu_gb=12.4,
        peak_gpu_gb_max_rank=12.5,
        peak_reserved_gb_max_rank=13.7,
        peak_reserved_gb_by_rank=[13.7, 13.2],
    )


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
    leg1["harvest"]["run_json"] = {"final_step": val(d, "steps"), "segment_stop": False}
    leg1["harvest_errors"] = []


def _pointer_step_right_path_of_the_killed_push(d: dict) -> Mapping[str, str]:
    # The pointer's step is the last verified one, but its path names the checkpoint whose push was
    # killed; the store's listing of that directory decides whether the retention check sees it too.
    state = hub(d, "hub_after_leg1")
    path = f"ckpt/checkpoint-{val(d, 'kill_step')}"
    state["pointer"]["path_in_repo"] = path
    complete = all(f"{path}/{n}" in state["files"] for n in ("optimizer.pt", "rng.pt", "model.safetensors"))
    return {} if complete else {"checkpoints_complete_after[leg=leg1]": "FAIL"}


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


def _next_leg_lost_a_middle_step(d: dict) -> None:
    # One step after the resume never trained (its loss, lr and batch all absent): the step between
    # the resume and the horizon that the progress lines also show.
    resume = first_resume(d)
    run = run_json(d, resume["next"])
    step = next(line["step"] for line in d["steps"][resume["next"]]["harvest"]["progress"][1:])
    for per_step in ("losses", "lrs", "batches"):
        del run[per_step][str(step)]


def _next_leg_also_reported(offset: int) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # The resumed leg reports a step at or before the resume point too (here `offset` steps before
        # it), only in its losses: the trainer trained it again, or the report mixes two runs.
        resume = first_resume(d)
        run_json(d, resume["next"])["losses"][str(resume["stop"] - offset)] = 5.0

    return apply


def _next_leg_trained_the_stop_again(d: dict) -> None:
    # A resume from the checkpoint before the stop's trains the stop step again, with its lr and batch.
    resume = first_resume(d)
    before, after, stop = run_json(d, resume["leg"]), run_json(d, resume["next"]), str(resume["stop"])
    for per_step in ("losses", "lrs", "batches"):
        after[per_step] = {stop: before[per_step][stop], **after[per_step]}


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


def _final_published_at_the_stop(d: dict) -> None:
    # The trainer pushed final/ (all of it, the collector says so) at the stop, not only at the horizon.
    state = hub(d, f"hub_after_{first_resume(d)['leg']}")
    target = state["pointer"]["path_in_repo"]
    state["has_final"] = True
    for name in ("config.json", "model.safetensors", "trainer_state.json", "optimizer.pt", "rng.pt"):
        state["files"].append(f"final/{name}")
        state["sha256"][f"final/{name}"] = state["sha256"][f"{target}/{name}"]
    state["files"].sort()


def _final_listed_at_the_stop(d: dict) -> None:
    # The collector's flag says no final/, but the listing shows its weights.
    state = hub(d, f"hub_after_{first_resume(d)['leg']}")
    state["files"] = sorted(state["files"] + ["final/model.safetensors"])
    state["sha256"]["final/model.safetensors"] = hashlib.sha256(b"half-trained").hexdigest()


def _final_leg_lost_its_last_step(d: dict) -> None:
    run = run_json(d, val(d, "final_leg"))
    for per_step in ("losses", "lrs", "batches"):
        del run[per_step][str(val(d, "steps"))]


def _leg1_progress_starts_after_step_one(d: dict) -> None:
    d["steps"]["leg1"]["harvest"]["progress"].pop(0)


def _validation_over_fewer_tokens(tokens: int) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        run_json(d, val(d, "final_leg"))["val_tokens"] = tokens

    return apply


def _final_val(d: dict, **fields: Any) -> None:
    run_json(d, val(d, "final_leg")).update(fields)


def _ppl_is_not_exp_of_the_loss(d: dict) -> None:
    run = run_json(d, val(d, "final_leg"))
    run["val_ppl"] = math.exp(run["val_loss"]) * 1.01


def _val_loss_far_from_training(d: dict) -> None:
    # A consistent pair (ppl = exp(loss)), but half the training loss at the horizon.
    run = run_json(d, val(d, "final_leg"))
    run["val_loss"] = run["final_loss"] * 0.5
    run["val_ppl"] = math.exp(run["val_loss"])


def _final_loss_not_the_last_logged(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        run_json(d, leg)["final_loss"] = 1.0

    return apply


def _run_json_contradicts_a_logged_line(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # RUN_JSON's loss at a step the progress lines show (not the leg's last) is another one.
        line = d["steps"][leg]["harvest"]["progress"][1]
        run_json(d, leg)["losses"][str(line["step"])] += 0.01

    return apply


def _peak_max_below_a_rank(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        run_json(d, leg).update(
            peak_gpu_gb=11.0,
            peak_gpu_gb_max_rank=11.5,
            peak_reserved_gb_max_rank=12.0,
            peak_reserved_gb_by_rank=[12.0, 14.2],
        )

    return apply


def _lr_missing_at_the_last_step(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        lrs = run_json(d, leg)["lrs"]
        del lrs[max(lrs, key=int)]

    return apply


def _lrs_scaled(leg: str, factor: float) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # The leg ran at another peak lr (a resume that changed --lr): every lr off by the same factor.
        lrs = run_json(d, leg)["lrs"]
        for k in lrs:
            lrs[k] *= factor

    return apply


def _lr_spike_after_warmup(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        lrs = run_json(d, leg)["lrs"]
        inner = sorted(lrs, key=int)[len(lrs) // 2]
        lrs[inner] *= 1.5

    return apply


def _schedule_restarted_at_the_resume(d: dict) -> None:
    # The resumed leg's first step trains at warm-up's first lr, as a fresh scheduler would.
    resume = first_resume(d)
    lrs = run_json(d, resume["next"])["lrs"]
    lrs[str(resume["stop"] + 1)] = val(d, "lr") / val(d, "warmup_steps")


def _batch_repeated_in_leg(leg: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        batches = run_json(d, leg)["batches"]
        steps = sorted(batches, key=int)
        batches[steps[-1]] = batches[steps[0]]

    return apply


def _leg1_logged_past_its_stop(d: dict) -> None:
    # Leg 1 trained (and reported) the step after its stop too.
    leg1, stop = run_json(d, "leg1"), val(d, "stop1")
    leg1["losses"][str(stop + 1)] = leg1["losses"][str(stop)]


def _leg1_lost_its_last_step(d: dict) -> None:
    leg1 = run_json(d, "leg1")
    for per_step in ("losses", "lrs", "batches"):
        del leg1[per_step][str(val(d, "stop1"))]


def _data_order_restarted_at_the_resume(d: dict) -> None:
    # Leg 2 trains leg 1's batches again from the start of the data stream.
    leg1, leg2 = run_json(d, "leg1")["batches"], run_json(d, "leg2")["batches"]
    first = sorted(leg1, key=int)
    for i, step in enumerate(sorted(leg2, key=int)):
        leg2[step] = leg1[first[i % len(first)]]


def _killed_leg_skipped_a_logged_step(d: dict) -> None:
    progress = d["steps"]["leg1"]["harvest"]["progress"]
    d["steps"]["leg1"]["harvest"]["progress"] = [line for line in progress if line["step"] != 5]


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
# The horizon's pointer target compared with the listing.
HORIZON_TARGET = {"pointer_target_complete_after[leg=leg2]": "FAIL"}

TAMPERS: dict[str, tuple[Tamper, ...]] = {
    # ---- p4_common (all three specs)
    "final_leg_reached_the_horizon": (
        Tamper("leg 2 stopped one step before the horizon", _leg2_stopped_one_step_early, also=SUMMARY_LEG2),
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
        Tamper("validation skipped on leg 2", _leg2_validation_skipped, also={**PPL, **VAL_NEAR}),
        Tamper("validation swallowed an error on leg 2", _leg2_validation_swallowed_an_error, also={**PPL, **VAL_NEAR}),
        # exp(1000) overflows to the same infinity: the perplexity follows from the loss, which is absurd.
        Tamper("validation gave an infinite perplexity", _leg2_validation_gave_infinity, also=VAL_NEAR),
        Tamper("validation gave a NaN perplexity", _leg2_validation_gave_nan, also={**PPL, **VAL_NEAR}),
    ),
    "horizon_tokens_match_the_arithmetic": (
        Tamper("leg 2 consumed one step's tokens too few", _leg2_tokens_one_step_short),
    ),
    # p4_segment's loss check reads leg 2's final loss too; the count flips with a null loss.
    "final_loss_finite_and_below_ceiling": (
        Tamper(
            "leg 2 ended on a NaN loss (JSON NaN)",
            _leg2_nan_literal,
            # NaN equals nothing, not even the NaN it summarises.
            also={
                **LEG2_LOSS_READERS,
                **SUMMARY_LEG2,
                **LINES_LEG2,
                **VAL_NEAR,
                "every_logged_loss_finite[leg=leg2]": "FAIL",
            },
        ),
        Tamper(
            "leg 2 ended on a non-finite loss (null, as the trainer writes it)",
            _leg2_nan_as_the_trainer_writes_it,
            also={
                **LEG2_LOSS_READERS,
                **LINES_LEG2,
                **VAL_NEAR,
                "no_nonfinite_loss[leg=leg2]": "FAIL",
                "every_logged_loss_finite[leg=leg2]": "FAIL",
            },
        ),
    ),
    "no_nonfinite_loss[leg=leg1]": (
        Tamper("the trainer counted a non-finite loss in leg 1", _leg_counted_a_nonfinite_loss("leg1")),
        Tamper(
            "a NaN in the middle of leg 1, recovered from (final loss finite)",
            _leg1_nan_mid_run,
            also={**LINES_LEG1, "every_logged_loss_finite[leg=leg1]": "FAIL"},
        ),
    ),
    "no_nonfinite_loss[leg=leg2]": (
        Tamper("the trainer counted a non-finite loss in leg 2", _leg_counted_a_nonfinite_loss("leg2")),
        Tamper(
            "a NaN in the middle of leg 2, recovered from (final loss finite)",
            _leg2_nan_mid_run,
            also={**LINES_LEG2, "every_logged_loss_finite[leg=leg2]": "FAIL"},
        ),
    ),
    "every_logged_loss_finite[leg=leg1]": (
        Tamper(
            "a NaN in the middle of leg 1 that the count missed",
            _leg1_nan_the_count_missed(float("nan")),
            also=LINES_LEG1,
        ),
        Tamper(
            "an infinite loss in the middle of leg 1 that the count missed",
            _leg1_nan_the_count_missed(math.inf),
            also=LINES_LEG1,
        ),
    ),
    "every_logged_loss_finite[leg=leg2]": (
        Tamper("a NaN in the middle of leg 2 that the count missed", _leg2_nan_the_count_missed, also=LINES_LEG2),
    ),
    # ---- p4_segment (p4_smoke, p4_soak): the checks of every stop, here the one stop after leg 1
    "stopped_at_the_stop_step[leg=leg1]": (
        Tamper("leg 1 stopped one step late", _leg1_one_step_late, also=SUMMARY_LEG1),
    ),
    "reported_a_segment[leg=leg1]": (Tamper("leg 1 reported the horizon, not a segment", _leg1_reported_horizon),),
    "pushed_every_interval[leg=leg1]": (
        Tamper("checkpoint push_every is missing after leg 1", _leg1_checkpoint_missing),
    ),
    "pointer_at_the_stop[leg=leg1]": (
        Tamper("the pointer after leg 1 is stale", _leg1_pointer_stale),
        Tamper("the pointer after leg 1 is terminal", _leg1_pointer_terminal),
        Tamper(
            "the pointer after leg 1 says the stop but names an older, complete checkpoint",
            _leg1_pointer_names_an_older_complete_checkpoint,
        ),
    ),
    "next_leg_resumed_from_exactly_the_stop[leg=leg1]": (
        Tamper("leg 2 resumed one push before the stop", _leg2_resumed_one_push_early, also=SUMMARY_LEG2),
        Tamper("leg 2 started fresh", _leg2_fresh_start, also=SUMMARY_LEG2),
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
                **LINES_LEG1,
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
        Tamper(
            "the pointer's step is the verified one, its path the killed push's",
            _pointer_step_right_path_of_the_killed_push,
        ),
    ),
    "leg2_resumed_from_last_verified": (
        Tamper("leg 2 resumed from the half-pushed checkpoint", _leg2_resumed_from_half_pushed, also=SUMMARY_LEG2),
        Tamper("leg 2 started fresh", _leg2_fresh_start, also=SUMMARY_LEG2),
    ),
    "killed_leg_logged_each_step_up_to_the_resume_once": (
        Tamper("leg 1's progress lines skip a step before the resume point", _killed_leg_skipped_a_logged_step),
    ),
    # ---- every resume, every leg's figures, validation, each step's lr and batch (p4_common)
    "no_final_before_the_horizon[leg=leg1]": (
        Tamper("final/ was published at the stop", _final_published_at_the_stop),
        Tamper("the listing shows final/ weights at the stop (the flag says none)", _final_listed_at_the_stop),
    ),
    "resumed_leg_logged_each_step_after_the_resume_once[leg=leg1]": (
        Tamper("leg 2 also reports the resume step", _next_leg_also_reported(0), also={**SUMMARY_LEG2, **SERIES_LEG2}),
        Tamper(
            "leg 2 also reports a step 5 before the resume",
            _next_leg_also_reported(5),
            also={**SUMMARY_LEG2, **SERIES_LEG2},
        ),
        Tamper("leg 2 skipped a step after the resume", _next_leg_lost_a_middle_step, also=LINES_LEG2),
    ),
    "run_logged_step_one_first_and_the_horizon_last": (
        Tamper(
            "the horizon leg lost its last step", _final_leg_lost_its_last_step, also={**SUMMARY_LEG2, **LINES_LEG2}
        ),
        Tamper(
            "leg 1's logged steps start after step 1",
            _leg1_progress_starts_after_step_one,
            also={"killed_leg_logged_each_step_up_to_the_resume_once": "FAIL"},
        ),
    ),
    "validation_covered_the_tokens_asked_for": (
        Tamper("validation averaged over one window", _validation_over_fewer_tokens(64)),
        Tamper("validation averaged over no tokens", _validation_over_fewer_tokens(0)),
    ),
    "perplexity_is_exp_of_the_validation_loss": (
        Tamper("val_ppl 0.5", lambda d: _final_val(d, val_ppl=0.5)),
        Tamper("val_ppl 1 % off exp(val_loss)", _ppl_is_not_exp_of_the_loss),
        Tamper("val_ppl 1.0 from a val_loss of 0.0", lambda d: _final_val(d, val_loss=0.0, val_ppl=1.0), also=VAL_NEAR),
        Tamper("a NaN val_loss beside a finite val_ppl", lambda d: _final_val(d, val_loss=math.nan), also=VAL_NEAR),
    ),
    "validation_loss_near_the_training_loss": (
        Tamper("a consistent val_loss/val_ppl at half the training loss", _val_loss_far_from_training),
    ),
    "summary_agrees_with_the_logged_losses[leg=leg1]": (
        Tamper(
            "leg 1's final_loss is 1.0, its last logged loss not",
            _final_loss_not_the_last_logged("leg1"),
            also={"next_leg_continues_the_trajectory[leg=leg1]": "FAIL"},
        ),
    ),
    "summary_agrees_with_the_logged_losses[leg=leg2]": (
        Tamper(
            "leg 2's final_loss is 1.0, its last logged loss not",
            _final_loss_not_the_last_logged("leg2"),
            also=VAL_NEAR,
        ),
    ),
    "logged_lines_agree_with_run_json[leg=leg1]": (
        Tamper("leg 1's RUN_JSON contradicts a logged line", _run_json_contradicts_a_logged_line("leg1")),
    ),
    "logged_lines_agree_with_run_json[leg=leg2]": (
        Tamper("leg 2's RUN_JSON contradicts a logged line", _run_json_contradicts_a_logged_line("leg2")),
    ),
    "peak_memory_figures_agree_with_the_ranks[leg=leg1]": (
        Tamper("leg 1's ranks peaked at [12.0, 14.2] under a max of 12.0", _peak_max_below_a_rank("leg1")),
    ),
    "peak_memory_figures_agree_with_the_ranks[leg=leg2]": (
        Tamper("leg 2's ranks peaked at [12.0, 14.2] under a max of 12.0", _peak_max_below_a_rank("leg2")),
    ),
    "every_logged_step_has_its_lr_and_batch[leg=leg1]": (
        Tamper("leg 1's last step has no lr", _lr_missing_at_the_last_step("leg1")),
    ),
    "every_logged_step_has_its_lr_and_batch[leg=leg2]": (
        Tamper("leg 2's last step has no lr", _lr_missing_at_the_last_step("leg2")),
    ),
    "lr_follows_the_schedule[leg=leg1]": (
        Tamper("leg 1 ran at 1.2 x the peak lr", _lrs_scaled("leg1", 1.2)),
        Tamper("leg 1's lr rose in the middle of the decay", _lr_spike_after_warmup("leg1")),
    ),
    "lr_follows_the_schedule[leg=leg2]": (
        Tamper("leg 2 resumed on 1.2 x the lr", _lrs_scaled("leg2", 1.2)),
        Tamper("leg 2's schedule restarted its warm-up at the resume", _schedule_restarted_at_the_resume),
    ),
    "no_batch_trained_twice_in_a_leg[leg=leg1]": (
        Tamper("leg 1's last step trained its first step's batch", _batch_repeated_in_leg("leg1")),
    ),
    "no_batch_trained_twice_in_a_leg[leg=leg2]": (
        Tamper("leg 2's last step trained its first step's batch", _batch_repeated_in_leg("leg2")),
    ),
    "stopped_leg_logged_each_step_up_to_the_stop_once[leg=leg1]": (
        Tamper(
            "leg 1 lost its last step (the stop)",
            _leg1_lost_its_last_step,
            also={**SUMMARY_LEG1, **LINES_LEG1},
        ),
        Tamper(
            "leg 1 also logged the step after its stop",
            _leg1_logged_past_its_stop,
            also={**SUMMARY_LEG1, **SERIES_LEG1},
        ),
    ),
    "next_leg_trained_other_batches_than_the_stopped_one[leg=leg1]": (
        Tamper("leg 2's data order restarted at the resume", _data_order_restarted_at_the_resume),
    ),
}


def _cases() -> list:
    cases = []
    for stem in SPECS:
        for name in check_names(stem):
            for i in range(len(TAMPERS.get(name, ()))):
                cases.append(pytest.param(stem, name, i, id=f"{stem}-{name}-{i}"))
    return cases


# ------------------------------------------------------------------ the bundles themselves


@pytest.mark.parametrize("stem", SPECS)
def test_saved_bundle_is_a_small_real_run(stem: str) -> None:
    bundle = EVIDENCE_DIR / stem
    doc = read_evidence(bundle)
    assert doc["spec"]["name"] == stem
    assert doc["spec"]["path"] == f"specs/{stem}.yaml"
    assert doc["verdict"]["outcome"] == "PASS" and doc["verdict"]["exit_code"] == 0
    # evidence.json and the raw logs only: no checkpoints, no train dirs, no re-check records.
    # (re-check records a local `engine check` leaves there are gitignored, not part of the bundle)
    kept = sorted(p.name for p in bundle.iterdir() if not re.match(r"(check|replay)-.*\.json$", p.name))
    assert kept == ["evidence.json", "logs"]
    logs = {doc["steps"][s]["log"] for s in doc["steps"] if doc["steps"][s].get("log")}
    assert logs and all((bundle / log).is_file() for log in logs), logs
    assert sorted(f"logs/{p.name}" for p in (bundle / "logs").iterdir()) == sorted(logs)
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert size < 1_000_000, f"{stem} bundle is {size} bytes"
    # Every run step really ran; both collects really collected.
    assert {s: st["status"] for s, st in doc["steps"].items() if st["kind"] == "collect"} == {
        "hub_after_leg1": "ok",
        "hub_after_leg2": "ok",
    }


@pytest.mark.parametrize("stem", SPECS)
def test_untampered_bundle_passes(stem: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bundle = copy_bundle(stem, tmp_path)
    got = engine_check(stem, bundle, capsys)
    assert got.rc == Exit.PASS
    assert got.record["verdict"]["outcome"] == "PASS" and got.record["verdict"]["failed"] == []
    assert [r["name"] for r in got.record["checks"]] == check_names(stem)
    allowed = {"PASS"} | ({"SKIPPED"} if stem == "p4_soak" else set())
    assert set(got.outcomes.values()) <= allowed, got.outcomes
    assert f"VERDICT {stem} PASS" in got.out


def test_soak_peak_gate_is_skipped_on_the_local_target(baselines: dict) -> None:
    # The only SKIPPED check: the local soak has no device memory to gate.
    skipped = {(s, n) for s in SPECS for n, o in baselines[s].items() if o == "SKIPPED"}
    assert skipped == {("p4_soak", "peak_memory_during_training_below_gate")}


@pytest.mark.parametrize("stem", SPECS)
def test_replay_re_harvests_the_saved_logs(stem: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The logs/ kept in the bundle are enough for `engine replay` to re-derive every harvest."""
    bundle = copy_bundle(stem, tmp_path)
    saved = read_evidence(bundle)
    rc = engine_main(["replay", str(SPECS_DIR / f"{stem}.yaml"), "--evidence", str(bundle)])
    capsys.readouterr()
    assert rc == Exit.PASS
    record = json.loads(next(bundle.glob("replay-*.json")).read_text(encoding="utf-8"))
    harvested = [n for n, st in saved["steps"].items() if st["kind"] == "run" and "harvest" in st]
    assert {"leg1", "leg2"} <= set(harvested)
    for name in harvested:
        step = saved["steps"][name]
        if step["kind"] == "run":
            assert record["steps"][name]["harvest"] == step["harvest"], name


@pytest.mark.parametrize("stem", SPECS)
def test_bundle_checks_from_another_checkout(
    stem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The evidence records this machine's absolute paths (run_dir, work_dir, python); a clone
    elsewhere (CI) must still re-check it with relative paths from its own root."""
    clone = tmp_path / "elsewhere" / "clone"
    shutil.copytree(SPECS_DIR, clone / "specs")
    shutil.copytree(EVIDENCE_DIR / stem, clone / "evidence" / stem)
    monkeypatch.chdir(clone)
    rc = engine_main(["check", f"specs/{stem}.yaml", "--evidence", f"evidence/{stem}"])
    out, err = capsys.readouterr()
    assert rc == Exit.PASS, err
    assert f"VERDICT {stem} PASS" in out
    assert len(list((clone / "evidence" / stem).glob("check-*.json"))) == 1


def test_bundles_check_like_ci_without_torch_or_trainer(tmp_path: Path) -> None:
    """CI installs only the engine's pure-Python dependencies: `engine check` on a clone elsewhere
    must pass with torch and trainer unimportable."""
    clone = tmp_path / "ci" / "checkout"
    shutil.copytree(SPECS_DIR, clone / "specs")
    shutil.copytree(EVIDENCE_DIR, clone / "evidence")
    script = (
        "import sys\n"
        "for m in ('torch', 'trainer', 'safetensors', 'huggingface_hub', 'numpy'):\n"
        "    sys.modules[m] = None\n"
        "from engine.cli import main\n"
        f"rcs = [main(['check', f'specs/{{s}}.yaml', '--evidence', f'evidence/{{s}}']) for s in {list(SPECS)!r}]\n"
        "print('RCS', rcs)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "RCS [0, 0, 0]" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    for stem in SPECS:
        assert f"VERDICT {stem} PASS" in proc.stdout


# ------------------------------------------------------------------ every check can fail


def test_every_check_has_a_tamper_case() -> None:
    """A new check without a tamper case (or a stale case for a removed check) fails here."""
    in_specs: set[str] = set()
    for stem in SPECS:
        names = check_names(stem)
        assert len(names) == len(set(names)), f"{stem}: duplicate check names"
        missing = [n for n in names if n not in TAMPERS]
        assert not missing, f"{stem}: checks without a tamper case: {missing}"
        in_specs.update(names)
    assert set(TAMPERS) == in_specs
    assert all(TAMPERS[n] for n in TAMPERS), "every check needs at least one tamper"


@pytest.mark.parametrize("stem,name,index", _cases())
def test_tampered_fact_fails_exactly_its_check(
    stem: str, name: str, index: int, tmp_path: Path, capsys: pytest.CaptureFixture, baselines: dict
) -> None:
    tamper = TAMPERS[name][index]
    bundle = copy_bundle(stem, tmp_path)
    doc = read_evidence(bundle)
    before = copy.deepcopy(doc)
    more = tamper.apply(doc) or {}
    assert doc != before, f"tamper {tamper.fact!r} changed nothing"
    write_evidence(bundle, doc)

    got = engine_check(stem, bundle, capsys)

    expected = {name: "FAIL", **{n: o for n, o in {**tamper.also, **more}.items() if n in check_names(stem)}}
    expected_fail = set(expected)
    flipped = {n: o for n, o in got.outcomes.items() if o != baselines[stem][n]}
    assert flipped == expected, f"{tamper.fact}: expected {expected} to flip, got {flipped}"
    for failed in expected_fail:
        result = got.result(failed)
        assert (result["missing"] == []) == (expected[failed] != "NO_DATA"), result["missing"]
    # The intended check says what it saw: a false (or non-true) value, with its operands.
    mine = got.result(name)
    assert mine["value"] is not True
    assert mine["explain"], "a failing check must explain its operands"
    assert got.rc == Exit.FAILED
    verdict = got.record["verdict"]
    assert verdict["outcome"] == "FAIL" and verdict["exit_code"] == Exit.FAILED
    failed_steps = {f"step:{n}" for n, s in doc["steps"].items() if s.get("status") == "failed"}
    assert sorted(verdict["failed"]) == sorted(expected_fail | failed_steps)
    assert f"VERDICT {stem} FAIL" in got.out and name in got.out


def test_soak_peak_gate_passes_at_and_below_the_gate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The control for the 13.7 GB case: the gate is `<=`, so 13.6 and 12.25 pass once armed."""
    for peak in (13.6, 12.25):
        bundle = copy_bundle("p4_soak", tmp_path / str(peak))
        doc = read_evidence(bundle)
        _arm_peak_gate(doc)
        run_json(doc, "leg1").update(
            peak_reserved_gb_max_rank=peak, peak_reserved_gb_by_rank=[peak, peak - 0.5], peak_gpu_gb_max_rank=peak - 1
        )
        write_evidence(bundle, doc)
        got = engine_check("p4_soak", bundle, capsys)
        assert got.result("peak_memory_during_training_below_gate")["outcome"] == "PASS", peak
        assert got.rc == Exit.PASS


def test_soak_peak_gate_armed_on_a_cpu_run_fails(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Armed on a run that measured nothing (peak null on CPU): a FAIL, not a silent pass."""
    bundle = copy_bundle("p4_soak", tmp_path)
    doc = read_evidence(bundle)
    assert run_json(doc, "leg1")["peak_reserved_gb_max_rank"] is None
    _arm_peak_gate(doc)
    write_evidence(bundle, doc)
    got = engine_check("p4_soak", bundle, capsys)
    result = got.result("peak_memory_during_training_below_gate")
    assert result["outcome"] == "FAIL" and result["value"] is None
    assert got.rc == Exit.FAILED


def test_restart_from_random_weights_is_caught_by_the_trajectory_check_in_soak(
    tmp_path: Path, capsys: pytest.CaptureFixture, baselines: dict
) -> None:
    """The check's own scenario (`why`): a restart from random weights jumps back up."""
    bundle = copy_bundle("p4_soak", tmp_path)
    doc = read_evidence(bundle)
    _leg2_restarted_from_random_weights(doc)
    write_evidence(bundle, doc)
    got = engine_check("p4_soak", bundle, capsys)
    flipped = {n for n, o in got.outcomes.items() if o != baselines["p4_soak"][n]}
    assert flipped == {"next_leg_continues_the_trajectory[leg=leg1]"}


def test_restart_from_random_weights_is_caught_by_the_trajectory_check_in_smoke(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bundle = copy_bundle("p4_smoke", tmp_path)
    doc = read_evidence(bundle)
    _leg2_restarted_from_random_weights(doc)
    write_evidence(bundle, doc)
    got = engine_check("p4_smoke", bundle, capsys)
    assert got.result("next_leg_continues_the_trajectory[leg=leg1]")["outcome"] == "FAIL"


def test_a_tampered_copy_leaves_the_saved_bundle_untouched(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    def snapshot() -> dict[str, str]:
        return {
            str(p.relative_to(EVIDENCE_DIR)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(EVIDENCE_DIR.rglob("*"))
            if p.is_file()
        }

    before = snapshot()
    bundle = copy_bundle("p4_smoke", tmp_path)
    doc = read_evidence(bundle)
    _leg1_one_step_late(doc)
    write_evidence(bundle, doc)
    assert engine_check("p4_smoke", bundle, capsys).rc == Exit.FAILED
    assert snapshot() == before
    assert read_evidence(EVIDENCE_DIR / "p4_smoke") != doc


# ------------------------------------------------------------------ missing data is NO_DATA

_PATH = re.compile(r"\b((?:steps|state|values)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _paths(expr: str | None) -> set[str]:
    return set(_PATH.findall(expr or ""))


def _read_paths(check: Mapping[str, Any], key: str) -> set[str]:
    """Evidence paths `check[key]` reads, through its lets: `let.store.files` with `store:
    "state.hub_after_leg1"` reads state.hub_after_leg1.files."""
    lets = dict(check.get("let") or {})
    plain = {n: t for n, t in lets.items() if re.fullmatch(r"[A-Za-z_][\w.]*", t)}

    def expand(text: str | None) -> str:
        for name, target in plain.items():
            text = re.sub(rf"\blet\.{name}\b", target, text or "")
        return text or ""

    texts = [check.get(key)] + (list(lets.values()) if key == "expr" else [])
    return set().union(*(_paths(expand(t)) for t in texts))


def _reads(path: str, deleted: str) -> bool:
    return path == deleted or path.startswith(deleted + ".")


def _deletions(stem: str) -> list[str]:
    """Every evidence path a check reads, plus its containers (the step, the collected state,
    the harvested RUN_JSON): each is deleted in turn."""
    out: set[str] = set()
    for check in _checks(stem):
        for path in _read_paths(check, "expr") | _read_paths(check, "when"):
            parts = path.split(".")
            if parts[0] == "values":
                continue  # `engine check` reads values from the spec, not from the evidence
            out.add(path)
            if parts[0] in ("steps", "state"):
                out.add(".".join(parts[:2]))
            if len(parts) > 3 and parts[2] == "harvest":
                out.add(".".join(parts[:4]))
    return sorted(out)


def _delete(doc: dict, dotted: str) -> None:
    *head, last = dotted.split(".")
    node = doc
    for key in head:
        node = node[key]
    assert last in node, f"{dotted} is not in the saved evidence"
    del node[last]


# Checks that pass a possibly-missing value into a typed function (length(), keys(), sub(), add(),
# mul()): jmespath raises a type error on the null, and the engine must still report the missing
# path as NO_DATA, not an ERROR about types. Each such check, with one deletion that shows it.
ERROR_ON_MISSING = {
    "next_leg_continues_the_trajectory[leg=leg1]": "steps.leg1.harvest.run_json.final_loss",  # sub()
    "loss_at_horizon_below_step_one": "steps.leg1.harvest.run_json.losses",  # mul(get(..))
    "leg1_was_killed_mid_push": "steps.leg1.signals_sent",  # length()
    "leg1_left_no_run_json": "steps.leg1.harvest_errors",  # length()
    "resumed_leg_logged_each_step_after_the_resume_once[leg=leg1]": "steps.leg2.harvest.run_json.losses",  # keys()
}


def _missing_outcome_ok(name: str, result: dict) -> bool:
    """Missing data is NO_DATA, whatever function it was fed to."""
    return result["outcome"] == "NO_DATA"


def _missing_cases() -> list:
    cases = []
    for stem in SPECS:
        for deleted in _deletions(stem):
            cases.append(pytest.param(stem, deleted, id=f"{stem}-del-{deleted}"))
    return cases


@pytest.mark.parametrize("stem,deleted", _missing_cases())
def test_missing_data_is_no_data(
    stem: str, deleted: str, tmp_path: Path, capsys: pytest.CaptureFixture, baselines: dict
) -> None:
    bundle = copy_bundle(stem, tmp_path)
    doc = read_evidence(bundle)
    _delete(doc, deleted)
    write_evidence(bundle, doc)

    got = engine_check(stem, bundle, capsys)

    affected = set()
    for check in _checks(stem):
        name = check["name"]
        base = baselines[stem][name]
        result = got.result(name)
        in_when = any(_reads(p, deleted) for p in _read_paths(check, "when"))
        in_expr = any(_reads(p, deleted) for p in _read_paths(check, "expr"))
        if in_when:
            # A `when` that cannot be read does not skip the gate: its data is missing.
            affected.add(name)
            assert result["outcome"] == "NO_DATA", (name, result)
            assert result["reason"] == f"when `{check['when']}`: no data: {result['missing'][0]} is missing"
            assert all(_reads(m, deleted) for m in result["missing"]), result["missing"]
        elif base == "SKIPPED":
            assert result["outcome"] == "SKIPPED", (name, result)  # `when` false: nothing is read
        elif in_expr:
            affected.add(name)
            assert _missing_outcome_ok(name, result), (name, result["outcome"], result["reason"])
            if result["outcome"] == "NO_DATA":
                assert result["missing"] and all(_reads(m, deleted) for m in result["missing"]), (
                    name,
                    result["missing"],
                )
                assert result["reason"].startswith(f"no data: {result['missing'][0]} is missing")
        else:
            assert result["outcome"] == base, (name, result["outcome"], result["reason"])
    if affected:
        assert got.rc == Exit.FAILED
        assert got.record["verdict"]["outcome"] == "FAIL"
        assert sorted(got.record["verdict"]["failed"]) == sorted(affected)
    else:
        assert got.rc == Exit.PASS


def test_null_is_data_absent_is_not(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Leg 1's val_ppl is a real `null` (validation skipped): reading it PASSes. Deleting the key
    turns the same check into NO_DATA, not a PASS and not a FAIL."""
    bundle = copy_bundle("p4_smoke", tmp_path / "null")
    assert run_json(read_evidence(bundle), "leg1")["val_ppl"] is None
    got = engine_check("p4_smoke", bundle, capsys)
    assert got.result("skipped_validation_by_design[leg=leg1]")["outcome"] == "PASS"

    bundle = copy_bundle("p4_smoke", tmp_path / "absent")
    doc = read_evidence(bundle)
    del run_json(doc, "leg1")["val_ppl"]
    write_evidence(bundle, doc)
    got = engine_check("p4_smoke", bundle, capsys)
    result = got.result("skipped_validation_by_design[leg=leg1]")
    assert result["outcome"] == "NO_DATA"
    assert result["missing"] == ["steps.leg1.harvest.run_json.val_ppl"]
    assert result["reason"] == "no data: steps.leg1.harvest.run_json.val_ppl is missing"
    assert got.rc == Exit.FAILED


def test_leg_without_run_json_is_no_data_for_every_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture, baselines: dict
) -> None:
    """What the engine records when leg 2 printed no RUN_JSON line at all (a crash after the last
    step): every check that reads leg 2's RUN_JSON is NO_DATA and names it."""
    bundle = copy_bundle("p4_smoke", tmp_path)
    doc = read_evidence(bundle)
    del doc["steps"]["leg2"]["harvest"]["run_json"]  # its progress lines stay: they were printed
    doc["steps"]["leg2"]["harvest_errors"] = [
        {"name": "run_json", "marker": "RUN_JSON ", "line": None, "error": "missing", "text": None}
    ]
    write_evidence(bundle, doc)
    got = engine_check("p4_smoke", bundle, capsys)
    readers = {
        c["name"]
        for c in _checks("p4_smoke")
        if any(_reads(p, "steps.leg2.harvest.run_json") for p in _read_paths(c, "expr"))
    }
    assert readers >= {
        "final_leg_reached_the_horizon",
        "horizon_tokens_match_the_arithmetic",
        "final_leg_validation_actually_ran",
        "loss_at_horizon_below_step_one",
        "no_nonfinite_loss[leg=leg2]",
        "next_leg_continues_the_trajectory[leg=leg1]",
    }
    not_pass = {n: o for n, o in got.outcomes.items() if o != baselines["p4_smoke"][n]}
    assert set(not_pass) == readers
    for name in readers:
        result = got.result(name)
        assert _missing_outcome_ok(name, result), (name, result["outcome"], result["reason"])
        if result["outcome"] == "NO_DATA":
            assert result["missing"][0].startswith("steps.leg2.harvest.run_json"), name
    assert set(not_pass.values()) == {"NO_DATA"}, not_pass
    assert got.rc == Exit.FAILED
    assert sorted(got.record["verdict"]["failed"]) == sorted(readers)


def _function_gap_cases() -> list:
    return [
        pytest.param(stem, name, ERROR_ON_MISSING[name], id=f"{stem}-{name}")
        for stem in SPECS
        for name in check_names(stem)
        if name in ERROR_ON_MISSING
    ]


def test_error_on_missing_names_real_checks() -> None:
    every = {n for stem in SPECS for n in check_names(stem)}
    assert set(ERROR_ON_MISSING) <= every


@pytest.mark.parametrize("stem,name,deleted", _function_gap_cases())
def test_missing_value_in_a_function_is_no_data(
    stem: str, name: str, deleted: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bundle = copy_bundle(stem, tmp_path)
    doc = read_evidence(bundle)
    _delete(doc, deleted)
    write_evidence(bundle, doc)
    got = engine_check(stem, bundle, capsys)
    assert got.rc == Exit.FAILED and name in got.record["verdict"]["failed"]
    result = got.result(name)
    assert result["outcome"] == "NO_DATA", (result["outcome"], result["reason"])
    assert result["reason"] == f"no data: {deleted} is missing" or result["reason"].startswith(f"no data: {deleted}")


# ------------------------------------------------------------------ absence asked with `null`

NO_RUN_JSON = """\
version: 1
name: p4_preempt
extends: {parent}
checks:
  - name: leg1_printed_no_run_json
    why: A SIGKILLed trainer cannot have reported; a RUN_JSON here would mean the kill landed after the run ended.
    expr: "steps.leg1.harvest.run_json == `null`"
"""


def _check_no_run_json(tmp_path: Path, bundle: Path, capsys: pytest.CaptureFixture) -> dict:
    spec = tmp_path / "no_run_json.yaml"
    spec.write_text(NO_RUN_JSON.format(parent=SPECS_DIR / "p4_preempt.yaml"))
    capsys.readouterr()
    before = set(bundle.glob("check-*.json"))
    rc = engine_main(["check", str(spec), "--evidence", str(bundle)])
    capsys.readouterr()
    assert rc != Exit.USAGE
    (new,) = set(bundle.glob("check-*.json")) - before
    record = json.loads(new.read_text(encoding="utf-8"))
    return next(r for r in record["checks"] if r["name"] == "leg1_printed_no_run_json")


def test_a_killed_leg_that_printed_no_run_json_is_asserted_with_null(tmp_path: Path, capsys: pytest.CaptureFixture):
    """The saved preempt run: leg 1 was SIGKILLed mid-push, its harvest rule matched no line, and the
    evidence records that (`harvest_errors`, kind missing). `== `null`` asks exactly that."""
    bundle = copy_bundle("p4_preempt", tmp_path / "as_saved")
    doc = read_evidence(bundle)
    assert "run_json" not in doc["steps"]["leg1"]["harvest"]
    result = _check_no_run_json(tmp_path, bundle, capsys)
    assert (result["outcome"], result["missing"]) == ("PASS", [])
    assert result["explain"] == [["steps.leg1.harvest.run_json", "<absent>"]]

    # The kill landed after the trainer reported: leg 1 has a RUN_JSON, and the check fails on it.
    bundle = copy_bundle("p4_preempt", tmp_path / "reported")
    doc = read_evidence(bundle)
    doc["steps"]["leg1"]["harvest"]["run_json"] = {"final_step": 20}
    doc["steps"]["leg1"]["harvest_errors"] = []
    write_evidence(bundle, doc)
    result = _check_no_run_json(tmp_path, bundle, capsys)
    assert (result["outcome"], result["explain"]) == ("FAIL", [["steps.leg1.harvest.run_json", '{"final_step":20}']])

    # Evidence that does not record the absence (its harvest_errors deleted) answers nothing: NO_DATA.
    bundle = copy_bundle("p4_preempt", tmp_path / "unrecorded")
    doc = read_evidence(bundle)
    del doc["steps"]["leg1"]["harvest_errors"]
    write_evidence(bundle, doc)
    result = _check_no_run_json(tmp_path, bundle, capsys)
    assert (result["outcome"], result["missing"]) == ("NO_DATA", ["steps.leg1.harvest.run_json"])
