"""Tampers of what the store holds after a leg, as the `hub` collector saw it (`state.hub_after_<leg>`): a
checkpoint pruned or missing files, a pointer stale, terminal or naming another checkpoint, bytes changed after
their upload, final/ published at a stop. Each edits a saved bundle's evidence in place; tests/tampers.py pairs
each with the check it must fail.

Import as `from tamper_store import ...` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import hashlib
from typing import Callable, Mapping

from bundles import first_resume, hub, val


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


def leg1_checkpoint_missing(d: dict) -> Mapping[str, str]:
    # In the smoke the first push is also the stop: the pointer's target went with it.
    target = _drop_checkpoint(hub(d, "hub_after_leg1"), val(d, "push_every"))
    return {**TARGET_READERS_AFTER_LEG1, "checkpoints_complete_after[leg=leg1]": "FAIL"} if target else {}


def leg1_pointer_stale(d: dict) -> None:
    # The pointer still names the push before the stop (0 = none yet, when stop1 == push_every).
    hub(d, "hub_after_leg1")["pointer"]["step"] = val(d, "stop1") - val(d, "push_every")


def leg1_pointer_names_an_older_complete_checkpoint(d: dict) -> None:
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


def leg1_pointer_terminal(d: dict) -> None:
    hub(d, "hub_after_leg1")["pointer"]["terminal"] = True


def final_not_pushed(d: dict) -> None:
    state = hub(d, "hub_after_leg2")
    state["has_final"] = False
    state["files"] = [f for f in state["files"] if not f.startswith("final/")]
    state["sha256"] = {k: v for k, v in state["sha256"].items() if not k.startswith("final/")}


def first_checkpoint_pruned(d: dict) -> None:
    _drop_checkpoint(hub(d, "hub_after_leg2"), val(d, "push_every"))


def horizon_pointer_not_terminal(d: dict) -> None:
    hub(d, "hub_after_leg2")["pointer"]["terminal"] = False


def horizon_pointer_stale(d: dict) -> None:
    hub(d, "hub_after_leg2")["pointer"]["step"] = val(d, "steps") - val(d, "push_every")


def horizon_pointer_names_a_ckpt(d: dict) -> None:
    hub(d, "hub_after_leg2")["pointer"]["path_in_repo"] = f"ckpt/checkpoint-{val(d, 'steps')}"


def horizon_target_torn(d: dict) -> None:
    _torn_model_file(hub(d, "hub_after_leg2"))


def pointer_step_right_path_of_the_killed_push(d: dict) -> Mapping[str, str]:
    # The pointer's step is the last verified one, but its path names the checkpoint whose push was
    # killed; the store's listing of that directory decides whether the retention check sees it too.
    state = hub(d, "hub_after_leg1")
    path = f"ckpt/checkpoint-{val(d, 'kill_step')}"
    state["pointer"]["path_in_repo"] = path
    complete = all(f"{path}/{n}" in state["files"] for n in ("optimizer.pt", "rng.pt", "model.safetensors"))
    return {} if complete else {"checkpoints_complete_after[leg=leg1]": "FAIL"}


def pointer_moved_before_verify(d: dict) -> None:
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


def kill_tore_the_pointer_target(d: dict) -> None:
    _torn_model_file(hub(d, "hub_after_leg1"))


def leg1_pointer_names_no_weights(d: dict) -> None:
    # A pointer written from a partial file list: the weights are not among the files it names, so
    # the collector (which looks up what the pointer names) has no hash for them either.
    state = hub(d, "hub_after_leg1")
    del state["pointer"]["files"]["model.safetensors"]
    for key in ("pointer_target_sha256", "pointer_target_sha256_stored"):
        state.get(key, {}).pop("model.safetensors", None)


def leg1_target_lost_its_weights(d: dict) -> Mapping[str, str]:
    state = hub(d, "hub_after_leg1")
    _lose_files(state, state["pointer"]["path_in_repo"], ("model.safetensors",))
    return {"checkpoints_complete_after[leg=leg1]": "FAIL", "pointer_target_read_back_intact_after[leg=leg1]": "FAIL"}


def leg1_oldest_checkpoint_kept_only_its_state(d: dict) -> Mapping[str, str]:
    # Pruning that went too far: the oldest checkpoint lists, but holds only trainer_state.json.
    state = hub(d, "hub_after_leg1")
    oldest = f"ckpt/checkpoint-{min(state['checkpoints'])}"
    names = tuple(
        n for n in ("model.safetensors", "config.json", "optimizer.pt", "rng.pt") if f"{oldest}/{n}" in state["files"]
    )
    return TARGET_READERS_AFTER_LEG1 if _lose_files(state, oldest, names) else {}


def leg1_newest_checkpoint_lost_optimizer_state(d: dict) -> Mapping[str, str]:
    state = hub(d, "hub_after_leg1")
    newest = f"ckpt/checkpoint-{max(state['checkpoints'])}"
    return TARGET_READERS_AFTER_LEG1 if _lose_files(state, newest, ("optimizer.pt", "rng.pt")) else {}


def horizon_first_checkpoint_kept_only_its_state(d: dict) -> None:
    _lose_files(
        hub(d, "hub_after_leg2"), f"ckpt/checkpoint-{val(d, 'push_every')}", ("model.safetensors", "config.json")
    )


def horizon_newest_checkpoint_lost_optimizer_state(d: dict) -> None:
    # The pointer names final/ at the horizon: the newest ckpt/ directory must keep its state anyway.
    _lose_files(hub(d, "hub_after_leg2"), f"ckpt/checkpoint-{val(d, 'steps')}", ("optimizer.pt", "rng.pt"))


def optimizer_state_left_behind(state_name: str) -> Callable[[dict], None]:
    """A prune that failed: an older checkpoint directory still lists optimizer.pt and rng.pt. The oldest
    checkpoint that is neither among the newest keep_optimizer_states nor the pointer's target, or, when
    the leg left only those, a directory before its first push that kept nothing else."""

    def apply(d: dict) -> None:
        state = hub(d, state_name)
        steps = sorted(state["checkpoints"])
        kept = set(steps[-val(d, "keep_optimizer_states") :]) | {state["pointer"]["path_in_repo"]}
        older = [s for s in steps if s not in kept and f"ckpt/checkpoint-{s}" not in kept]
        step = older[0] if older else steps[0] // 2
        for name in ("optimizer.pt", "rng.pt"):
            path = f"ckpt/checkpoint-{step}/{name}"
            assert path not in state["files"], path
            state["files"].append(path)
            state["sha256"][path] = hashlib.sha256(path.encode()).hexdigest()

    return apply


def final_lost_its_rng_state(d: dict) -> None:
    assert _lose_files(hub(d, "hub_after_leg2"), "final", ("rng.pt",))


def horizon_pointer_names_no_weights(d: dict) -> None:
    state = hub(d, "hub_after_leg2")
    del state["pointer"]["files"]["model.safetensors"]
    for key in ("pointer_target_sha256", "pointer_target_sha256_stored"):
        state.get(key, {}).pop("model.safetensors", None)


def horizon_target_lost_its_weights(d: dict) -> None:
    assert _lose_files(hub(d, "hub_after_leg2"), "final", ("model.safetensors",))


def stored_object_damaged_after_upload(state_name: str) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        # The bytes under the pointer's target changed after the upload: the listing still gives the
        # hash recorded then, only reading the bytes back shows it.
        state = hub(d, state_name)
        state["pointer_target_sha256_stored"]["model.safetensors"] = hashlib.sha256(b"bit rot").hexdigest()

    return apply


def final_published_at_the_stop(d: dict) -> None:
    # The trainer pushed final/ (all of it, the collector says so) at the stop, not only at the horizon.
    state = hub(d, f"hub_after_{first_resume(d)['leg']}")
    target = state["pointer"]["path_in_repo"]
    state["has_final"] = True
    for name in ("config.json", "model.safetensors", "trainer_state.json", "optimizer.pt", "rng.pt"):
        state["files"].append(f"final/{name}")
        state["sha256"][f"final/{name}"] = state["sha256"][f"{target}/{name}"]
    state["files"].sort()


def final_listed_at_the_stop(d: dict) -> None:
    # The collector's flag says no final/, but the listing shows its weights.
    state = hub(d, f"hub_after_{first_resume(d)['leg']}")
    state["files"] = sorted(state["files"] + ["final/model.safetensors"])
    state["sha256"]["final/model.safetensors"] = hashlib.sha256(b"half-trained").hexdigest()


def horizon_rng_not_the_references(d: dict) -> None:
    # Rank 1's RNG state at the horizon is not the reference's: the resume lost it (no loss moves yet).
    compared = d["state"][f"{val(d, 'final_leg')}_vs_reference"]
    compared.update(close=False, equal=False, not_close_groups=["rng"], differing_groups=["rng"])
    compared["first_not_close"] = {"group": "rng", "name": "rank1.cpu", "index": 5, "a": 17, "b": 203}


def horizon_checkpoint_missing_for_the_comparison(d: dict) -> None:
    # The leg left no checkpoint at the horizon where the comparison looks: its document is an error, and
    # there was nothing to hash.
    compared = d["state"][f"{val(d, 'final_leg')}_vs_reference"]
    compared.update(error=f"{compared['a']}: a p4 checkpoint is a folder, and there is no such folder", close=False)
    compared.update(a_sha256=None, a_sha256_error=f"{compared['a']}: No such file or directory")


def horizon_weights_hold_another_count(d: dict) -> None:
    # The checkpoint at the horizon holds one more d_model-wide row than the trainer's count says (a head saved
    # apart from the embedding it is tied to, say); the trainer still reports the expected count.
    model = d["state"][f"{val(d, 'final_leg')}_vs_reference"]["groups"]["model"]
    model["numel"]["a"] += 64


def horizon_weights_compared_are_not_the_stored(d: dict) -> None:
    # final/ in the store holds other weights than the local checkpoint that was compared with the reference (a
    # stale folder pushed); the pointer recorded the hashes of what was pushed, so the store agrees with itself.
    compared = d["state"][f"{val(d, 'final_leg')}_vs_reference"]
    compared["a_sha256"]["model.safetensors"] = hashlib.sha256(b"the weights trained to the horizon").hexdigest()
