"""A store that is not what its writer left: objects that are FIFOs or devices, a lease.json that is a folder,
a lease written by a machine whose clock runs ahead; and what a killed trainer leaves in the system's temp dir.

Each read that could block forever runs in a child process with a deadline, so a store that hangs a reader fails
the test instead of hanging it. The trainer cases run the real trainer (one process) on copies of a real store.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_helpers import (
    REPO_ROOT,
    copy_repo,
    explain,
    open_repo,
    pointer,
    repo_dir,
    repo_files,
    run_trainer,
    segment_one_process,
    single_cmd,
    trainer_args,
)

from trainer.store import LocalStore, StoreError, open_store
from trainer.store.lease import Lease, LeaseDoc, LeaseHeld, Writer

READ_DEADLINE_S = 60  # a read that has not failed by then is waiting on the FIFO


def in_child(code: str, *argv: str) -> list[str]:
    """``code`` run by a fresh interpreter (argv in sys.argv[1:]), its stdout lines; TimeoutExpired (the
    child killed) when it does not end within READ_DEADLINE_S."""
    proc = subprocess.run(
        [sys.executable, "-c", "import sys\n" + code, *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=READ_DEADLINE_S,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def replace_with(path: Path, kind: str) -> None:
    """Put a FIFO, or a character device (/dev/null's numbers: it reads as empty), where ``path`` is."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))


def store_with_pointer(tmp_path: Path) -> tuple[LocalStore, Path]:
    """A local store holding latest.json; (the store, the path of latest.json's object)."""
    store = open_store(f"file://{tmp_path}/store/o/run")
    assert isinstance(store, LocalStore)
    store.create()
    src = tmp_path / "latest.json"
    src.write_text("{}")
    store.commit({"latest.json": src})
    return store, store.dir / ".specprobe" / "objects" / store.list_files()["latest.json"].sha256


READ_THREE_WAYS = """
from pathlib import Path
from trainer.store import open_store
store = open_store(sys.argv[1])
for name, read in (
    ("read_bytes", lambda: store.read_bytes("latest.json")),
    ("sha256", lambda: store.sha256("latest.json")),
    ("download", lambda: store.download("latest.json", Path(sys.argv[2]))),
):
    try:
        read()
        print(name, "read")
    except Exception as e:
        print(name, type(e).__name__, e)
"""


@pytest.mark.parametrize("kind, said", [("fifo", "a FIFO"), ("chardev", "a character device")])
def test_a_stored_object_that_is_a_fifo_or_a_device_is_refused_naming_it(tmp_path, kind, said):
    if kind == "chardev" and os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    store, obj = store_with_pointer(tmp_path)
    replace_with(obj, kind)
    lines = in_child(READ_THREE_WAYS, store.url, str(tmp_path / "got" / "latest.json"))
    want = (
        f"StoreError latest.json in {store.url}: its stored object {obj} is {said}, not bytes the store wrote "
        "(the store is damaged); refusing to read it"
    )
    assert lines == [f"{way} {want}" for way in ("read_bytes", "sha256", "download")]
    assert not (tmp_path / "got").exists() or list((tmp_path / "got").iterdir()) == []


def test_a_manifest_or_journal_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    store, _ = store_with_pointer(tmp_path)
    meta = store.dir / ".specprobe"
    os.mkfifo(meta / "written.json")  # the journal: read by the next commit
    lines = in_child(
        "from pathlib import Path\nfrom trainer.store import open_store\ns = open_store(sys.argv[1])\n"
        "p = Path(sys.argv[2]); p.write_text('x')\n"
        "try:\n    s.commit({'x.txt': p})\nexcept Exception as e:\n    print(type(e).__name__, e)\n",
        store.url,
        str(tmp_path / "x.txt"),
    )
    assert lines == [
        f"StoreError {store.url}: its journal {meta / 'written.json'} is a FIFO, not a file the store wrote; "
        "refusing to read the repo through it. Restore .specprobe/ from a copy of the repo."
    ]
    (meta / "written.json").unlink()
    replace_with(meta / "manifest.json", "fifo")
    lines = in_child(
        "from trainer.store import open_store\ns = open_store(sys.argv[1])\n"
        "for f in (s.exists, s.list_files):\n"
        "    try:\n        f()\n    except Exception as e:\n        print(type(e).__name__, e)\n",
        store.url,
    )
    assert lines == [
        f"StoreError {store.url}: {meta / 'manifest.json'} is a FIFO, not the store's manifest file; refusing to "
        "read the repo through it or to start a new one over it. Restore .specprobe/manifest.json from a copy "
        "of the repo.",
        f"StoreError {store.url}: its manifest {meta / 'manifest.json'} is a FIFO, not a file the store wrote; "
        "refusing to read the repo through it. Restore .specprobe/ from a copy of the repo.",
    ]


def test_the_hub_collector_reports_a_fifo_object_in_its_document(tmp_path):
    store, obj = store_with_pointer(tmp_path)
    replace_with(obj, "fifo")
    (line,) = in_child(
        "import json\nfrom trainer.collector import collect\nprint(json.dumps(collect({'repo': sys.argv[1]}, {})))",
        store.url,
    )
    doc = json.loads(line)
    assert doc["exists"] is True and doc["files"] == ["latest.json"] and doc["pointer"] is None
    assert doc["pointer_error"] == (
        f"StoreError: latest.json in {store.url}: its stored object {obj} is a FIFO, not bytes the store wrote "
        "(the store is damaged); refusing to read it"
    )


@pytest.mark.slow
def test_a_resume_from_a_fifo_object_is_refused_at_once_naming_it(tmp_path, tmp_path_factory):
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    obj = repo_dir(repo) / ".specprobe" / "objects" / pointer(repo)["files"]["optimizer.pt"]
    replace_with(obj, "fifo")
    args = trainer_args(root=mix, out=tmp_path / "out", repo=repo, steps=6, push_every=2, nproc=1, resume="must")
    run = run_trainer(single_cmd(args), timeout=120)  # a resume waiting on the FIFO would run into this
    assert run.rc == 3, explain(run)
    (refusal,) = run.starting("refused: ")
    assert refusal.startswith(f"refused: fetching ckpt/checkpoint-4 from {repo}: "), explain(run)
    assert (
        f"ckpt/checkpoint-4/optimizer.pt in {repo}: its stored object {obj} is a FIFO, not bytes the store wrote "
        "(the store is damaged); refusing to read it"
    ) in refusal
    assert run.seconds < 60 and not run.starting("step ")


# ---------------------------------------------------------------------------------------- the lease


def test_a_lease_json_folder_refuses_the_lease_naming_it_and_commits_nothing(tmp_path):
    store, _ = store_with_pointer(tmp_path)
    folder = store.dir / "lease.json"
    (folder / "notes").mkdir(parents=True)
    (folder / "notes" / "todo.txt").write_text("someone's files")
    before = store.revision()
    with pytest.raises(StoreError) as refused:
        Lease(store, log=lambda _: None).acquire()
    assert str(refused.value) == (
        f"cannot commit lease.json to {store.url}: {folder} is a folder on disk, holding files the store did not "
        "write (notes/todo.txt); a file cannot be placed there, so the commit would be published and then fail, "
        f"and so would every commit after it. Nothing was committed. Move {folder} out of the repo folder (the "
        "store deletes only files it wrote), then try again."
    )
    assert store.revision() == before and sorted(store.list_files()) == ["latest.json"]
    assert (folder / "notes" / "todo.txt").read_text() == "someone's files"  # nothing deleted
    # The way out the message names: once the folder is moved aside, the lease is claimed.
    folder.rename(tmp_path / "moved-aside")
    lease = Lease(store, log=lambda _: None)
    lease.acquire()
    lease.release()
    assert sorted(store.list_files()) == ["latest.json"]


def test_an_empty_lease_json_folder_is_tidied_away_like_any_empty_folder(tmp_path):
    store, _ = store_with_pointer(tmp_path)
    (store.dir / "lease.json" / "empty").mkdir(parents=True)
    lease = Lease(store, log=lambda _: None)
    lease.acquire()
    assert (store.dir / "lease.json").is_file() and "lease.json" in store.list_files()
    lease.release()


def test_a_stray_file_where_a_committed_files_folder_goes_refuses_the_commit_before_publishing(tmp_path):
    store, _ = store_with_pointer(tmp_path)
    (store.dir / "ckpt").write_text("a note left here by hand")
    src = tmp_path / "model.safetensors"
    src.write_bytes(b"weights")
    before = store.revision()
    with pytest.raises(StoreError) as refused:
        store.commit({"ckpt/checkpoint-2/model.safetensors": src})
    assert str(refused.value) == (
        f"cannot commit ckpt/checkpoint-2/model.safetensors to {store.url}: {store.dir / 'ckpt'} is a file the "
        "store did not write, where a folder of ckpt/checkpoint-2/model.safetensors must be. Nothing was committed. "
        "Move it out of the repo folder (the store deletes only files it wrote), then try again."
    )
    assert store.revision() == before and (store.dir / "ckpt").read_text() == "a note left here by hand"


@pytest.mark.slow
def test_a_trainer_refuses_a_store_whose_lease_json_is_a_folder_and_leaves_it_out_of_the_manifest(
    tmp_path, tmp_path_factory
):
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    folder = repo_dir(repo) / "lease.json"
    folder.mkdir()
    (folder / "x").write_text("x")
    files = repo_files(repo)
    args = trainer_args(root=mix, out=tmp_path / "out", repo=repo, steps=6, push_every=2, nproc=1, resume="must")
    run = run_trainer(single_cmd(args), timeout=120)
    assert run.rc == 3, explain(run)
    (refusal,) = run.starting("refused: ")
    assert f"cannot commit lease.json to {repo}: {folder} is a folder on disk" in refusal
    assert f"Move {folder} out of the repo folder" in refusal and "Errno" not in run.text
    assert repo_files(repo) == files and "lease.json" not in files


def lease_from(host: str, renewed: float, ttl: float = 900.0) -> LeaseDoc:
    writer = Writer(id=f"{host}:4242:0abc", host=host, boot_id="b", pid=4242, pid_start="1", pid_ns="pid:[1]")
    return LeaseDoc(writer=writer, acquired=renewed - 60, renewed=renewed, expires=renewed + ttl, ttl_s=ttl)


def commit_lease(store: LocalStore, doc: LeaseDoc, tmp_path: Path) -> None:
    """lease.json as another machine wrote it (committed through the real store)."""
    src = tmp_path / "their-lease.json"
    src.write_text(json.dumps(doc.to_json()))
    store.commit({"lease.json": src}, message="lease acquired")


def test_a_lease_from_a_machine_whose_clock_is_ahead_is_refused_saying_so(tmp_path):
    store, _ = store_with_pointer(tmp_path)
    now = 1_800_000_000.0
    commit_lease(store, lease_from("gpu-7", renewed=now + 7200 - 3), tmp_path)
    with pytest.raises(LeaseHeld) as held:
        Lease(store, log=lambda _: None, clock=lambda: now).acquire()
    said = str(held.value)
    assert "expires 2027-01-15T10:14:57Z (in 8097s). The holder's clock is ahead of this machine's: it renewed" in said
    assert (
        "it renewed the lease at 2027-01-15T09:59:57Z by its clock, 7197s after now by this machine's "
        "(2027-01-15T08:00:00Z); by its own clock the lease expires 900s after that renewal, by this one's in "
        "8097s. Set the clock of host gpu-7 right (or this machine's, if it is the one behind). If that trainer "
        "is gone, delete lease.json from the repo to take the store over now."
    ) in said


def test_a_lease_renewed_within_the_clock_skew_says_nothing_of_clocks(tmp_path):
    store, _ = store_with_pointer(tmp_path)
    now = 1_800_000_000.0
    commit_lease(store, lease_from("gpu-7", renewed=now + 30), tmp_path)
    with pytest.raises(LeaseHeld) as held:
        Lease(store, log=lambda _: None, clock=lambda: now).acquire()
    assert "(in 930s). Two writers would fork the run" in str(held.value) and "clock" not in str(held.value)


# ------------------------------------------------------------------------------------- the temp dir


@pytest.mark.slow
def test_a_trainer_killed_inside_a_push_leaves_nothing_in_the_temp_dir(tmp_path, tmp_path_factory):
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # A slow link: the push's commit takes about 30 s (1.4 MB at 0.05 MB/s). The kill comes a second after the
    # push's first line (the reader waits before it looks for the kill line), well inside the lease's commit.
    slow = f"{repo}?link_mb_s=0.05"
    args = trainer_args(root=mix, out=tmp_path / "out", repo=slow, steps=6, push_every=1, nproc=1, resume="must")
    run = run_trainer(
        single_cmd(args),
        kill_on=r"^CKPT push step=5 ",
        on_line=lambda line: time.sleep(1.0) if line.startswith("CKPT push step=5 ") else None,
        env={"TMPDIR": str(tmp)},
        timeout=120,
    )
    assert run.killed_at is not None, explain(run)
    time.sleep(0.5)  # nothing of the killed process may still be writing
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("specprobe")) == []
    assert pointer(repo)["step"] == 4 and open_repo(repo).read_bytes("lease.json")  # the kill left its lease


def test_an_interrupt_that_lands_as_a_file_is_opened_closes_its_descriptor_once(tmp_path, monkeypatch) -> None:
    """A SIGINT can land inside os.fdopen once its file object holds the descriptor. The KeyboardInterrupt must
    come out as it is, and the descriptor must be closed once, by its file object: closed by open_regular too,
    the number went to the next file opened, which the file object's own close then took away."""
    import gc

    from trainer.store import protocol

    (tmp_path / "object.bin").write_bytes(b"weights")
    real_fdopen = os.fdopen

    def fdopen_then_interrupted(fd: int, *args, **kwargs):  # not a mock: the real fdopen, then the signal
        held = real_fdopen(fd, *args, **kwargs)  # noqa: F841  (alive in the traceback, as in a real interrupt)
        raise KeyboardInterrupt

    monkeypatch.setattr(protocol.os, "fdopen", fdopen_then_interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        protocol.open_regular(tmp_path / "object.bin")
    monkeypatch.undo()
    with open(tmp_path / "later.txt", "w") as later:
        del caught  # the interrupted frame and its file object go; the file opened since must stay open
        gc.collect()
        os.fstat(later.fileno())
        later.write("still open")
    assert (tmp_path / "later.txt").read_text() == "still open"
