"""An outage longer than an operation's tries: the Hub store keeps trying at its longest backoff until
SPECPROBE_HUB_OUTAGE_S after the first try, never past SPECPROBE_HUB_DEADLINE_S; so a checkpoint push and the
lease's release wait an outage out instead of losing the session, and a release that still fails says until when
the lease holds. Times are scaled down by the knobs (tenths of seconds where the defaults say minutes)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from blobs import write
from hubserver import HUB_TOKEN, HubServer
from test_hub_faults import make_ckpt, run_pushes
from trainer_helpers import run_trainer, tiny_mix, torchrun_cmd, trainer_args

from trainer.ckpt.checkpointer import Checkpointer, read_pointer
from trainer.store import StoreUnavailable
from trainer.store.hub import HubStore, RetryPolicy, Timeouts
from trainer.store.lease import LEASE_PATH

COMMIT = r"/commit/main$"


def scaled(seconds: float) -> float:
    """``seconds`` stretched by the machine's load (its cores are shared): a time bound, never a sleep."""
    return seconds * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def outage_store(server: HubServer, name: str, *, outage_s: float, deadline_in: float | None = None) -> HubStore:
    """Two tries 0.05 s apart, then an outage tried through every 0.2 s for ``outage_s``; real sleeps."""
    policy = RetryPolicy(attempts=2, base_s=0.05, max_s=0.2, outage_s=outage_s)
    if deadline_in is not None:
        policy.deadline = policy.clock() + deadline_in
    return HubStore(
        f"tester/{name}", endpoint=server.url, token=HUB_TOKEN, retry=policy, timeouts=Timeouts(connect_s=5, read_s=5)
    )


def test_an_outage_longer_than_the_tries_is_waited_out_and_the_commit_lands_once(
    hub_server: HubServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = outage_store(hub_server, "outage", outage_s=30)
    store.create()
    before = hub_server.commit_count("tester/outage")
    fault = hub_server.inject("status", COMMIT, status=503, duration_s=1.5)
    rev = store.commit({"a.json": write(tmp_path, "a", b"{}")}, message="m")
    assert rev == hub_server.repo("tester/outage").head.oid and hub_server.commit_count("tester/outage") == before + 1
    statuses = [r["status"] for r in hub_server.requests("POST", COMMIT)]
    assert statuses[-1] == 200 and statuses.count(503) == fault.fired > 2  # more than the two tries
    assert "the Hub looks unreachable or down; trying again in 0.2s, for up to 30s after the first try" in caplog.text


def test_an_outage_is_not_waited_past_the_deadline(hub_server: HubServer, tmp_path: Path) -> None:
    store = outage_store(hub_server, "deadline", outage_s=600, deadline_in=1.0)
    store.create()
    hub_server.inject("status", COMMIT, status=503, times=10_000)
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable) as e:
        store.commit({"a.json": write(tmp_path, "a", b"{}")})
    assert time.monotonic() - t0 < scaled(6)
    msg = str(e.value)
    assert "a next try would come after the session's deadline (SPECPROBE_HUB_DEADLINE_S)" in msg, msg
    assert "HTTP 503" in msg or "503" in msg


def test_the_stop_push_and_the_lease_release_wait_out_an_outage(hub_server: HubServer, tmp_path: Path) -> None:
    store = outage_store(hub_server, "ckoutage", outage_s=30)
    run_pushes(store, tmp_path, [10], [])
    log: list[str] = []
    ck = Checkpointer(store, log=log.append)
    ck.lease.acquire()  # the lease first: the next commit is the checkpoint's
    folder, files = make_ckpt(tmp_path, 20)
    hub_server.inject("status", COMMIT, status=503, duration_s=1.5)
    pointer = ck.push(20, folder, files, tokens=2000, config_hash="cfg")
    assert pointer.step == 20 and read_pointer(store) == pointer
    hub_server.inject("status", COMMIT, status=503, duration_s=1.5)  # the release's commit
    ck.close()
    assert any(line.endswith(f"released {store.url}") for line in log), log
    assert LEASE_PATH not in hub_server.files("tester/ckoutage")


def test_a_release_the_store_keeps_refusing_says_until_when_the_lease_holds(
    hub_server: HubServer, tmp_path: Path
) -> None:
    store = outage_store(hub_server, "norelease", outage_s=0.5)
    store.create()
    log: list[str] = []
    ck = Checkpointer(store, log=log.append)
    ck.lease.acquire()
    expires = json.loads(hub_server.files("tester/norelease")[LEASE_PATH])["expires_utc"]
    hub_server.inject("status", COMMIT, status=503, times=10_000)
    ck.close()
    failed = [line for line in log if line.startswith("lease: release FAILED")]
    assert len(failed) == 1, log
    assert f"{LEASE_PATH} still names this trainer ({ck.lease.me.id}) until {expires} (in " in failed[0], failed
    assert (
        "another writer can take the store over then, or at once on this machine once this process has ended"
        in (failed[0])
    )


@pytest.mark.slow
def test_a_trainers_stop_push_waits_out_an_outage_longer_than_its_tries(
    hub_server: HubServer, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    mix = tiny_mix(tmp_path_factory)
    repo_id = "probe/outage"
    env = {
        **hub_server.env(),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "SPECPROBE_HUB_RETRIES": "2",
        "SPECPROBE_HUB_BACKOFF_S": "0.05",
        "SPECPROBE_HUB_OUTAGE_S": "120",
        "SPECPROBE_HUB_DEADLINE_S": "600",
    }
    # Commits: the lease (1st), checkpoint-2 (2nd: the outage starts there and lasts 4 s), the pointer, the release.
    outage = hub_server.inject(
        "status", rf"^/api/datasets/{repo_id}/commit/main$", method="POST", status=503, nth=2, duration_s=4
    )
    args = trainer_args(root=mix, out=tmp_path / "out", repo=f"hf://{repo_id}", steps=4, push_every=2, stop=2)
    run = run_trainer(torchrun_cmd(args, log_dir=tmp_path / "tlogs"), env=env, timeout=scaled(300))
    assert run.rc == 0 and run.run_json is not None and run.run_json["final_step"] == 2, run.text[-3000:]
    assert outage.fired > 2, outage  # longer than the two tries the push had
    assert "outages waited out for 120s, deadline 600s after the start" in run.text
    assert "the Hub looks unreachable or down" in run.text
    pointer = json.loads(hub_server.files(repo_id)["latest.json"])
    assert (pointer["step"], pointer["path_in_repo"]) == (2, "ckpt/checkpoint-2")
    assert LEASE_PATH not in hub_server.files(repo_id)  # released: the next machine need not wait for the TTL
    assert HUB_TOKEN not in run.text
