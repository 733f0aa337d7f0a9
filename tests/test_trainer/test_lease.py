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
    single_cmd,
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
    ttl = max(120, expires_in + 5)  # a writer's expiry is its renewal plus its TTL
    doc = LeaseDoc(writer=writer, acquired=now - 60, renewed=now - 5, expires=now + expires_in, ttl_s=ttl)
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
        pid_ns=me.pid_ns,
    )
    reused = Writer(
        id=f"{me.host}:{me.pid}:0ldpid00",
        host=me.host,
        boot_id=me.boot_id,
        pid=me.pid,
        pid_start=str(int(me.pid_start) - 1),
        pid_ns=me.pid_ns,
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


def test_a_released_lease_is_never_claimed_again_by_a_late_write(store, tmp_path):
    """A push thread still running when the session ends must not take the store back after the release."""
    lease = Lease(store, ttl_s=60, log=[].append)
    lease.acquire()
    lease.release()
    for late in (lambda: lease.commit({"x": write(tmp_path, "x", b"x")}), lease.acquire):
        with pytest.raises(LeaseLost, match="released its lease; it writes no more"):
            late()
    revision = store.revision()
    lease.renew()  # a heartbeat that woke as the session ended: nothing to keep, nothing said
    assert sorted(store.list_files()) == [] and store.revision() == revision


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
    with pytest.raises(
        ValueError, match=r"SPECPROBE_LEASE_TTL_S must be a number of seconds in \(0, 604800\], got 'soon'"
    ):
        Lease(store)


# ------------------------------------------------------------------------- PID namespaces (containers)

HOLDER_SCRIPT = """
import json, sys
from dataclasses import asdict
from trainer.store.lease import Lease
from trainer.store.url import open_store
lease = Lease(open_store(sys.argv[1]), ttl_s=600, log=lambda line: None)
lease.acquire()
print("HELD " + json.dumps(asdict(lease.me)), flush=True)
sys.stdin.read()  # hold the lease until the test closes our stdin
lease.release()
print("RELEASED", flush=True)
"""


def _unshare_works() -> str | None:
    """Why a PID-namespace test cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "unshare --pid needs root"
    try:
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare cannot run: {e}"
    return None if r.returncode == 0 else f"unshare --pid --fork --mount-proc failed: {r.stderr.decode()[:200]}"


def test_a_live_holder_in_another_pid_namespace_on_this_host_is_not_taken_over(store):
    """Two containers on one host: the same host name and boot id, their own PID namespaces. The holder's pid
    means another process (or none) here; its lease must stand until it expires."""
    why = _unshare_works()
    if why:
        pytest.skip(why)
    holder_proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", HOLDER_SCRIPT, store.url],
        cwd=Path(__file__).resolve().parents[2],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = holder_proc.stdout.readline()
        assert line.startswith("HELD "), line
        theirs = Writer(**json.loads(line[len("HELD ") :]))
        me = this_writer()
        assert (theirs.host, theirs.boot_id) == (me.host, me.boot_id) and theirs.pid_ns != me.pid_ns
        with pytest.raises(LeaseHeld, match=f"writer {theirs.id} "):
            Lease(store, ttl_s=60, log=[].append).acquire()
        assert holder(store) == theirs  # still theirs: its next push lands
    finally:
        holder_proc.stdin.close()
        rest = holder_proc.stdout.read()
        holder_proc.wait(timeout=30)
    assert "RELEASED" in rest and LEASE_PATH not in store.list_files()


def test_a_dead_holder_recorded_in_another_pid_namespace_waits_for_expiry(store, tmp_path):
    """Its process is gone, but it ran in another PID namespace: this process cannot see it, so only the
    expiry says it is stale. The same for a lease that records no namespace (written before the field)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    me = this_writer()
    dead = dict(id=f"{me.host}:{done.stdout.strip()}:deadbeef", host=me.host, boot_id=me.boot_id)
    dead.update(pid=int(done.stdout), pid_start="1")
    for ns in ("pid:[1]", ""):
        plant(store, tmp_path, Writer(**dead, pid_ns=ns), expires_in=600)
        with pytest.raises(LeaseHeld, match=f"writer {dead['id']} "):
            Lease(store, ttl_s=60, log=[].append).acquire()
    plant(store, tmp_path, Writer(**dead, pid_ns="pid:[1]"), expires_in=-5)
    lines: list[str] = []
    Lease(store, ttl_s=60, log=lines.append).acquire()
    assert f"took over from {dead['id']}: it expired 5s ago" in lines[0]


def test_a_proc_mounted_for_another_pid_namespace_judges_no_holder_gone(store, tmp_path):
    """After `unshare --pid` without a new /proc, /proc shows the parent namespace: a pid there is another
    process than the one the lease names, so nothing is judged gone from it."""
    why = _unshare_works()
    if why:
        pytest.skip(why)
    script = (
        "import sys\n"
        "from trainer.store.lease import Lease, LeaseHeld, Writer, this_writer\n"
        "from trainer.store.url import open_store\n"
        "me = this_writer()\n"
        # pid 2 of this namespace does not exist; /proc/2 of the parent's is another process
        "gone = Writer(id=f'{me.host}:2:0ther000', host=me.host, boot_id=me.boot_id, pid=2, pid_start='1',"
        " pid_ns=me.pid_ns)\n"
        "print(me.pid, gone.here, flush=True)\n"
    )
    r = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "False"]


# ----------------------------------------------------------------------------- lease values, bounded


def plant_raw(store, tmp_path: Path, change) -> None:
    """A lease.json as another writer wrote it, then changed by ``change`` (a dict edit) or given as text."""
    now = time.time()
    doc = LeaseDoc(writer=FOREIGN, acquired=now - 60, renewed=now - 5, expires=now + 100, ttl_s=105).to_json()
    text = change if isinstance(change, str) else json.dumps(change(doc) or doc)
    store.commit({LEASE_PATH: write(tmp_path, "odd-lease.json", text.encode())})


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda d: d.update(expires=1e20), "field 'expires': 1e+20 is out of range [0, 2.53402e+11]"),
        (lambda d: d.update(acquired=-1), "field 'acquired': -1.0 is out of range"),
        (lambda d: d.update(ttl_s=0), "field 'ttl_s': 0.0 is out of range (0, 604800]"),
        (lambda d: d.update(ttl_s=1e9), "field 'ttl_s': 1000000000.0 is out of range [0, 604800]"),
        (lambda d: d.update(expires=d["renewed"] + 5e6, ttl_s=600), "is more than ttl_s 600 past renewed"),
        (lambda d: d.update(renewed="soon"), "field 'renewed': must be a number, got 'soon'"),
        (lambda d: d["writer"].update(pid=2**40), "field 'writer.pid': 1099511627776 is out of range [1, 4194304]"),
        (lambda d: d["writer"].update(pid="12"), "field 'writer.pid': must be an integer, got '12'"),
        (lambda d: d["writer"].update(host="a\nrefused: forged"), "field 'writer.host': holds a control character"),
        (lambda d: d["writer"].update(pid_ns="/etc/x"), "field 'writer.pid_ns': '/etc/x' does not have the form"),
        ('{"format": "specprobe-lease/1", "expires": Infinity}', "is not valid JSON: Infinity is not a JSON number"),
        ('{"format": "specprobe-lease/1", "expires": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
    ],
)
def test_a_lease_value_out_of_range_is_refused_naming_the_field(store, tmp_path, change, needle):
    plant_raw(store, tmp_path, change)
    with pytest.raises(StoreError) as e:
        Lease(store, ttl_s=60, log=[].append).acquire()
    msg = str(e.value)
    assert f"lease.json in {store.url} is not a valid lease (" in msg and needle in msg, msg
    assert "delete lease.json from the repo" in msg


@pytest.mark.parametrize("raw", ["inf", "nan", "-inf", "0", "-5", "1e9", "1e400"])
def test_a_lease_ttl_in_the_environment_out_of_range_is_refused(store, monkeypatch, raw):
    monkeypatch.setenv("SPECPROBE_LEASE_TTL_S", raw)
    with pytest.raises(
        ValueError, match=rf"SPECPROBE_LEASE_TTL_S must be a number of seconds in \(0, 604800\], got '{raw}'"
    ):
        Lease(store)


@pytest.mark.slow
@pytest.mark.parametrize(
    "env, lease, needle",
    [
        ({"SPECPROBE_LEASE_TTL_S": "inf"}, None, "SPECPROBE_LEASE_TTL_S must be a number of seconds in (0, 604800]"),
        ({}, lambda d: d.update(expires=1e20), "field 'expires': 1e+20 is out of range"),
    ],
)
def test_a_lease_time_out_of_range_stops_the_trainer_with_a_refusal_not_a_traceback(
    tmp_path, tmp_path_factory, env, lease, needle
):
    base = baseline(tmp_path_factory)
    repo = store_url(tmp_path / "store")
    if lease is not None:
        s = open_store(repo)
        s.create()
        plant_raw(s, tmp_path, lease)
    args = trainer_args(root=base.mix, out=tmp_path / "out", repo=repo, steps=2, push_every=2, nproc=1)
    run = run_trainer(single_cmd(args), env=env, timeout=90)
    assert run.rc == 3, explain(run)
    refusals = run.starting("refused: ")
    assert len(refusals) == 1 and needle in refusals[0], explain(run)
    assert "Traceback" not in run.text and "OverflowError" not in run.text


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
        torchrun_cmd(base.args(tmp_path / "out", repo + "?link_mb_s=1")),
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
