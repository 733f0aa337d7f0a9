"""The checkpoint protocol over a real LocalStore: push -> verify -> pointer -> prune, resume, fetch."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from trainer_helpers import IDENTITY, RUN_CONFIG

from trainer.ckpt.checkpointer import (
    CHECKPOINT_FILES,
    Checkpointer,
    Pointer,
    prune_local,
    prune_plan,
    read_pointer,
    seal_trainer_state,
    write_checkpoint_dir,
)
from trainer.ckpt.scan import ResumeRefused, ResumeScan, fetch
from trainer.runconfig import RunIdentity, config_hash, judge_config_change
from trainer.store import LocalStore, MetadataMissing, StoreError, sha256_file
from trainer.store.lease import LEASE_PATH
from trainer.store.url import open_store

REPO_ROOT = Path(__file__).resolve().parents[2]
CH = IDENTITY.hash
# Another run: the same but for its learning rate.
OTHER = RunIdentity({**RUN_CONFIG, "lr": 6e-4})


def fake_checkpoint(dir_: Path, step: int, tokens: int | None = None, *, size: int = 64) -> dict[str, str]:
    """The five checkpoint files with small, step-specific contents; trainer_state.json sealed like the real one."""
    dir_.mkdir(parents=True, exist_ok=True)
    for name in CHECKPOINT_FILES:
        if name != "trainer_state.json":
            (dir_ / name).write_bytes(f"{name} at step {step}\n".encode() + os.urandom(size))
    others = {n: sha256_file(dir_ / n) for n in CHECKPOINT_FILES if n != "trainer_state.json"}
    state = {"step": step, "tokens_consumed": step * 128 if tokens is None else tokens, "config_hash": CH}
    (dir_ / "trainer_state.json").write_text(json.dumps(seal_trainer_state(state, others), indent=1))
    return {name: sha256_file(dir_ / name) for name in CHECKPOINT_FILES}


class Recorder:
    """The protocol lines; the lease's own lines (``lease: ...``) apart."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.lease: list[str] = []

    def __call__(self, line: str) -> None:
        (self.lease if line.startswith("lease: ") else self.lines).append(line)


def content(store) -> list[str]:
    """The repo's files, without the writer's lease."""
    return sorted(p for p in store.list_files() if p != LEASE_PATH)


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    s = open_store(f"file://{tmp_path}/store/probe/ckpt-x")
    s.create()
    return s


def push(ck: Checkpointer, tmp_path: Path, step: int, *, final: bool = False, tokens: int | None = None) -> Pointer:
    d = tmp_path / "local" / f"checkpoint-{step}{'-final' if final else ''}"
    tokens = step * 128 if tokens is None else tokens
    files = fake_checkpoint(d, step, tokens)
    return ck.push(step, d, files, tokens=tokens, config_hash=CH, final=final)


# ------------------------------------------------------------------------------------------- push


def test_push_runs_push_verify_pointer_prune_in_order_and_writes_the_pointer(store, tmp_path):
    log = Recorder()
    ck = Checkpointer(store, log=log)
    pointer = push(ck, tmp_path, 10)

    assert [line.split(" step=")[0] for line in log.lines] == [
        "CKPT push",
        "CKPT pushed",
        "CKPT verify",
        "latest.json ->",
        "CKPT prune",
    ]
    assert log.lines[0] == "CKPT push step=10 -> ckpt/checkpoint-10"
    assert log.lines[1].startswith("CKPT pushed step=10 revision=") and " seconds=" in log.lines[1]
    assert log.lines[2:] == [
        "CKPT verify step=10 ok files=5",
        "latest.json -> step=10 path=ckpt/checkpoint-10",
        "CKPT prune step=10 removed=[]",
    ]
    assert content(store) == sorted([f"ckpt/checkpoint-10/{n}" for n in CHECKPOINT_FILES] + ["latest.json"])

    doc = json.loads(store.read_bytes("latest.json"))
    assert doc["format"] == "specprobe-pointer/1"
    assert {k: doc[k] for k in ("step", "path_in_repo", "tokens", "config_hash", "terminal")} == {
        "step": 10,
        "path_in_repo": "ckpt/checkpoint-10",
        "tokens": 1280,
        "config_hash": CH,
        "terminal": False,
    }
    assert doc["files"] == {n: store.list_files()[f"ckpt/checkpoint-10/{n}"].sha256 for n in CHECKPOINT_FILES}
    assert doc["time"].endswith("Z") and read_pointer(store) == pointer


def test_push_is_one_commit_and_the_pointer_another(store, tmp_path):
    push(Checkpointer(store, log=Recorder(), prune=False), tmp_path, 10)
    log = json.loads((store.dir / ".specprobe/manifest.json").read_text())["log"]
    assert [e["message"].split("\n")[0] for e in log[1:]] == [
        "lease acquired",
        "checkpoint step 10 -> ckpt/checkpoint-10",
        "latest.json -> step 10 ckpt/checkpoint-10",
    ]
    assert [sorted(e["added"]) for e in log[2:]] == [
        sorted(f"ckpt/checkpoint-10/{n}" for n in CHECKPOINT_FILES),
        ["latest.json"],
    ]


class CorruptingStore(LocalStore):
    """Flips one byte of a stored checkpoint file right after the checkpoint commit lands (a bad upload)."""

    target = "model.safetensors"

    def commit(self, add, delete=(), message="", expect_revision=None):
        rev = super().commit(add, delete, message, expect_revision)
        for path in add:
            if path.endswith("/" + self.target):
                obj = self.dir / ".specprobe/objects" / self.list_files()[path].sha256
                data = bytearray(obj.read_bytes())
                data[0] ^= 0xFF
                obj.write_bytes(bytes(data))
        return rev


def test_pointer_moves_only_after_verify_passes(store, tmp_path):
    push(Checkpointer(store, log=Recorder()), tmp_path, 10)
    bad = CorruptingStore(store.root, store.repo_id, url=store.url)
    log = Recorder()
    with pytest.raises(StoreError) as e:
        push(Checkpointer(bad, log=log), tmp_path, 20)
    msg = str(e.value)
    assert "ckpt/checkpoint-20/model.safetensors" in msg and "latest.json was NOT moved" in msg
    assert "even after a repair" in msg  # this store corrupts every upload, the repair's included
    local = sha256_file(tmp_path / "local/checkpoint-20/model.safetensors")
    stored = store.sha256("ckpt/checkpoint-20/model.safetensors")
    assert local in msg and stored in msg and local != stored
    assert [line.split(" step=")[0] for line in log.lines] == ["CKPT push", "CKPT pushed", "CKPT repair"]
    assert read_pointer(store).step == 10  # still the last verified checkpoint


def test_final_push_writes_final_and_a_terminal_pointer_keeping_ckpt_history(store, tmp_path):
    log = Recorder()
    ck = Checkpointer(store, log=log)
    push(ck, tmp_path, 10)
    push(ck, tmp_path, 20)
    pointer = push(ck, tmp_path, 20, final=True)
    assert (pointer.path_in_repo, pointer.terminal, pointer.step) == ("final", True, 20)
    assert "CKPT push step=20 -> final" in log.lines and "latest.json -> step=20 path=final" in log.lines
    files = store.list_files()
    assert all(f"final/{n}" in files for n in CHECKPOINT_FILES)
    assert all(f"ckpt/checkpoint-{s}/model.safetensors" in files for s in (10, 20))
    assert read_pointer(store).terminal is True


def test_repush_of_a_step_replaces_the_folder_without_stale_files(store, tmp_path):
    ck = Checkpointer(store, log=Recorder(), prune=False)
    d = tmp_path / "odd"
    files = fake_checkpoint(d, 10)
    (d / "extra.bin").write_bytes(b"x")
    ck.push(10, d, {**files, "extra.bin": sha256_file(d / "extra.bin")}, tokens=1, config_hash=CH)
    push(ck, tmp_path, 10)
    assert "ckpt/checkpoint-10/extra.bin" not in store.list_files()


def test_push_refuses_a_file_missing_from_the_local_folder(store, tmp_path):
    files = fake_checkpoint(tmp_path / "c", 10)
    (tmp_path / "c/rng.pt").unlink()
    with pytest.raises(StoreError, match=r"c/rng.pt is not a file"):
        Checkpointer(store, log=Recorder()).push(10, tmp_path / "c", files, tokens=1, config_hash=CH)
    assert store.list_files() == {}


# ------------------------------------------------------------------------------------------ prune


def test_prune_keeps_every_step_listed_and_optimizer_state_only_on_the_newest(store, tmp_path):
    log = Recorder()
    ck = Checkpointer(store, log=log)
    for step in (10, 20, 30):
        push(ck, tmp_path, step)
    assert log.lines[-1] == (
        'CKPT prune step=30 removed=["ckpt/checkpoint-20/optimizer.pt", "ckpt/checkpoint-20/rng.pt"]'
    )
    files = store.list_files()
    for step in (10, 20, 30):
        for name in ("model.safetensors", "config.json", "trainer_state.json"):
            assert f"ckpt/checkpoint-{step}/{name}" in files
    assert [p for p in files if p.endswith(("optimizer.pt", "rng.pt"))] == [
        "ckpt/checkpoint-30/optimizer.pt",
        "ckpt/checkpoint-30/rng.pt",
    ]


def test_prune_keeps_the_newest_n_optimizer_states_when_asked(store, tmp_path):
    ck = Checkpointer(store, log=Recorder(), keep_optimizer_states=2)
    for step in (10, 20, 30):
        push(ck, tmp_path, step)
    assert sorted(p for p in store.list_files() if p.endswith("optimizer.pt")) == [
        "ckpt/checkpoint-20/optimizer.pt",
        "ckpt/checkpoint-30/optimizer.pt",
    ]


def test_prune_never_deletes_the_pointer_target():
    paths = [f"ckpt/checkpoint-{s}/{n}" for s in (5, 10, 100) for n in CHECKPOINT_FILES]
    # An orphan step 100 (pushed, never pointed at) is newer than the pointer's step 10.
    assert prune_plan(paths, keep_step=10, keep_newest=1) == [
        "ckpt/checkpoint-5/optimizer.pt",
        "ckpt/checkpoint-5/rng.pt",
    ]
    # Numeric order, not string order: 100 is the newest, 5 the oldest.
    assert prune_plan(paths, keep_step=100, keep_newest=1) == [
        "ckpt/checkpoint-5/optimizer.pt",
        "ckpt/checkpoint-5/rng.pt",
        "ckpt/checkpoint-10/optimizer.pt",
        "ckpt/checkpoint-10/rng.pt",
    ]
    assert prune_plan(paths + ["final/optimizer.pt", "latest.json"], keep_step=None, keep_newest=3) == []


def test_prune_disabled_keeps_all_optimizer_states(store, tmp_path):
    log = Recorder()
    ck = Checkpointer(store, log=log, prune=False)
    push(ck, tmp_path, 10)
    push(ck, tmp_path, 20)
    assert not any(line.startswith("CKPT prune") for line in log.lines)
    assert sum(p.endswith("optimizer.pt") for p in store.list_files()) == 2


def test_prune_local_keeps_only_the_newest_folder(tmp_path):
    for name in ("checkpoint-10", "checkpoint-20", "final", "ckpt/checkpoint-5", "other"):
        (tmp_path / name).mkdir(parents=True)
    removed = prune_local(tmp_path, tmp_path / "checkpoint-20")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in removed) == [
        "checkpoint-10",
        "ckpt/checkpoint-5",
        "final",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-20", "ckpt", "other"]


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


# ------------------------------------------------------------------------------------------ fetch


class FlakyDownloadStore(LocalStore):
    bad_downloads = 1

    def download(self, path, dest):
        out = super().download(path, dest)
        if self.bad_downloads > 0:
            self.bad_downloads -= 1
            out.write_bytes(b"garbage")
        return out


def test_fetch_retries_a_bad_download_once_then_fails_naming_the_file(store, tmp_path):
    pointer = push(Checkpointer(store, log=Recorder()), tmp_path, 10)
    flaky = FlakyDownloadStore(store.root, store.repo_id, url=store.url)
    fetch(flaky, pointer, tmp_path / "a")  # one bad download: retried
    assert sha256_file(tmp_path / "a/model.safetensors") == pointer.files["model.safetensors"]

    flaky.bad_downloads = 2
    with pytest.raises(StoreError, match=r"ckpt/checkpoint-10/config.json .* after two downloads"):
        fetch(flaky, pointer, tmp_path / "b")  # config.json sorts first


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


# --------------------------------------------------------------------------------- kill anywhere

KILL_PUSH = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from trainer.ckpt.checkpointer import Checkpointer, CHECKPOINT_FILES
    from trainer.store import sha256_file
    from trainer.store.url import open_store
    url, phase, local, ch = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    def log(line):
        print(line, flush=True)
        if line.startswith(phase):
            os.kill(os.getpid(), signal.SIGKILL)
    files = {n: sha256_file(local / n) for n in CHECKPOINT_FILES}
    Checkpointer(open_store(url), log=log).push(20, local, files, tokens=2560, config_hash=ch)
""")


@pytest.mark.parametrize(
    "phase,resumes_at",
    [("CKPT push ", 10), ("CKPT pushed ", 10), ("CKPT verify ", 10), ("latest.json -> ", 20), ("CKPT prune ", 20)],
)
def test_a_push_killed_at_any_phase_leaves_a_resumable_store(store, tmp_path, phase, resumes_at):
    first = Checkpointer(store, log=Recorder())
    push(first, tmp_path, 10)
    first.close()  # the killed writer below is another process: it needs the lease
    local = tmp_path / "leg"
    fake_checkpoint(local, 20)
    proc = subprocess.run(
        [sys.executable, "-c", KILL_PUSH, store.url, phase, str(local), CH],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith(phase)

    ck = Checkpointer(store, log=Recorder())
    pointer = ResumeScan(ck).decide(identity=IDENTITY, horizon_step=30)
    assert pointer.step == resumes_at
    dest = fetch(ck.store, pointer, tmp_path / "cold")
    assert {n: sha256_file(dest / n) for n in CHECKPOINT_FILES} == pointer.files
    # The next push of the same step after a resume from 10 completes normally.
    if resumes_at == 10:
        assert push(ck, tmp_path, 20).step == 20 and read_pointer(store).step == 20


# ------------------------------------------------------------------------------------ real model


def test_write_checkpoint_dir_with_the_real_model_round_trips_through_the_store(store, tmp_path):
    torch = pytest.importorskip("torch")
    model_mod = pytest.importorskip("trainer.model.model")
    cfg = model_mod.GEOMETRIES["tiny"]
    torch.manual_seed(0)
    model = model_mod.Llama(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    _, loss = model(idx, idx)
    loss.backward()
    opt.step()
    rng = [{"rank": 0, "torch": torch.get_rng_state()}]
    files = write_checkpoint_dir(
        tmp_path / "ck",
        model=model,
        cfg=cfg,
        trainer_state={"step": 5, "tokens_consumed": 160, "config_hash": CH},
        optimizer_state={"optimizer": opt.state_dict(), "scheduler": None, "scaler": None},
        rng_states=rng,
    )
    assert sorted(files) == sorted(CHECKPOINT_FILES)
    assert all(sha256_file(tmp_path / "ck" / n) == h for n, h in files.items())

    ck = Checkpointer(store, log=Recorder())
    ck.push(5, tmp_path / "ck", files, tokens=160, config_hash=CH)
    pointer = ResumeScan(ck).decide(identity=IDENTITY, horizon_step=10)
    dest = fetch(ck.store, pointer, tmp_path / "cold")
    assert json.loads((dest / "trainer_state.json").read_text())["step"] == 5
    state = torch.load(dest / "optimizer.pt", weights_only=False)
    assert state["optimizer"]["state"][0]["step"].item() == 1
    assert torch.equal(torch.load(dest / "rng.pt", weights_only=False)[0]["torch"], rng[0]["torch"])
    from safetensors.torch import load_file

    from trainer.model.hf import hf_state_dict

    sd, expected = load_file(dest / "model.safetensors"), hf_state_dict(model)
    assert sorted(sd) == sorted(expected) and "model.embed_tokens.weight" in sd
    assert all(torch.equal(sd[k], expected[k].detach()) for k in sd)


# ------------------------------------------------------------------------ over the Hub backend


def test_push_resume_and_fetch_over_the_hub_backend(hub_store, hub_server, tmp_path):
    store = hub_store("ckpt-protocol")
    log = Recorder()
    ck = Checkpointer(store, log=log)
    assert ResumeScan(ck).decide(identity=IDENTITY, horizon_step=30) is None
    assert log.lines == ["auto-resume: repo missing, created hf://tester/ckpt-protocol, fresh start"]
    for step in (10, 20):
        d = tmp_path / f"l{step}"
        files = fake_checkpoint(d, step, step, size=4096)  # over the server's LFS threshold
        ck.push(step, d, files, tokens=step, config_hash=CH)
    commits_before = hub_server.commit_count("tester/ckpt-protocol")

    pointer = ResumeScan(Checkpointer(store, log=Recorder())).decide(identity=IDENTITY, horizon_step=30)
    assert pointer.step == 20 and read_pointer(store) == pointer
    assert "ckpt/checkpoint-10/optimizer.pt" not in store.list_files()
    dest = fetch(ck.store, pointer, tmp_path / "cold")
    assert (dest / "model.safetensors").read_bytes() == (tmp_path / "l20/model.safetensors").read_bytes()
    assert hub_server.commit_count("tester/ckpt-protocol") == commits_before  # resume and fetch only read


def test_a_hub_upload_corrupted_for_good_never_moves_the_pointer(hub_store, hub_server, tmp_path):
    store = hub_store("ckpt-corrupt")
    ck = Checkpointer(store, log=Recorder())
    ResumeScan(ck).decide(identity=IDENTITY, horizon_step=30)
    push(ck, tmp_path, 10)
    hub_server.inject("corrupt", r"/commit/", file_pattern=r"checkpoint-20/optimizer\.pt$", times=10)
    with pytest.raises(StoreError, match=r"ckpt/checkpoint-20/optimizer.pt: stored sha256 .*latest.json was NOT moved"):
        push(ck, tmp_path, 20)
    assert read_pointer(store).step == 10


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


# ------------------------------------------------------------------------------------------ repair


class CorruptOnceStore(CorruptingStore):
    """Corrupts the stored model.safetensors of the first checkpoint commit only (then uploads are clean)."""

    armed = True

    def commit(self, add, delete=(), message="", expect_revision=None):
        if not self.armed:
            return LocalStore.commit(self, add, delete, message, expect_revision)
        rev = super().commit(add, delete, message, expect_revision)
        self.armed = not any(p.endswith("/model.safetensors") for p in add)
        return rev


def test_a_corrupt_stored_file_is_repaired_and_the_push_completes(store, tmp_path):
    push(Checkpointer(store, log=Recorder()), tmp_path, 10)
    bad = CorruptOnceStore(store.root, store.repo_id, url=store.url)
    log = Recorder()
    pointer = push(Checkpointer(bad, log=log), tmp_path, 20)
    assert [line.split(" step=")[0] for line in log.lines] == [
        "CKPT push",
        "CKPT pushed",
        "CKPT repair",
        "CKPT verify",
        "latest.json ->",
        "CKPT prune",
    ]
    assert "ckpt/checkpoint-20/model.safetensors: stored sha256" in log.lines[2]
    assert pointer.step == 20 and read_pointer(store) == pointer
    assert store.sha256("ckpt/checkpoint-20/model.safetensors") == pointer.files["model.safetensors"]


def test_resume_over_a_store_copied_without_its_metadata_refuses_and_changes_nothing(store, tmp_path):
    push(Checkpointer(store, log=Recorder()), tmp_path, 10)
    copy = tmp_path / "copied/probe/ckpt-x"
    shutil.copytree(store.dir, copy, ignore=shutil.ignore_patterns(".specprobe"))  # `cp -r repo/*`
    before = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file())
    log = Recorder()
    with pytest.raises(MetadataMissing, match="but no .specprobe/manifest.json"):
        ResumeScan(Checkpointer(open_store(f"file://{tmp_path}/copied/probe/ckpt-x"), log=log)).decide(
            identity=IDENTITY, horizon_step=20
        )
    assert not any("fresh start" in line for line in log.lines)
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == before
