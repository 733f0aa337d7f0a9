"""Hub faults injected by tests/hubserver.py, survived by HubStore (and the Checkpointer above it) through the
real huggingface_hub client: retried with backoff when transient, a landed-but-unacknowledged commit settled
by reading back (never pushed twice), an answer that never comes ended by the read timeout and settled the
same way, 409 and 412 re-read, truncated downloads re-fetched, corruption caught and repaired (or, where the store
cannot replace the corrupt object, pushed as a byte-different copy of the same content), a lagging listing read
again."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest
from blobs import sha, write
from hubserver import HUB_TOKEN, HubServer
from trainer_helpers import IDENTITY

from trainer.ckpt.checkpointer import (
    CHECKPOINT_FILES,
    POINTER_PATH,
    STATE_FILE,
    Checkpointer,
    read_pointer,
    seal_trainer_state,
)
from trainer.ckpt.scan import ResumeRefused, ResumeScan
from trainer.store import StoreError
from trainer.store.hub import COMMIT_MARKER, HubStore, Timeouts
from trainer.store.lease import LEASE_PATH

COMMIT = r"/commit/main$"


def ready(hub_store, name: str) -> HubStore:
    store = hub_store(name)
    store.create()
    return store


def commit_posts(server: HubServer) -> list[dict]:
    return server.requests("POST", COMMIT)


@pytest.mark.parametrize("status", [500, 503])
def test_5xx_on_commit_is_retried_with_exponential_backoff(
    hub_server: HubServer, hub_store, sleeps, tmp_path: Path, status: int
) -> None:
    store = ready(hub_store, "s5xx")
    before = hub_server.commit_count("tester/s5xx")
    hub_server.inject("status", COMMIT, status=status, times=2)
    rev = store.commit({"a.json": write(tmp_path, "a", b"{}")}, message="m")
    assert rev == hub_server.repo("tester/s5xx").head.oid
    assert hub_server.commit_count("tester/s5xx") == before + 1
    assert [r["status"] for r in commit_posts(hub_server)] == [status, status, 200]
    assert len(sleeps.delays) == 2 and sleeps.delays[1] > sleeps.delays[0] * 1.4  # 0.01 -> 0.02 (jittered)


def test_429_honours_retry_after(hub_server: HubServer, hub_store, sleeps, tmp_path: Path) -> None:
    store = ready(hub_store, "s429")
    hub_server.inject("status", COMMIT, status=429, retry_after=7)
    store.commit({"a.json": write(tmp_path, "a", b"{}")})
    assert sleeps.delays == [7.0]


def test_transient_read_errors_are_retried(hub_server: HubServer, hub_store, sleeps) -> None:
    store = ready(hub_store, "sread")
    hub_server.inject("status", r"^/api/datasets/tester/sread$", method="GET", status=502, times=3)
    assert store.exists() is True
    assert len(sleeps.delays) == 3


def test_retries_are_bounded(hub_server: HubServer, hub_store, sleeps, tmp_path: Path) -> None:
    store = ready(hub_store, "sbound")
    before = hub_server.commit_count("tester/sbound")
    hub_server.inject("status", COMMIT, status=503, times=100)
    with pytest.raises(StoreError, match=r"tester/sbound.*after 5 tries.*503"):
        store.commit({"a.json": write(tmp_path, "a", b"{}")})
    assert len(commit_posts(hub_server)) == 5 and len(sleeps.delays) == 4
    assert hub_server.commit_count("tester/sbound") == before


def test_connection_reset_mid_upload_of_a_commit(hub_server: HubServer, hub_store, tmp_path: Path) -> None:
    store = ready(hub_store, "sreset")
    before = hub_server.commit_count("tester/sreset")
    hub_server.inject("reset", COMMIT)
    store.commit({"a.json": write(tmp_path, "a", b'{"k": 1}')})
    assert hub_server.commit_count("tester/sreset") == before + 1
    assert hub_server.files("tester/sreset")["a.json"] == b'{"k": 1}'


def test_connection_reset_mid_lfs_upload(hub_server: HubServer, hub_store, tmp_path: Path) -> None:
    store = ready(hub_store, "slfsreset")
    data = os.urandom(8192)
    hub_server.inject("reset", r"^/__lfs__/upload/", method="PUT")
    store.commit({"m.safetensors": write(tmp_path, "m", data)})
    assert hub_server.files("tester/slfsreset")["m.safetensors"] == data
    assert len(hub_server.requests("PUT", r"^/__lfs__/upload/")) == 2  # the cut upload was sent again
    assert store.sha256("m.safetensors") == sha(data)


def test_commit_that_lands_but_whose_answer_is_lost_is_not_pushed_twice(
    hub_server: HubServer, hub_store, tmp_path: Path
) -> None:
    store = ready(hub_store, "slost")
    before = hub_server.commit_count("tester/slost")
    hub_server.inject("lost_response", COMMIT)
    rev = store.commit({"m.safetensors": write(tmp_path, "m", os.urandom(2048))}, message="checkpoint")
    repo = hub_server.repo("tester/slost")
    assert hub_server.commit_count("tester/slost") == before + 1  # landed once, never re-pushed
    assert len(commit_posts(hub_server)) == 1
    assert rev == repo.head.oid and COMMIT_MARKER in repo.head.title
    assert hub_server.requests("GET", r"/commits/main")  # settled by reading the history back


# A stalled answer is held back this long: far past the read timeouts below, so a client without a bound would
# sit there (and fail the time limits) instead of settling.
STALL_S = 30.0
SHORT = Timeouts(connect_s=5.0, read_s=0.5)


def test_a_commit_whose_answer_never_comes_settles_through_the_history_within_the_read_timeout(
    hub_server: HubServer, hub_store, tmp_path: Path
) -> None:
    store = ready(hub_store, "sstall")
    store = HubStore("tester/sstall", endpoint=hub_server.url, token=HUB_TOKEN, retry=store.retry, timeouts=SHORT)
    before = hub_server.commit_count("tester/sstall")
    hub_server.inject("stall", COMMIT, delay_s=STALL_S)
    t0 = time.monotonic()
    rev = store.commit({"m.safetensors": write(tmp_path, "m", os.urandom(2048))}, message="checkpoint")
    took = time.monotonic() - t0
    repo = hub_server.repo("tester/sstall")
    assert took < 10, f"the commit took {took:.1f}s: its lost answer was waited for"
    assert rev == repo.head.oid and COMMIT_MARKER in repo.head.title
    assert hub_server.commit_count("tester/sstall") == before + 1 and len(commit_posts(hub_server)) == 1
    posts = commit_posts(hub_server)
    assert posts[0]["fault"] == "stall" and hub_server.requests("GET", r"/commits/main")  # settled by reading back


def test_a_read_whose_answer_never_comes_is_tried_again_after_the_read_timeout(
    hub_server: HubServer, hub_store, sleeps
) -> None:
    ready(hub_store, "sstallget")
    store = HubStore(
        "tester/sstallget", endpoint=hub_server.url, token=HUB_TOKEN, retry=hub_store().retry, timeouts=SHORT
    )
    # repo_info: huggingface_hub 2.x passes timeout=None for it, which a bound must override.
    hub_server.inject("stall", r"^/api/datasets/tester/sstallget$", method="GET", delay_s=STALL_S)
    t0 = time.monotonic()
    assert store.exists() is True
    assert time.monotonic() - t0 < 10 and len(sleeps.delays) == 1
    assert [r["fault"] for r in hub_server.requests("GET", r"^/api/datasets/tester/sstallget$")] == ["stall", None]


def test_an_lfs_upload_whose_answer_never_comes_is_sent_again(hub_server: HubServer, hub_store, tmp_path: Path) -> None:
    ready(hub_store, "sstallput")
    store = HubStore(
        "tester/sstallput", endpoint=hub_server.url, token=HUB_TOKEN, retry=hub_store().retry, timeouts=SHORT
    )
    data = os.urandom(8192)
    hub_server.inject("stall", LFS_PUT, method="PUT", delay_s=STALL_S)
    t0 = time.monotonic()
    store.commit({"m.safetensors": write(tmp_path, "m", data)})
    assert time.monotonic() - t0 < 15
    assert hub_server.files("tester/sstallput")["m.safetensors"] == data
    assert [r["fault"] for r in hub_server.requests("PUT", LFS_PUT)][:2] == ["stall", None]


def test_a_409_from_the_commit_endpoint_is_read_back_and_retried(
    hub_server: HubServer, hub_store, sleeps, tmp_path: Path
) -> None:
    store = ready(hub_store, "s409")
    before = hub_server.commit_count("tester/s409")
    hub_server.inject("status", COMMIT, status=409, times=2)
    rev = store.commit({"a.json": write(tmp_path, "a", b"1")})
    assert [r["status"] for r in commit_posts(hub_server)] == [409, 409, 200] and len(sleeps.delays) == 2
    assert hub_server.commit_count("tester/s409") == before + 1 and rev == hub_server.repo("tester/s409").head.oid
    assert len(hub_server.requests("GET", r"/commits/main")) >= 2  # the history read before each new try


def test_412_conflict_rereads_the_head_and_retries(hub_server: HubServer, hub_store, tmp_path: Path) -> None:
    store = ready(hub_store, "s412")
    before = hub_server.commit_count("tester/s412")
    hub_server.inject("conflict", COMMIT)
    rev = store.commit({"a.json": write(tmp_path, "a", b"1")})
    assert [r["status"] for r in commit_posts(hub_server)] == [412, 200]
    assert hub_server.commit_count("tester/s412") == before + 1 and rev == hub_server.repo("tester/s412").head.oid


def test_a_real_concurrent_writer_is_a_412_then_a_clean_retry(hub_server: HubServer, hub_store, tmp_path: Path) -> None:
    store = ready(hub_store, "srace")
    other = hub_store("srace")
    real_head = store.head
    heads = iter([None])

    def stale_head() -> str:  # our head read happens, then someone else commits before our POST
        h = real_head()
        if next(heads, "done") is None:
            other.commit({"other.txt": write(tmp_path, "o", b"theirs")})
        return h

    store.head = stale_head  # type: ignore[method-assign]
    store.commit({"mine.txt": write(tmp_path, "m", b"ours")})
    files = hub_server.files("tester/srace")
    assert files["other.txt"] == b"theirs" and files["mine.txt"] == b"ours"
    assert [r["status"] for r in commit_posts(hub_server)] == [200, 412, 200]


@pytest.mark.parametrize("mode", ["close", "short"])
def test_truncated_download_is_caught_and_fetched_again(
    hub_server: HubServer, hub_store, tmp_path: Path, mode: str
) -> None:
    store = ready(hub_store, f"strunc{mode}")
    data = os.urandom(6000)
    store.commit({"m.safetensors": write(tmp_path, "m", data)})
    hub_server.inject("truncate", r"/resolve/.*/m\.safetensors$", method="GET", mode=mode)
    assert store.sha256("m.safetensors") == sha(data)
    gets = hub_server.requests("GET", r"/resolve/")
    # close: the client itself notices the cut body and fetches again; short: our hash check does.
    # (Older clients resume the second fetch with a Range request: 206.)
    assert [g["fault"] for g in gets] == ["truncate", None] and gets[1]["status"] in (200, 206)


def test_truncated_regular_file_is_fetched_again(hub_server: HubServer, hub_store, tmp_path: Path) -> None:
    store = ready(hub_store, "struncreg")
    data = b"0123456789" * 50
    store.commit({"config.json": write(tmp_path, "c", data)})
    hub_server.inject("truncate", r"/resolve/.*/config\.json$", method="GET", mode="short")
    assert store.read_bytes("config.json") == data


def test_silent_corruption_is_caught(hub_server: HubServer, hub_store, tmp_path: Path) -> None:
    store = ready(hub_store, "scorrupt")
    data = os.urandom(4096)
    hub_server.inject("corrupt", COMMIT, file_pattern=r"model\.safetensors$")
    store.commit({"ckpt/checkpoint-1/model.safetensors": write(tmp_path, "m", data)})
    # The Hub's metadata still says the uploaded hash; only the bytes read back tell the truth.
    assert store.list_files()["ckpt/checkpoint-1/model.safetensors"].sha256 == sha(data)
    got = store.sha256("ckpt/checkpoint-1/model.safetensors")
    assert got != sha(data)
    assert got == sha(hub_server.files("tester/scorrupt")["ckpt/checkpoint-1/model.safetensors"])
    with pytest.raises(StoreError, match="corrupt"):
        store.read_bytes("ckpt/checkpoint-1/model.safetensors")


# ------------------------------------------------------------------------------------ the Checkpointer


def make_ckpt(tmp: Path, step: int) -> tuple[Path, dict[str, str]]:
    """A checkpoint folder with the real file names; contents are a pure function of the step."""
    folder = tmp / f"local-{step}"
    files = {}
    for name in CHECKPOINT_FILES:
        data = hashlib.sha256(f"{name}:{step}".encode()).digest() * (
            200 if name.endswith((".safetensors", ".pt")) else 2
        )
        files[name] = sha(write(folder, name, data).read_bytes())
    return folder, files


def run_pushes(store: HubStore, tmp: Path, steps: list[int], log: list[str]) -> None:
    ck = Checkpointer(store, log=log.append)
    assert ResumeScan(ck).decide(identity=IDENTITY, horizon_step=steps[-1]) is None
    for step in steps:
        folder, files = make_ckpt(tmp, step)
        ck.push(step, folder, files, tokens=step * 100, config_hash=IDENTITY.hash, final=step == steps[-1])


def final_state(server: HubServer, repo_id: str) -> dict[str, str]:
    return {p: sha(b) for p, b in server.files(repo_id).items() if p not in (POINTER_PATH, LEASE_PATH)}


def test_checkpointer_pointer_does_not_move_on_corruption_that_persists(
    hub_server: HubServer, hub_store, tmp_path: Path
) -> None:
    store = hub_store("ckcorrupt")
    log: list[str] = []
    run_pushes(store, tmp_path, [10], log)  # step 10 is clean; final=True for that one push though
    ck = Checkpointer(store, log=log.append)
    hub_server.inject("corrupt", COMMIT, file_pattern=r"checkpoint-20/model\.safetensors$", times=10)
    folder, files = make_ckpt(tmp_path, 20)
    with pytest.raises(StoreError, match="verify step=20 FAILED.*even after a repair.*NOT moved"):
        ck.push(20, folder, files, tokens=2000, config_hash=IDENTITY.hash)
    pointer = read_pointer(store)
    assert pointer is not None and pointer.step == 10 and pointer.path_in_repo == "final"


def test_a_corrupt_stored_object_is_replaced_so_the_next_push_of_the_same_bytes_succeeds(
    hub_server: HubServer, hub_store, tmp_path: Path
) -> None:
    store = hub_store("ckrepair")
    run_pushes(store, tmp_path, [10], [])
    folder, files = make_ckpt(tmp_path, 20)
    path = "ckpt/checkpoint-20/model.safetensors"
    # A session pushed step 20 and its stored model bytes went bad (the Hub's metadata keeps the uploaded hash).
    store.commit({f"ckpt/checkpoint-20/{n}": folder / n for n in files}, message="checkpoint step 20")
    hub_server.corrupt("tester/ckrepair", path)
    assert sha(hub_server.files("tester/ckrepair")[path]) != files["model.safetensors"]
    # The next session pushes the same bytes: verify finds the old bad object, the repair replaces it.
    log: list[str] = []
    pointer = Checkpointer(store, log=log.append).push(20, folder, files, tokens=2000, config_hash=IDENTITY.hash)
    assert any(line.startswith("CKPT repair step=20") and path in line for line in log), log
    assert (
        sha(hub_server.files("tester/ckrepair")[path])
        == files["model.safetensors"]
        == pointer.files["model.safetensors"]
    )
    assert hub_server.requests("POST", r"/lfs-files/batch$")  # the bad object was purged, then uploaded
    assert read_pointer(store).step == 20


def real_ckpt(tmp: Path, step: int) -> tuple[Path, dict[str, str]]:
    """A checkpoint folder of the real formats (safetensors, torch zip archives, JSON), trainer_state.json sealed
    like the trainer's; weights and model.safetensors past the LFS threshold, config.json and the state under it."""
    import torch
    from safetensors.torch import save_file

    folder = tmp / f"real-{step}"
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(step)
    save_file({"w": torch.randn(64, 64, generator=g)}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"hidden_size": 64, "model_type": "llama"}, indent=2) + "\n")
    torch.save({"exp_avg": torch.randn(64, 64, generator=g)}, folder / "optimizer.pt")
    torch.save([torch.get_rng_state()], folder / "rng.pt")
    others = {n: sha((folder / n).read_bytes()) for n in CHECKPOINT_FILES if n != STATE_FILE}
    state = seal_trainer_state({"step": step, "tokens_consumed": step * 100, "config_hash": IDENTITY.hash}, others)
    (folder / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    return folder, {**others, STATE_FILE: sha((folder / STATE_FILE).read_bytes())}


def corrupt_then_push_again(server: HubServer, store: HubStore, tmp: Path, name: str) -> tuple[Path, dict, str, list]:
    """Step 10 pushed clean; a session's step-20 commit whose stored ``name`` went bad; the next session pushes the
    same bytes of step 20 again. Returns (folder, its hashes, the corrupt commit's revision, the push's log)."""
    run_pushes(store, tmp, [10], [])
    folder, files = real_ckpt(tmp, 20)
    bad = store.commit({f"ckpt/checkpoint-20/{n}": folder / n for n in files}, message="checkpoint step 20")
    server.corrupt(store.repo_id, f"ckpt/checkpoint-20/{name}")
    log: list[str] = []
    Checkpointer(store, log=log.append).push(20, folder, files, tokens=2000, config_hash=IDENTITY.hash)
    return folder, files, bad, log


def assert_pushed_as_a_copy_losing_nothing(
    server: HubServer, store: HubStore, tmp: Path, name: str, files: dict, bad: str, log: list[str]
) -> None:
    from safetensors.torch import load_file

    from trainer.ckpt.checkpointer import unseal_trainer_state
    from trainer.ckpt.scan import fetch

    said = [line for line in log if line.startswith("CKPT variant step=20: ")]
    assert len(said) == 1 and f"{name} still read back corrupt" in said[0], log
    assert "pushing a byte-different copy of the same content" in said[0] and "for inspection" in said[0]
    pointer = read_pointer(store)
    assert pointer is not None and (pointer.step, pointer.path_in_repo) == (20, "ckpt/checkpoint-20")
    assert pointer.files[name] != files[name]  # a new object: the stored copy differs in bytes
    # The corrupt object stays in the history: in the session's commit, and at the revision the log names.
    repo = server.repo(store.repo_id)
    named = re.search(r"at revision ([0-9a-f]{40}) for inspection", said[0])
    assert named is not None, said[0]
    for rev in (bad, named.group(1)):
        entry = next(c for c in repo.commits if c.oid == rev).tree[f"ckpt/checkpoint-20/{name}"]
        assert sha(bytes(repo.blobs[entry.key])) not in (files[name], pointer.files[name])
    # Nothing lost: a cold resume fetches every file of the pointer, each matching, the content as trained.
    out = fetch(store, pointer, tmp / "cold")
    state = unseal_trainer_state((out / STATE_FILE).read_bytes(), "trainer_state.json")
    assert state["step"] == 20 and state["files"] == {n: h for n, h in pointer.files.items() if n != STATE_FILE}
    original = tmp / "real-20"
    if name == "model.safetensors":
        got, want = load_file(str(out / name)), load_file(str(original / name))
        assert got.keys() == want.keys() and all(got[k].equal(want[k]) for k in want)
    else:
        assert json.loads((out / name).read_text()) == json.loads((original / name).read_text())


def test_a_corrupt_lfs_object_the_hub_cannot_purge_is_pushed_as_a_byte_different_copy(
    hub_server: HubServer, hub_store, tmp_path: Path
) -> None:
    store = hub_store("cknopurge")
    hub_server.inject("status", r"/lfs-files", status=404, times=1000)  # a Hub without the LFS-files endpoints
    folder, files, bad, log = corrupt_then_push_again(hub_server, store, tmp_path, "model.safetensors")
    assert any(line.startswith("CKPT repair step=20") for line in log)  # the repair was tried first, and failed
    assert_pushed_as_a_copy_losing_nothing(hub_server, store, tmp_path, "model.safetensors", files, bad, log)


def test_a_corrupt_regular_file_no_api_replaces_is_pushed_as_a_byte_different_copy(
    hub_server: HubServer, hub_store, tmp_path: Path
) -> None:
    store = hub_store("ckrepreg")
    # config.json is under the LFS threshold: a regular file, stored as a git blob, which no upload replaces.
    folder, files, bad, log = corrupt_then_push_again(hub_server, store, tmp_path, "config.json")
    assert store.list_files()["ckpt/checkpoint-20/config.json"].sha256 is None
    assert_pushed_as_a_copy_losing_nothing(hub_server, store, tmp_path, "config.json", files, bad, log)


def test_a_409_on_the_pointer_commit_is_retried_and_the_verified_checkpoint_gets_its_pointer(
    hub_server: HubServer, hub_store, tmp_path: Path
) -> None:
    store = hub_store("ck409")
    run_pushes(store, tmp_path, [10], [])
    ck = Checkpointer(store, log=[].append)
    ck.lease.acquire()  # the lease taken before the faults are armed: the next commits are the push's
    folder, files = make_ckpt(tmp_path, 20)
    # push(20) commits the checkpoint (1st), then the pointer (2nd): the pointer's commit answers 409 once.
    fault = hub_server.inject("status", COMMIT, status=409, nth=2)
    pointer = ck.push(20, folder, files, tokens=2000, config_hash=IDENTITY.hash)
    assert fault.fired == 1 and pointer.step == 20 and read_pointer(store) == pointer
    titles = [c.title for c in hub_server.repo("tester/ck409").commits]
    assert sum(t.startswith("latest.json -> step 20 ") for t in titles) == 1, titles


def sealed_ckpt(tmp: Path, step: int) -> tuple[Path, dict[str, str]]:
    """make_ckpt with a trainer_state.json sealed like the trainer's: what a resume reads and checks."""
    folder, files = make_ckpt(tmp, step)
    others = {n: h for n, h in files.items() if n != STATE_FILE}
    state = seal_trainer_state({"step": step, "tokens_consumed": step * 100, "config_hash": IDENTITY.hash}, others)
    files[STATE_FILE] = sha(write(folder, STATE_FILE, json.dumps(state).encode()).read_bytes())
    return folder, files


def pointed_at_20_listed_without(hub_server: HubServer, store: HubStore, tmp: Path, file: str, times: int) -> None:
    """Checkpoints 10 and 20 in `store`, both whole (two optimizer states kept), the pointer at 20; then the
    listing leaves out checkpoint-20's `file` the next `times` times it is read, as a listing that lags would."""
    ck = Checkpointer(store, log=[].append, keep_optimizer_states=2)
    assert ResumeScan(ck).decide(identity=IDENTITY, horizon_step=30) is None
    for step in (10, 20):
        folder, files = sealed_ckpt(tmp, step)
        ck.push(step, folder, files, tokens=step * 100, config_hash=IDENTITY.hash)
    ck.close()
    hub_server.inject("stale_listing", r"/tree/main", file_pattern=rf"checkpoint-20/{re.escape(file)}$", times=times)


def test_a_listing_that_lags_is_read_again_and_the_resume_goes_on(
    hub_server: HubServer, hub_store, sleeps, tmp_path: Path
) -> None:
    store = hub_store("cklag")
    pointed_at_20_listed_without(hub_server, store, tmp_path, "optimizer.pt", times=2)
    log: list[str] = []
    scan = ResumeScan(Checkpointer(store, log=log.append), relist_delays_s=(1.0, 2.0, 4.0), sleep=sleeps)
    assert scan.decide(identity=IDENTITY, horizon_step=30).step == 20
    said = [line for line in log if "does not show ckpt/checkpoint-20/optimizer.pt" in line]
    assert len(said) == 2 and said[0].endswith("a listing can lag behind a commit: listing again in 1s"), said
    assert [f.fired for f in hub_server.faults] == [2]
    assert sleeps.delays.count(1.0) == 1 and sleeps.delays.count(2.0) == 1 and 4.0 not in sleeps.delays


def test_a_file_the_listing_keeps_hiding_is_refused_saying_so_never_advising_deletion(
    hub_server: HubServer, hub_store, sleeps, tmp_path: Path
) -> None:
    store = hub_store("cklagged")
    pointed_at_20_listed_without(hub_server, store, tmp_path, "rng.pt", times=100)
    scan = ResumeScan(Checkpointer(store, log=[].append), relist_delays_s=(1.0, 2.0), sleep=sleeps)
    with pytest.raises(ResumeRefused) as e:
        scan.decide(identity=IDENTITY, horizon_step=30)
    msg = str(e.value)
    assert msg.startswith(
        "latest.json points at ckpt/checkpoint-20 but the listing of hf://tester/cklagged does not show "
        "ckpt/checkpoint-20/rng.pt (listed 3 time(s); a Hub listing can lag behind the commit that added a file)."
    ), msg
    assert "delete" not in msg.lower() and "run again later" in msg
    # The way to resume from a chosen checkpoint, naming one whose files are all listed.
    assert (
        "resume from a checkpoint you choose (ckpt/checkpoint-10 lists all its files): `hf download tester/cklagged "
        "--repo-type dataset --include 'ckpt/checkpoint-10/*' --local-dir DIR`, then run with --resume "
        "DIR/ckpt/checkpoint-10"
    ) in msg
    assert msg.endswith("Nothing in hf://tester/cklagged was changed.")
    assert read_pointer(store).step == 20


def test_checkpointer_landed_but_unacknowledged_push_is_not_pushed_twice(
    hub_server: HubServer, hub_store, tmp_path: Path
) -> None:
    store = hub_store("cklost")
    log: list[str] = []
    hub_server.inject("lost_response", COMMIT, nth=1)  # the first checkpoint commit
    run_pushes(store, tmp_path, [10, 20], log)
    titles = [c.title for c in hub_server.repo("tester/cklost").commits]
    assert sum("checkpoint step 10" in t for t in titles) == 1
    assert read_pointer(store).step == 20


def test_nothing_is_lost_under_faults_same_final_state_as_a_clean_run(
    hub_server: HubServer, hub_store, tmp_path: Path
) -> None:
    steps = [10, 20, 30]
    run_pushes(hub_store("clean"), tmp_path / "a", steps, [])
    faulty = hub_store("faulty")
    faulty.create()
    hub_server.clear_faults()
    for kind, pattern, kw in [
        ("status", COMMIT, {"status": 503, "nth": 2}),
        ("lost_response", COMMIT, {"nth": 4}),
        ("conflict", COMMIT, {"nth": 6}),
        ("reset", r"^/__lfs__/upload/", {"nth": 3}),
        ("status", r"/tree/main", {"status": 429, "retry_after": 0, "nth": 2}),
        ("truncate", r"/resolve/.*model\.safetensors$", {"mode": "short", "method": "GET", "nth": 2}),
    ]:
        hub_server.inject(kind, pattern, **kw)
    run_pushes(faulty, tmp_path / "b", steps, [])
    assert all(f.fired == f.times for f in hub_server.faults)
    assert final_state(hub_server, "tester/faulty") == final_state(hub_server, "tester/clean")
    clean_ptr = json.loads(hub_server.files("tester/clean")[POINTER_PATH])
    faulty_ptr = json.loads(hub_server.files("tester/faulty")[POINTER_PATH])
    for doc in (clean_ptr, faulty_ptr):  # when and at which revision differ between two repos
        doc.pop("time"), doc.pop("revision")
        assert doc.pop("previous")["step"] == 20 and doc["path_in_repo"] == "final"
    assert (
        faulty_ptr == clean_ptr
        and faulty_ptr["files"]["model.safetensors"]
        == final_state(hub_server, "tester/clean")["final/model.safetensors"]
    )


def test_control_endpoint_arms_a_fault_for_another_process(hub_server: HubServer, hub_store, tmp_path: Path) -> None:
    store = ready(hub_store, "sctl")
    req = urllib.request.Request(
        hub_server.url + "/__control__/inject",
        method="POST",
        data=json.dumps({"kind": "lost_response", "path_pattern": COMMIT}).encode(),
    )
    with urllib.request.urlopen(req) as r:
        assert json.loads(r.read())["kind"] == "lost_response"
    before = hub_server.commit_count("tester/sctl")
    store.commit({"a": write(tmp_path, "a", b"1")})
    assert hub_server.commit_count("tester/sctl") == before + 1


# ----------------------------------------------------------------- upload-phase errors, auth, jitter, tokens

LFS_PUT = r"^/__lfs__/upload/"


def test_a_4xx_in_the_upload_phase_is_retried_and_the_commit_lands_once(
    hub_server: HubServer, hub_store, sleeps, tmp_path: Path
) -> None:
    store = ready(hub_store, "sup400")
    before = hub_server.commit_count("tester/sup400")
    hub_server.inject("truncate_upload", LFS_PUT, method="PUT")  # storage gets half the body: its own 400
    data = os.urandom(8192)
    store.commit({"m.safetensors": write(tmp_path, "m", data)})
    assert [r["status"] for r in hub_server.requests("PUT", LFS_PUT)] == [400, 200]
    assert hub_server.files("tester/sup400")["m.safetensors"] == data
    assert hub_server.commit_count("tester/sup400") == before + 1 and len(sleeps.delays) == 1


def test_an_upload_4xx_that_persists_fails_with_the_servers_cause(
    hub_server: HubServer, hub_store, tmp_path: Path
) -> None:
    store = ready(hub_store, "sup400b")
    before = hub_server.commit_count("tester/sup400b")
    hub_server.inject("truncate_upload", LFS_PUT, method="PUT", times=100)
    with pytest.raises(StoreError) as e:
        store.commit({"m.safetensors": write(tmp_path, "m", os.urandom(8192))})
    msg = str(e.value)
    assert "after 5 tries" in msg and "Error while uploading 'm.safetensors'" in msg
    assert "uploaded bytes do not match oid" in msg, msg  # storage's own words, not only the wrapper
    assert len(hub_server.requests("PUT", LFS_PUT)) == 5 and hub_server.commit_count("tester/sup400b") == before


def test_a_401_names_hf_token_and_hf_auth_login_and_is_not_retried(
    hub_server: HubServer, hub_store, sleeps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants as hf_constants

    ready(hub_store, "s401")
    wrong = hub_store("s401", token="hf_WrongTokenValue12345")
    with pytest.raises(StoreError) as e:
        wrong.commit({"a.json": write(tmp_path, "a", b"{}")})
    msg = str(e.value)
    assert "HTTP 401" in msg and "HF_TOKEN" in msg and "`hf auth login`" in msg and "invalid" in msg
    assert "Invalid credentials in Authorization header" in msg  # the server's cause
    assert "hf_WrongTokenValue12345" not in msg and sleeps.delays == []
    # No token anywhere: the message says so.
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-login" / "token"))
    anonymous = hub_store("s401", token=None)
    with pytest.raises(StoreError, match=r"HTTP 401\): no token was found: set HF_TOKEN or run `hf auth login`"):
        anonymous.create()


def test_the_token_hf_auth_login_saved_is_used_without_hf_token(
    hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants as hf_constants

    from trainer.store.url import open_store

    (tmp_path / "token").write_text(HUB_TOKEN + "\n")
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    store = open_store("hf://tester/login")
    store.create()
    store.commit({"a.json": write(tmp_path, "a", b"{}")})
    writes = hub_server.requests("POST", r"^/api/repos/create$") + hub_server.requests("POST", COMMIT)
    assert writes and all(r["authorized"] for r in writes)
    assert HUB_TOKEN not in repr(store)
    # The store knows it holds that token: a rejected one is named as the token in use, never "no token".
    (tmp_path / "token").write_text("hf_ExpiredLoginToken9876\n")
    with pytest.raises(StoreError) as e:
        open_store("hf://tester/login").commit({"b.json": write(tmp_path, "b", b"{}")})
    assert "the token in use (HF_TOKEN, or the one `hf auth login` saved) is invalid" in str(e.value)
    assert "hf_ExpiredLoginToken9876" not in str(e.value)


def test_retry_backoff_never_touches_the_global_random(
    hub_server: HubServer, hub_store, sleeps, tmp_path: Path
) -> None:
    import random

    store = ready(hub_store, "sjitter")
    random.seed(1234)
    state = random.getstate()
    hub_server.inject("status", COMMIT, status=503, times=3)
    store.commit({"a.json": write(tmp_path, "a", b"{}")})
    assert len(sleeps.delays) == 3 and len(set(sleeps.delays)) == 3  # jittered, exponential
    assert random.getstate() == state  # training state (saved in rng.pt) is not moved by a retry
