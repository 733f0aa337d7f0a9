"""Where a session resumes over a real LocalStore: from the pointer, from the newest checkpoint that verifies
when the pointer is gone, or a refusal naming why (a missing or changed file, a terminal pointer, another
configuration, a malformed or inconsistent pointer, a pointer moved back); the config hash it compares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoints import CH, OTHER, RUN_CONFIG, Recorder, content, fake_checkpoint, push
from trainer_helpers import IDENTITY

from trainer.ckpt.checkpointer import (
    CHECKPOINT_FILES,
    Checkpointer,
    read_pointer,
    seal_trainer_state,
)
from trainer.ckpt.scan import ResumeRefused, ResumeScan, fetch
from trainer.runconfig import RunIdentity, config_hash, judge_config_change
from trainer.store import StoreError, sha256_file
from trainer.store.url import open_store

# ----------------------------------------------------------------------------------------- resume


def test_resume_creates_a_missing_repo_and_starts_fresh(tmp_path):
    s = open_store(f"file://{tmp_path}/o/new-repo")
    log = Recorder()
    assert ResumeScan(Checkpointer(s, log=log)).decide(identity=IDENTITY, horizon_step=20) is None
    assert s.exists()
    assert log.lines == [f"auto-resume: repo missing, created file://{tmp_path}/o/new-repo, fresh start"]


def test_resume_must_refuses_a_missing_repo_and_creates_nothing(tmp_path):
    s = open_store(f"file://{tmp_path}/o/new-repo")
    with pytest.raises(ResumeRefused) as e:
        ResumeScan(Checkpointer(s, log=Recorder())).decide(identity=IDENTITY, horizon_step=20, require_run=True)
    assert str(e.value).startswith(f"--resume must: repo file://{tmp_path}/o/new-repo does not exist")
    assert "Nothing was created" in str(e.value) and "--resume auto" in str(e.value)
    assert not s.exists()


def test_resume_must_refuses_a_repo_without_a_run(store):
    with pytest.raises(ResumeRefused, match=r"--resume must: .* holds no run \(no latest.json, no checkpoint\)"):
        ResumeScan(Checkpointer(store, log=Recorder())).decide(identity=IDENTITY, horizon_step=20, require_run=True)
    assert not any(p.startswith(("ckpt/", "latest.json")) for p in store.list_files())


def test_resume_must_resumes_from_the_pointer_like_auto(store, tmp_path):
    push(Checkpointer(store, log=Recorder()), tmp_path, 10)
    scan = ResumeScan(Checkpointer(store, log=Recorder()))
    assert scan.decide(identity=IDENTITY, horizon_step=20, require_run=True).step == 10


def test_resume_from_an_empty_repo_starts_fresh(store):
    log = Recorder()
    assert ResumeScan(Checkpointer(store, log=log)).decide(identity=IDENTITY, horizon_step=20) is None
    assert log.lines == [f"auto-resume: no pointer in {store.url}, fresh start"]


def test_resume_returns_the_pointer_and_fetch_restores_the_files(store, tmp_path):
    pushed = push(Checkpointer(store, log=Recorder()), tmp_path, 10)
    log = Recorder()
    ck = Checkpointer(store, log=log)
    pointer = ResumeScan(ck).decide(identity=IDENTITY, horizon_step=20)
    assert pointer == pushed and log.lines == ["auto-resume: pointer step=10 path=ckpt/checkpoint-10"]
    dest = fetch(ck.store, pointer, tmp_path / "cold")
    for name in CHECKPOINT_FILES:
        assert (dest / name).read_bytes() == (tmp_path / "local/checkpoint-10" / name).read_bytes()


def refused(store, **kw) -> str:
    with pytest.raises(ResumeRefused) as e:
        ResumeScan(Checkpointer(store, log=Recorder())).decide(**{"identity": IDENTITY, "horizon_step": 20, **kw})
    return str(e.value)


def replace_in_store(store, path: str, data: bytes, tmp_path: Path) -> None:
    """Change what the store holds at ``path`` (a consistent commit, but not what the checkpoint recorded)."""
    store.commit({path: _write(tmp_path / "replacement", data)})


def test_history_without_a_pointer_resumes_from_the_newest_checkpoint_that_verifies(store, tmp_path):
    ck = Checkpointer(store, log=Recorder(), prune=False)
    push(ck, tmp_path, 10)
    push(ck, tmp_path, 20)
    store.commit({}, delete=["latest.json"])
    replace_in_store(store, "ckpt/checkpoint-20/rng.pt", b"not what step 20 saved", tmp_path)
    log = Recorder()
    pointer = ResumeScan(Checkpointer(store, log=log)).decide(identity=IDENTITY, horizon_step=30)
    assert (pointer.step, pointer.path_in_repo, pointer.tokens, pointer.terminal) == (
        10,
        "ckpt/checkpoint-10",
        1280,
        False,
    )
    assert read_pointer(store) == pointer  # the pointer was moved there, durably
    assert pointer.files == {n: sha256_file(tmp_path / "local/checkpoint-10" / n) for n in CHECKPOINT_FILES}
    recovered = [line for line in log.lines if "has no latest.json" in line]
    assert len(recovered) == 1 and "ckpt/checkpoint-10 verifies (5 files re-hashed" in recovered[0]
    assert "ckpt/checkpoint-20: rng.pt stored sha256" in recovered[0]  # and why the newer one did not
    assert log.lines[-2:] == [
        "latest.json -> step=10 path=ckpt/checkpoint-10 (recovered)",
        "auto-resume: pointer step=10 path=ckpt/checkpoint-10",
    ]


def test_history_without_a_pointer_refuses_when_no_checkpoint_verifies_saying_why_for_each(store, tmp_path):
    ck = Checkpointer(store, log=Recorder())  # prune on: step 10 loses its optimizer state
    push(ck, tmp_path, 10)
    push(ck, tmp_path, 20)
    store.commit({}, delete=["latest.json"])
    replace_in_store(store, "ckpt/checkpoint-20/model.safetensors", b"truncated", tmp_path)
    msg = refused(store)
    assert f"{store.url} has no latest.json and none of its checkpoints verifies" in msg
    assert "ckpt/checkpoint-20: model.safetensors stored sha256 " in msg and "trainer_state.json records" in msg
    assert "ckpt/checkpoint-10: optimizer.pt, rng.pt missing (pruned" in msg
    # Nothing of it is advised deleted; a way to resume from a chosen checkpoint is named, with its folder.
    assert "delete" not in msg.lower() and "Nothing in " in msg
    assert f"resume from a checkpoint you choose: run with --resume {store.dir}/ckpt/checkpoint-<step>" in msg
    assert read_pointer(store) is None  # nothing written on a refusal


@pytest.mark.parametrize(
    "tamper,needle",
    [
        (lambda d: {**d, "tokens_consumed": d["tokens_consumed"] + 1}, "does not match its own manifest_sha256"),
        (lambda d: {k: v for k, v in d.items() if k not in ("files", "manifest_sha256")}, "records no file hashes"),
    ],
)
def test_a_checkpoint_whose_own_record_was_altered_never_verifies(store, tmp_path, tamper, needle):
    ck = Checkpointer(store, log=Recorder())
    push(ck, tmp_path, 10)
    store.commit({}, delete=["latest.json"])
    state = json.loads(store.read_bytes("ckpt/checkpoint-10/trainer_state.json"))
    replace_in_store(store, "ckpt/checkpoint-10/trainer_state.json", json.dumps(tamper(state)).encode(), tmp_path)
    msg = refused(store)
    assert "ckpt/checkpoint-10: trainer_state.json" in msg and needle in msg


def test_resume_refuses_a_pointer_whose_file_is_missing(store, tmp_path):
    push(Checkpointer(store, log=Recorder(), prune=False), tmp_path, 20)
    store.commit({}, delete=["ckpt/checkpoint-20/optimizer.pt"])
    msg = refused(store)
    assert msg.startswith(
        f"latest.json points at ckpt/checkpoint-20 but the listing of {store.url} does not show "
        "ckpt/checkpoint-20/optimizer.pt (listed 1 time(s); a Hub listing can lag behind the commit that added a "
        "file). Refusing to start fresh over a repo with history."
    )
    assert "delete" not in msg.lower() and msg.endswith(f"Nothing in {store.url} was changed.")


def test_resume_refuses_a_pointer_whose_file_changed(store, tmp_path):
    push(Checkpointer(store, log=Recorder()), tmp_path, 10)
    fake_checkpoint(tmp_path / "other", 99)
    store.commit({"ckpt/checkpoint-10/rng.pt": tmp_path / "other/rng.pt"})
    msg = refused(store)
    assert "ckpt/checkpoint-10/rng.pt" in msg and "the pointer says" in msg and "changed after it was verified" in msg


def test_resume_refuses_a_terminal_pointer_saying_finished_or_asked_further(store, tmp_path):
    ck = Checkpointer(store, log=Recorder())
    push(ck, tmp_path, 20, final=True)
    finished = refused(store, horizon_step=20)
    assert "already finished at step 20 (final)" in finished and "Use a new repo" in finished
    further = refused(store, horizon_step=40)
    assert "finished at step 20" in further and "train further, to step 40" in further


def test_resume_refuses_a_config_hash_mismatch_naming_both(store, tmp_path):
    push(Checkpointer(store, log=Recorder()), tmp_path, 10)
    msg = refused(store, identity=OTHER)
    assert CH in msg and OTHER.hash in msg and "original configuration" in msg


def test_resume_refuses_a_pointer_past_the_horizon(store, tmp_path):
    push(Checkpointer(store, log=Recorder()), tmp_path, 30)
    msg = refused(store, horizon_step=20)
    assert "step 30" in msg and "horizon step 20" in msg


def test_resume_refuses_a_malformed_pointer(store, tmp_path):
    store.commit({"latest.json": _write(tmp_path / "l.json", b'{"format": "specprobe-pointer/1", "step": "ten"}')})
    msg = refused(store)
    assert "latest.json" in msg and "refusing to guess" in msg


def _write(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"not json", "not valid JSON"),
        (b"[1]", "must be a JSON object"),
        (b'{"format": "other/9"}', "format 'other/9'"),
        (b'{"format": "specprobe-pointer/1", "step": true}', "field 'step': must be an integer, got True"),
    ],
)
def test_read_pointer_rejects_malformed_content_naming_latest_json(store, tmp_path, content, needle):
    store.commit({"latest.json": _write(tmp_path / "l", content)})
    with pytest.raises(ValueError, match="latest.json in file://") as e:
        read_pointer(store)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda d: d.update(step=2**60), "field 'step': 1152921504606846976 is out of range [0, 9007199254740992]"),
        (lambda d: d.update(tokens=2**70), "an integer of 22 digits"),
        (lambda d: d.update(tokens=-1), "field 'tokens': -1 is out of range"),
        (lambda d: d.update(path_in_repo="../../elsewhere"), "'../../elsewhere' is not a checkpoint folder"),
        (lambda d: d.update(path_in_repo=".specprobe"), "'.specprobe' is not a checkpoint folder"),
        (lambda d: d["files"].update({"..": "0" * 64}), "field 'files...': must map a file name in the folder"),
        (lambda d: d.update(time="now\nrefused: forged"), "field 'time': holds a control character"),
        (lambda d: d.update(config_hash="x" * 10_000), "field 'config_hash': is 10,000 characters long, more than 128"),
        (lambda d: d.update(revision="HEAD~1"), "field 'revision': 'HEAD~1' does not have the form"),
        (lambda d: d.update(terminal="yes"), "field 'terminal': must be true or false, got 'yes'"),
        (lambda d: d.update(previous={"step": 4, "path_in_repo": "/etc"}), "'previous.path_in_repo': '/etc' is not"),
        (lambda d: d.update(previous={"step": float("nan"), "path_in_repo": "final"}), "NaN is not a JSON number"),
    ],
)
def test_a_pointer_field_of_the_wrong_type_or_range_is_refused_naming_it(store, tmp_path, change, needle):
    doc = push(Checkpointer(store, log=Recorder()), tmp_path, 10).to_json()
    change(doc)
    commit_pointer(store, tmp_path, doc)
    with pytest.raises(ValueError) as e:
        read_pointer(store)
    assert f"latest.json in {store.url}" in str(e.value) and needle in str(e.value), str(e.value)
    assert "refusing to guess" in refused(store)


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda d: d.update(step=2**60), "field 'step': 1152921504606846976 is out of range"),
        (lambda d: d.update(tokens_consumed="1280"), "field 'tokens_consumed': must be an integer, got '1280'"),
        (lambda d: d.update(config_hash=["a"]), "field 'config_hash': must be a string"),
    ],
)
def test_a_checkpoint_record_with_a_field_out_of_range_never_verifies(store, tmp_path, change, needle):
    """Sealed again after the change: the seal holds, the fields do not."""
    push(Checkpointer(store, log=Recorder()), tmp_path, 10)
    store.commit({}, delete=["latest.json"])
    state = json.loads(store.read_bytes("ckpt/checkpoint-10/trainer_state.json"))
    files = state.pop("files")
    state.pop("manifest_sha256")
    change(state)
    raw = json.dumps(seal_trainer_state(state, files)).encode()
    replace_in_store(store, "ckpt/checkpoint-10/trainer_state.json", raw, tmp_path)
    msg = refused(store)
    assert "ckpt/checkpoint-10: trainer_state.json" in msg and needle in msg, msg


def test_read_pointer_is_none_when_absent(store):
    assert read_pointer(store) is None


# ------------------------------------------------------------------------------------ config hash


def test_config_hash_is_canonical_and_covers_only_the_resume_fields():
    shuffled = dict(reversed(list(RUN_CONFIG.items())))
    assert config_hash(shuffled) == CH and len(CH) == 64
    assert config_hash({**RUN_CONFIG, "push_every": 99, "log_every": 3}) == CH
    for key, value in (
        ("mix", "1" * 64),
        ("seq_len", 128),
        ("world_size", 2),
        ("seed", 2),
        ("tokens", 5120),
        ("min_lr", 0.0),
        ("warmup_steps", 0),
        ("weight_decay", 0.0),
        ("grad_clip", 0.5),
        ("precision", "bf16"),
    ):
        assert config_hash({**RUN_CONFIG, key: value}) != CH
    with pytest.raises(ValueError, match="lacks \\['schedule'\\]"):
        config_hash({k: v for k, v in RUN_CONFIG.items() if k != "schedule"})


def test_a_checkpoint_written_before_the_mix_was_part_of_the_identity_names_it_absent():
    before = {k: v for k, v in RUN_CONFIG.items() if k != "mix"}
    with pytest.raises(ValueError) as refused:
        judge_config_change(before, "h", IDENTITY, frozenset(), "ckpt/checkpoint-4")
    assert f'(changed: mix: (absent) -> "{RUN_CONFIG["mix"]}")' in str(refused.value)
    assert "resume with --allow-config-change mix" in str(refused.value)
    allowed = judge_config_change(before, "h", IDENTITY, frozenset({"mix"}), "ckpt/checkpoint-4")
    assert allowed == [{"field": "mix", "old": None, "new": RUN_CONFIG["mix"]}]


# ------------------------------------------------------------------- pointer history and cross-checks


def commit_pointer(store, tmp_path: Path, doc: dict) -> None:
    store.commit({"latest.json": _write(tmp_path / "forged-latest.json", json.dumps(doc).encode())})


def test_the_pointer_records_its_checkpoint_revision_and_the_pointer_it_replaced(store, tmp_path):
    ck = Checkpointer(store, log=Recorder())
    first = push(ck, tmp_path, 10)
    log = json.loads((store.dir / ".specprobe/manifest.json").read_text())["log"]
    assert first.previous is None and first.revision == next(
        e["revision_id"] for e in log if e["message"] == "checkpoint step 10 -> ckpt/checkpoint-10"
    )
    second = push(ck, tmp_path, 20)
    assert second.previous == {
        "step": 10,
        "path_in_repo": "ckpt/checkpoint-10",
        "revision": first.revision,
        "time": first.time,
    }
    assert read_pointer(store) == second and second.backward is False


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("tokens", 999, "tokens: pointer 999, trainer_state.json 1280"),
        ("step", 12, "says step 12 but points at ckpt/checkpoint-10"),
        ("config_hash", OTHER.hash, "config_hash: pointer"),
    ],
)
def test_a_pointer_that_disagrees_with_its_checkpoints_trainer_state_is_refused(store, tmp_path, field, value, needle):
    pointer = push(Checkpointer(store, log=Recorder()), tmp_path, 10)
    commit_pointer(store, tmp_path, {**pointer.to_json(), field: value})
    msg = refused(store, identity=OTHER if field == "config_hash" else IDENTITY)
    assert needle in msg, msg


def test_a_pointer_for_final_with_another_step_than_its_trainer_state_is_refused(store, tmp_path):
    ck = Checkpointer(store, log=Recorder())
    push(ck, tmp_path, 20)
    final = push(ck, tmp_path, 20, final=True)
    commit_pointer(store, tmp_path, {**final.to_json(), "step": 10, "terminal": False, "previous": None})
    assert "step: pointer 10, trainer_state.json 20" in refused(store)


def test_a_push_that_would_move_the_pointer_back_is_refused_before_uploading(store, tmp_path):
    ck = Checkpointer(store, log=Recorder())
    push(ck, tmp_path, 10)
    push(ck, tmp_path, 20)
    stale = Checkpointer(store, log=Recorder())  # e.g. a session resumed from a local step-15 folder
    with pytest.raises(
        StoreError,
        match=r"latest.json is at step 20 \(ckpt/checkpoint-20\); moving it back to step "
        r"15 .* would fork the run. Nothing was pushed",
    ):
        push(stale, tmp_path, 15)
    assert read_pointer(store).step == 20 and not any("checkpoint-15" in p for p in content(store))
    allowed = Checkpointer(store, log=(log := Recorder()), allow_rollback=True)
    back = push(allowed, tmp_path, 15)
    assert (back.step, back.backward, back.previous["step"]) == (15, True, 20)
    assert (
        "latest.json -> step=15 path=ckpt/checkpoint-15 (moved BACK from step 20, allowed by "
        "--allow-pointer-rollback)" in log.lines
    )
    # Marked as an allowed move, it resumes without the flag.
    assert ResumeScan(Checkpointer(store, log=Recorder())).decide(identity=IDENTITY, horizon_step=30).step == 15


def test_a_pointer_that_moved_backwards_is_refused_unless_allowed(store, tmp_path):
    ck = Checkpointer(store, log=Recorder(), prune=False)
    ten = push(ck, tmp_path, 10)
    twenty = push(ck, tmp_path, 20)
    # Something rewrote latest.json to step 10 recording the step-20 pointer it replaced (not through push).
    commit_pointer(store, tmp_path, {**ten.to_json(), "previous": twenty.summary()})
    msg = refused(store)
    assert "moved backwards: it is at step 10 (ckpt/checkpoint-10) but the pointer it replaced was at step 20" in msg
    assert "drop steps 11..20" in msg and "--allow-pointer-rollback" in msg
    log = Recorder()
    pointer = ResumeScan(Checkpointer(store, log=log, allow_rollback=True)).decide(identity=IDENTITY, horizon_step=30)
    assert pointer.step == 10
    assert any(
        "moved back from step 20 to 10; resuming from it as --allow-pointer-rollback asks" in line for line in log.lines
    )


def test_a_newer_checkpoint_that_verifies_is_named_with_the_one_the_resume_uses_and_why(store, tmp_path):
    ck = Checkpointer(store, log=Recorder())
    push(ck, tmp_path, 10)
    d = tmp_path / "orphan"
    store.commit({f"ckpt/checkpoint-20/{n}": d / n for n in fake_checkpoint(d, 20)})  # pushed, never pointed at
    log = Recorder()
    assert ResumeScan(Checkpointer(store, log=log)).decide(identity=IDENTITY, horizon_step=30).step == 10
    note = next(line for line in log.lines if line.startswith("auto-resume: note: "))
    assert note.startswith(
        "auto-resume: note: ckpt/checkpoint-20 newer than latest.json (step 10); ckpt/checkpoint-20 verifies (5 files "
        "re-hashed from the stored bytes match what it recorded). Resuming from latest.json's ckpt/checkpoint-10: a "
        "checkpoint is the run's only once latest.json names it"
    ), note
    assert "Steps 11..20 are trained again, from the same batches" in note
    assert note.endswith(f"To resume from ckpt/checkpoint-20 instead: run with --resume {store.dir}/ckpt/checkpoint-20")


def test_a_newer_checkpoint_that_does_not_verify_is_named_with_why(store, tmp_path):
    push(Checkpointer(store, log=Recorder()), tmp_path, 10)
    d = tmp_path / "orphan"
    store.commit({f"ckpt/checkpoint-20/{n}": d / n for n in fake_checkpoint(d, 20)})
    replace_in_store(store, "ckpt/checkpoint-20/rng.pt", b"cut", tmp_path)
    log = Recorder()
    assert ResumeScan(Checkpointer(store, log=log)).decide(identity=IDENTITY, horizon_step=30).step == 10
    note = next(line for line in log.lines if line.startswith("auto-resume: note: "))
    assert "ckpt/checkpoint-20 does not verify (rng.pt stored sha256 " in note
    assert "Resuming from latest.json's ckpt/checkpoint-10" in note


@pytest.mark.parametrize("allow_rollback", [False, True])
def test_a_pointer_moved_back_with_its_history_removed_resumes_from_it_saying_only_what_is_known(
    store, tmp_path, allow_rollback
):
    """latest.json rewritten to step 10 with its `previous` (the step-20 pointer it replaced) removed: nothing
    in the store tells this from a session that pushed step 20 and stopped before its pointer. The note says
    both, claims neither, and says which checkpoint the resume uses and why; --allow-pointer-rollback changes
    nothing (no recorded move back to allow)."""
    ck = Checkpointer(store, log=Recorder(), prune=False)
    ten = push(ck, tmp_path, 10)
    push(ck, tmp_path, 20)
    commit_pointer(store, tmp_path, {**ten.to_json(), "previous": None})
    log = Recorder()
    scan = ResumeScan(Checkpointer(store, log=log, allow_rollback=allow_rollback))
    assert scan.decide(identity=IDENTITY, horizon_step=30).step == 10
    note = next(line for line in log.lines if line.startswith("auto-resume: note: "))
    assert note.startswith(
        "auto-resume: note: ckpt/checkpoint-20 newer than latest.json (step 10); ckpt/checkpoint-20 verifies (5 files "
        "re-hashed from the stored bytes match what it recorded). Resuming from latest.json's ckpt/checkpoint-10"
    ), note
    assert "or latest.json was moved back from it" in note and "pushed but never pointed at" not in note
    assert "Steps 11..20 are trained again, from the same batches, and the push of step 20 replaces it" in note
    assert not any("moved back from step" in line for line in log.lines)  # no recorded move to allow


def test_a_run_identity_carries_its_configs_hash_and_cannot_be_given_another():
    assert IDENTITY.hash == config_hash(RUN_CONFIG) and OTHER.hash != IDENTITY.hash
    with pytest.raises(TypeError):
        RunIdentity(RUN_CONFIG, "0" * 64)  # the hash is computed, never passed
    config = dict(RUN_CONFIG)
    held = RunIdentity(config)
    config["lr"] = 1.0  # the caller's dict changes later: the identity keeps the config its hash is of
    assert held.config == RUN_CONFIG and held.hash == IDENTITY.hash
    with pytest.raises(ValueError, match="lacks \\['seed'\\]"):
        RunIdentity({k: v for k, v in RUN_CONFIG.items() if k != "seed"})
