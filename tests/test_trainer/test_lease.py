"""One writer per store: the lease (trainer/store/lease.py) over the real local store and the Hub test server, and two
real trainers (torchrun, 2 gloo ranks) on one store: the second is refused, naming the first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from blobs import write
from trainer_helpers import (
    BASELINE_PUSH_EVERY,
    BASELINE_STEPS,
    baseline,
    explain,
    run_trainer,
    store_url,
    torchrun_cmd,
    trainer_args,
    weights_sha256,
)

from trainer.store import Conflict, LocalStore, StoreError
from trainer.store.lease import LEASE_PATH, Lease, LeaseDoc, LeaseHeld, LeaseLost, Writer, parse_lease, this_writer
from trainer.store.url import open_store

FOREIGN = Writer(id="far-away:4242:abcd1234", host="far-away", boot_id="0000-boot", pid=4242, pid_start="99")


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    s = open_store(f"file://{tmp_path}/store/probe/lease")
    s.create()
    return s


def plant(store, tmp_path: Path, writer: Writer, *, expires_in: float) -> LeaseDoc:
    """Another writer's lease, committed as that writer would."""
    now = time.time()
    doc = LeaseDoc(writer=writer, acquired=now - 60, renewed=now - 5, expires=now + expires_in, ttl_s=120)
    store.commit({LEASE_PATH: write(tmp_path, "planted-lease.json", json.dumps(doc.to_json()).encode())})
    return doc


def holder(store) -> Writer:
    return parse_lease(store.read_bytes(LEASE_PATH), LEASE_PATH).writer


def test_acquire_commits_the_lease_and_release_removes_it(store):
    lines: list[str] = []
    lease = Lease(store, ttl_s=60, log=lines.append)
    lease.acquire()
    assert holder(store) == this_writer() and lease.held
    assert lines[0].startswith(f"lease: {this_writer().id} holds {store.url} until ")
    lease.release()
    assert LEASE_PATH not in store.list_files() and not lease.held
    assert lines[-1] == f"lease: {this_writer().id} released {store.url}"


def test_a_live_holder_refuses_a_second_writer_naming_it(store, tmp_path):
    plant(store, tmp_path, FOREIGN, expires_in=100)
    with pytest.raises(LeaseHeld) as e:
        Lease(store, ttl_s=60, log=[].append).acquire()
    msg = str(e.value)
    assert "is being written by another trainer" in msg
    assert "writer far-away:4242:abcd1234 (host far-away, pid 4242)" in msg
    assert "expires " in msg and holder(store) == FOREIGN  # untouched


def test_an_expired_lease_is_taken_over(store, tmp_path):
    plant(store, tmp_path, FOREIGN, expires_in=-30)
    lines: list[str] = []
    Lease(store, ttl_s=60, log=lines.append).acquire()
    assert holder(store) == this_writer()
    assert "(took over from far-away:4242:abcd1234: it expired 30s ago" in lines[0]


def test_a_holder_whose_process_died_on_this_machine_is_taken_over_at_once(store, tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    me = this_writer()
    dead = Writer(
        id=f"{me.host}:{done.stdout.strip()}:deadbeef",
        host=me.host,
        boot_id=me.boot_id,
        pid=int(done.stdout),
        pid_start="1",
    )
    reused = Writer(
        id=f"{me.host}:{me.pid}:0ldpid00",
        host=me.host,
        boot_id=me.boot_id,
        pid=me.pid,
        pid_start=str(int(me.pid_start) - 1),
    )  # this pid, but another process's start time
    for gone in (dead, reused):
        plant(store, tmp_path, gone, expires_in=600)
        lines: list[str] = []
        Lease(store, ttl_s=60, log=lines.append).acquire()
        assert holder(store) == me
        assert f"took over from {gone.id}: its process {gone.pid} on this machine is gone" in lines[0]


def test_the_heartbeat_renews_the_lease_while_the_writer_works(store, tmp_path):
    lease = Lease(store, ttl_s=1.2, log=[].append)
    lease.acquire()
    first = parse_lease(store.read_bytes(LEASE_PATH), LEASE_PATH).expires
    time.sleep(2.0)  # longer than the TTL: only renewals keep it alive
    doc = parse_lease(store.read_bytes(LEASE_PATH), LEASE_PATH)
    assert doc.writer == this_writer() and doc.expires > first + 0.5 and doc.expires > time.time()
    lease.release()


def test_a_writer_whose_lease_was_taken_over_stops_writing(store, tmp_path):
    lease = Lease(store, ttl_s=60, log=[].append)
    lease.acquire()
    plant(store, tmp_path, FOREIGN, expires_in=100)  # ours expired meanwhile and another writer claimed it
    with pytest.raises(LeaseLost, match="lost its lease: it is held by writer far-away:4242"):
        lease.commit({"latest.json": write(tmp_path, "l", b"{}")}, message="pointer")
    assert "latest.json" not in store.list_files()
    with pytest.raises(LeaseLost):  # and stays stopped
        lease.commit({"x": write(tmp_path, "x", b"x")})
    lease.release()  # not ours: left alone
    assert holder(store) == FOREIGN


def test_a_write_renews_a_lease_that_is_due_in_the_same_commit(store, tmp_path):
    clock = [1000.0]
    lease = Lease(store, ttl_s=100, log=[].append, clock=lambda: clock[0])
    lease.acquire()
    clock[0] += 70  # 30 s left of 100: due
    rev_before = json.loads((store.dir / ".specprobe/manifest.json").read_text())["revision"]
    lease.commit({"a": write(tmp_path, "a", b"a")}, message="work")
    manifest = json.loads((store.dir / ".specprobe/manifest.json").read_text())
    assert manifest["revision"] == rev_before + 1 and sorted(manifest["log"][-1]["added"]) == ["a", LEASE_PATH]
    assert parse_lease(store.read_bytes(LEASE_PATH), LEASE_PATH).expires == 1170.0


class RacedStore(LocalStore):
    """Another writer's lease lands between our read of the head and our compare-and-swap commit."""

    def __init__(self, *a, rival: tuple, **kw):
        super().__init__(*a, **kw)
        self.rival = rival

    def commit(self, add, delete=(), message="", expect_revision=None):
        if self.rival:
            store, tmp_path = self.rival
            self.rival = ()
            plant(store, tmp_path, FOREIGN, expires_in=100)
        return super().commit(add, delete, message, expect_revision)


def test_two_writers_racing_for_the_lease_one_wins_by_compare_and_swap(store, tmp_path):
    raced = RacedStore(store.root, store.repo_id, url=store.url, rival=(store, tmp_path))
    with pytest.raises(LeaseHeld, match="far-away:4242"):
        Lease(raced, ttl_s=60, log=[].append).acquire()
    assert holder(store) == FOREIGN


def test_the_hub_claims_the_lease_by_parent_commit(hub_server, hub_store, tmp_path):
    store = hub_store("lease")
    store.create()
    rev = store.revision()
    other = hub_store("lease")
    other.commit({"x": write(tmp_path, "x", b"x")})  # the head moves after we read it
    with pytest.raises(Conflict, match="the head moved"):
        store.commit({LEASE_PATH: write(tmp_path, "l", b"{}")}, expect_revision=rev)
    assert LEASE_PATH not in store.list_files()
    plant(other, tmp_path, FOREIGN, expires_in=100)
    with pytest.raises(LeaseHeld, match="far-away"):
        Lease(store, ttl_s=60, log=[].append).acquire()
    other.commit({}, delete=[LEASE_PATH])
    lease = Lease(store, ttl_s=60, log=[].append)
    lease.acquire()
    assert parse_lease(hub_server.files("tester/lease")[LEASE_PATH], LEASE_PATH).writer == this_writer()
    lease.release()
    assert LEASE_PATH not in hub_server.files("tester/lease")


def test_a_malformed_lease_is_refused_not_taken_over(store, tmp_path):
    store.commit({LEASE_PATH: write(tmp_path, "bad", b"{half a lease")})
    with pytest.raises(StoreError, match="lease.json in .* is not a valid lease .*delete lease.json"):
        Lease(store, ttl_s=60, log=[].append).acquire()


def test_a_bad_lease_ttl_in_the_environment_names_the_variable(store, monkeypatch):
    monkeypatch.setenv("SPECPROBE_LEASE_TTL_S", "soon")
    with pytest.raises(ValueError, match="SPECPROBE_LEASE_TTL_S must be a positive number of seconds, got 'soon'"):
        Lease(store)


# ------------------------------------------------------------------------------ two real trainers


@pytest.mark.slow
def test_a_second_trainer_on_the_same_store_is_refused_naming_the_first_which_finishes(tmp_path, tmp_path_factory):
    base = baseline(tmp_path_factory)
    repo = store_url(tmp_path / "store")
    args = dict(root=base.mix, repo=repo, steps=BASELINE_STEPS, push_every=BASELINE_PUSH_EVERY)
    env = {"SPECPROBE_LEASE_TTL_S": "600"}  # A's lease outlives however long B takes to start
    b: dict[str, object] = {}

    def second_trainer_while_a_is_frozen(a_rank0: int) -> None:
        # A is frozen (an orphaned leg that still holds the store); B starts on the same store.
        try:
            b["run"] = run_trainer(torchrun_cmd(trainer_args(out=tmp_path / "out-b", **args)), env=env, timeout=150)
        finally:
            os.kill(a_rank0, signal.SIGCONT)

    def on_a_line(line: str) -> None:
        if line.startswith("lease: ") and " holds " in line and "frozen" not in b:
            rank0 = int(line.split()[1].split(":")[1])  # the writer id is host:pid:token
            os.kill(rank0, signal.SIGSTOP)
            b["frozen"] = rank0
            threading.Thread(target=second_trainer_while_a_is_frozen, args=(rank0,), daemon=True).start()

    a = run_trainer(torchrun_cmd(trainer_args(out=tmp_path / "out-a", **args)), env=env, on_line=on_a_line, timeout=300)
    assert a.rc == 0 and a.run_json is not None, explain(a)
    assert "run" in b, "trainer B never ran"
    b_run = b["run"]
    # B was refused on every rank, naming A's lease; it trained and pushed nothing.
    refusals = b_run.starting("refused: ")
    assert b_run.rc != 0 and len(refusals) == 1, explain(b_run)
    a_writer = next(line for line in a.lines if line.startswith("lease: ") and " holds " in line).split()[1]
    assert "is being written by another trainer" in refusals[0] and f"writer {a_writer} " in refusals[0]
    assert not b_run.starting("step ") and not b_run.starting("CKPT push")
    # A finished the run as if alone, and released the lease at the end.
    assert weights_sha256(repo) == base.final_sha
    assert f"lease: {a_writer} released {repo}" in a.lines, explain(a)
    assert LEASE_PATH not in open_store(repo).list_files()


@pytest.mark.slow
def test_a_trainer_renews_its_lease_while_it_trains(tmp_path, tmp_path_factory):
    base = baseline(tmp_path_factory)
    # Pushes over a slow link (1.5 s each) keep the session writing for several of its 2 s leases.
    repo = store_url(tmp_path / "store")
    run = run_trainer(
        torchrun_cmd(
            trainer_args(
                root=base.mix,
                out=tmp_path / "out",
                repo=repo + "?link_mb_s=1",
                steps=BASELINE_STEPS,
                push_every=BASELINE_PUSH_EVERY,
            )
        ),
        env={"SPECPROBE_LEASE_TTL_S": "2"},
        timeout=240,
    )
    assert run.rc == 0 and run.run_json is not None, explain(run)
    store = open_store(repo)
    log = json.loads((store.dir / ".specprobe/manifest.json").read_text())["log"]
    writes = [e["message"].split("\n")[0] for e in log if LEASE_PATH in e.get("added", ())]
    # Acquired once, then renewed: by the heartbeat ("lease renewed") or riding in the session's own commits.
    assert writes[0] == "lease acquired" and len(writes) >= 3, writes
    assert weights_sha256(repo) == base.final_sha and LEASE_PATH not in store.list_files()
