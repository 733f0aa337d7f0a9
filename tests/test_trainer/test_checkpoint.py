"""The checkpoint protocol over a real LocalStore: push -> verify -> pointer -> prune, fetch, a push killed at
any phase, the real model's files, the Hub backend, and a corrupt stored file repaired."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from checkpoints import CH, Recorder, content, fake_checkpoint, push
from trainer_helpers import IDENTITY

from trainer.ckpt.checkpointer import (
    CHECKPOINT_FILES,
    Checkpointer,
    prune_local,
    prune_plan,
    read_pointer,
    write_checkpoint_dir,
)
from trainer.ckpt.scan import ResumeScan, fetch
from trainer.store import LocalStore, MetadataMissing, StoreError, sha256_file
from trainer.store.url import open_store

REPO_ROOT = Path(__file__).resolve().parents[2]


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
