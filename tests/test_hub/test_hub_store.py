"""Conformance: every HubStore operation (so every huggingface_hub call it makes) through the real client over
HTTP against tests/hubserver.py, on the regular path (small files, Xet left enabled) and the LFS path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from blobs import sha, write
from hubserver import HUB_TOKEN, HubServer
from trainer_helpers import IDENTITY

from trainer.store import EntryMissing, FileInfo, RepoMissing, StoreError
from trainer.store.hub import COMMIT_MARKER, HubStore, RetryPolicy, Timeouts
from trainer.store.url import open_store

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_regular_path_with_xet_enabled(
    hub_server: HubServer, hub_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small non-LFS files never touch Xet, so the client works as shipped (hf_xet installed, Xet on).
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", False, raising=False)
    store = hub_store("regular")
    assert store.exists() is False
    store.create()
    store.create()  # idempotent
    assert store.exists() is True
    a, b = b'{"step": 10}', b"tiny config"
    rev = store.commit(
        {
            "ckpt/checkpoint-10/trainer_state.json": write(tmp_path, "a", a),
            "ckpt/checkpoint-10/config.json": write(tmp_path, "b", b),
        },
        message="step 10",
    )
    assert rev == hub_server.repo("tester/regular").head.oid
    assert store.list_files() == {
        "ckpt/checkpoint-10/trainer_state.json": FileInfo("ckpt/checkpoint-10/trainer_state.json", len(a), None),
        "ckpt/checkpoint-10/config.json": FileInfo("ckpt/checkpoint-10/config.json", len(b), None),
    }
    assert store.read_bytes("ckpt/checkpoint-10/config.json") == b
    assert store.sha256("ckpt/checkpoint-10/trainer_state.json") == sha(a)
    assert not any("/__lfs__/" in r["path"] or "xet" in r["path"] for r in hub_server.log)


def test_lfs_path_one_commit_per_checkpoint_and_every_operation(
    hub_server: HubServer, hub_store, tmp_path: Path
) -> None:
    store = hub_store("lfs")
    store.create()
    before = hub_server.commit_count("tester/lfs")
    weights, optim, cfg = os.urandom(4096), os.urandom(3000), b'{"hidden": 8}'
    files = {
        "ckpt/checkpoint-10/model.safetensors": write(tmp_path, "m", weights),
        "ckpt/checkpoint-10/optimizer.pt": write(tmp_path, "o", optim),
        "ckpt/checkpoint-10/config.json": write(tmp_path, "c", cfg),
    }
    rev = store.commit(files, message="checkpoint step 10")
    assert hub_server.commit_count("tester/lfs") == before + 1  # the whole checkpoint in ONE commit
    head = hub_server.repo("tester/lfs").head
    assert head.oid == rev and COMMIT_MARKER in head.title
    assert len(hub_server.requests("PUT", "^/__lfs__/upload/")) == 2  # both big files went through LFS
    listing = store.list_files()
    assert listing["ckpt/checkpoint-10/model.safetensors"] == FileInfo(
        "ckpt/checkpoint-10/model.safetensors", 4096, sha(weights)
    )
    assert listing["ckpt/checkpoint-10/config.json"].sha256 is None  # a regular file has no LFS hash
    assert ".gitattributes" not in listing  # Hub bookkeeping is not store content
    assert store.sha256("ckpt/checkpoint-10/optimizer.pt") == sha(optim)
    out = store.download("ckpt/checkpoint-10/model.safetensors", tmp_path / "dl" / "w" / "model.safetensors")
    assert out.read_bytes() == weights and sorted(os.listdir(out.parent)) == ["model.safetensors"]
    # Move the pointer and prune the optimizer state with a folder delete, in one commit.
    ptr = write(tmp_path, "latest.json", b'{"step": 10}')
    store.commit({"latest.json": ptr}, delete=["ckpt/checkpoint-10/optimizer.pt"], message="pointer")
    assert set(store.list_files()) == {
        "ckpt/checkpoint-10/model.safetensors",
        "ckpt/checkpoint-10/config.json",
        "latest.json",
    }
    store.commit({}, delete=["ckpt/"], message="drop all checkpoints")
    assert set(store.list_files()) == {"latest.json"}
    assert store.whoami() == hub_server.user
    store.delete_repo()
    assert store.exists() is False
    with pytest.raises(RepoMissing):
        store.delete_repo()


def test_missing_repo_and_missing_entries(hub_server: HubServer, hub_store, tmp_path: Path) -> None:
    store = hub_store("absent")
    for op in (
        store.list_files,
        lambda: store.read_bytes("x"),
        lambda: store.sha256("x"),
        lambda: store.commit({"x": write(tmp_path, "x", b"1")}),
    ):
        with pytest.raises(RepoMissing, match="tester/absent"):
            op()
    store.create()
    with pytest.raises(EntryMissing):
        store.read_bytes("nope.json")
    with pytest.raises(EntryMissing):
        store.download("nope.json", tmp_path / "n")
    before = hub_server.commit_count("tester/absent")
    with pytest.raises(EntryMissing):
        store.commit({"y": write(tmp_path, "y", b"2")}, delete=["not/here.bin"])
    assert hub_server.commit_count("tester/absent") == before  # nothing committed
    with pytest.raises(StoreError, match="does not exist"):
        store.commit({"z": tmp_path / "no-such-local-file"})


def test_open_store_builds_a_hub_store_from_the_environment(
    hub_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    for url, repo_type in (
        ("hf://tester/env", "dataset"),
        ("tester/env", "dataset"),
        ("hf://models/tester/envm", "model"),
    ):
        store = open_store(url)
        assert isinstance(store, HubStore) and (store.repo_type, store.endpoint) == (repo_type, hub_server.url)
    store = open_store("hf://tester/env")
    store.create()
    assert store.exists() and store.url == "hf://tester/env"
    assert "tester/env" in repr(store) and HUB_TOKEN not in repr(store)


def test_a_subprocess_reaches_the_fixture_server_through_its_env(hub_server: HubServer, tmp_path: Path) -> None:
    # The shape the trainer integration tests use: the server in pytest, the client in a child process.
    code = (
        "import sys, pathlib; from trainer.store.url import open_store\n"
        "s = open_store('hf://tester/child'); s.create()\n"
        "p = pathlib.Path(sys.argv[1]); p.write_bytes(b'z' * 5000)\n"
        "s.commit({'ckpt/checkpoint-1/model.safetensors': p}, message='child')\n"
        "print(s.sha256('ckpt/checkpoint-1/model.safetensors'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(hub_server.env(), PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "w")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == sha(b"z" * 5000)
    assert hub_server.files("tester/child")["ckpt/checkpoint-1/model.safetensors"] == b"z" * 5000
    assert HUB_TOKEN not in done.stdout + done.stderr


def test_retry_policy_backoff_is_exponential_bounded_and_honours_retry_after() -> None:
    p = RetryPolicy(base_s=1.0, max_s=8.0, jitter=0.25, max_retry_after_s=60)
    delays = [p.delay(n) for n in range(1, 7)]
    for n, d in enumerate(delays, start=1):
        cap = min(8.0, 2 ** (n - 1))
        assert 0.75 * cap <= d <= cap
    assert p.delay(1, retry_after=20) == 20 and p.delay(1, retry_after=999) == 60
    env = RetryPolicy.from_env({"SPECPROBE_HUB_RETRIES": "3", "SPECPROBE_HUB_BACKOFF_S": "0.05"})
    assert (env.attempts, env.base_s, env.max_s) == (3, 0.05, 1.6)


def test_checkpointer_push_and_resume_scan_over_the_hub(hub_server: HubServer, hub_store, tmp_path: Path) -> None:
    from trainer.ckpt.checkpointer import CHECKPOINT_FILES, Checkpointer, seal_trainer_state
    from trainer.ckpt.scan import ResumeScan, fetch
    from trainer.collector import hub_state

    store = hub_store("resume")
    lines: list[str] = []
    ck = Checkpointer(store, log=lines.append)
    # A missing repo (RepositoryNotFound through the client) takes the fresh-start branch and creates it.
    assert ResumeScan(ck).decide(identity=IDENTITY, horizon_step=20) is None
    assert store.exists() and any("repo missing, created" in line for line in lines)
    for step in (10, 20):
        files = {
            n: sha(write(tmp_path / f"s{step}", n, f"{n}@{step}".encode() * 400).read_bytes())
            for n in CHECKPOINT_FILES
            if n != "trainer_state.json"
        }
        state = seal_trainer_state({"step": step, "tokens_consumed": step * 64, "config_hash": IDENTITY.hash}, files)
        files["trainer_state.json"] = sha(
            write(tmp_path / f"s{step}", "trainer_state.json", json.dumps(state).encode()).read_bytes()
        )
        ck.push(step, tmp_path / f"s{step}", files, tokens=step * 64, config_hash=IDENTITY.hash)
    # Cold resume: a fresh Checkpointer, nothing local, everything from the Hub.
    again = Checkpointer(hub_store("resume"), log=lines.append)
    pointer = ResumeScan(again).decide(identity=IDENTITY, horizon_step=30)
    assert pointer is not None and (pointer.step, pointer.path_in_repo) == (20, "ckpt/checkpoint-20")
    out = fetch(again.store, pointer, tmp_path / "cold")
    assert (out / "model.safetensors").read_bytes() == b"model.safetensors@20" * 400
    state = hub_state(store)
    assert state["exists"] and state["checkpoints"] == [10, 20] and state["pointer"]["step"] == 20
    assert "ckpt/checkpoint-10/optimizer.pt" not in state["files"]  # pruned


def test_the_hub_knobs_are_read_from_their_variables_and_said_in_one_line() -> None:
    from trainer.store.hub_settings import HubSettings, process_age_s

    default = HubSettings.from_env({})
    assert (default.retry.attempts, default.retry.base_s, default.retry.max_s) == (6, 1.0, 30.0)
    assert default.timeouts == Timeouts(30.0, 300.0, 128.0, 30.0)
    assert (default.retry.max_retry_after_s, default.retry.outage_s, default.retry.deadline) == (300.0, 900.0, None)
    s = HubSettings.from_env(
        {
            "SPECPROBE_HUB_RETRIES": "3",
            "SPECPROBE_HUB_BACKOFF_S": "0.5",
            "SPECPROBE_HUB_CONNECT_TIMEOUT_S": "7",
            "SPECPROBE_HUB_READ_TIMEOUT_S": "45.5",
            "SPECPROBE_HUB_MIN_RATE_KB_S": "64",
            "SPECPROBE_HUB_PROGRESS_S": "10",
            "SPECPROBE_HUB_MAX_WAIT_S": "120",
            "SPECPROBE_HUB_OUTAGE_S": "600",
            "SPECPROBE_HUB_DEADLINE_S": "3600",
        }
    )
    assert (s.retry.attempts, s.retry.base_s, s.retry.max_s, s.timeouts) == (
        3,
        0.5,
        16.0,
        Timeouts(7.0, 45.5, 64.0, 10.0),
    )
    assert (s.retry.max_retry_after_s, s.retry.outage_s) == (120.0, 600.0)
    # The deadline counts from the process's start, on the policy's clock.
    left = s.retry.deadline - s.retry.clock()
    assert 3600 - process_age_s() - 5 < left <= 3600 - process_age_s() + 1
    assert s.line() == (
        "hub client: 3 tries, backoff 0.5s doubling up to 16s, timeouts connect 7s read 45.5s, transfers at least "
        "64 KB/s (progress every 10s), waits at most 120s, outages waited out for 600s, deadline 3600s after the "
        "start (SPECPROBE_HUB_RETRIES, SPECPROBE_HUB_BACKOFF_S, SPECPROBE_HUB_CONNECT_TIMEOUT_S, "
        "SPECPROBE_HUB_READ_TIMEOUT_S, SPECPROBE_HUB_MIN_RATE_KB_S, SPECPROBE_HUB_PROGRESS_S, SPECPROBE_HUB_MAX_WAIT_S, "
        "SPECPROBE_HUB_OUTAGE_S, SPECPROBE_HUB_DEADLINE_S)"
    )
    # An outage longer than the ranks' 60-minute collective timeout is cut to 45 minutes.
    assert HubSettings.from_env({"SPECPROBE_HUB_OUTAGE_S": "86400"}).retry.outage_s == 2700.0


# What each knob takes, and values out of its range.
SECONDS = "a number of seconds > 0 and at most 86400"
SECONDS_OR_NONE = "a number of seconds >= 0 and at most 86400"
OUT_OF_RANGE = {
    "SPECPROBE_HUB_RETRIES": ("a whole number of tries from 1 to 100", "0", "three"),
    "SPECPROBE_HUB_BACKOFF_S": (SECONDS_OR_NONE, "-1"),
    "SPECPROBE_HUB_CONNECT_TIMEOUT_S": (SECONDS, "0"),
    "SPECPROBE_HUB_READ_TIMEOUT_S": (SECONDS, "inf", "nan", "1e20"),
    "SPECPROBE_HUB_MIN_RATE_KB_S": ("a rate in KB/s from 0.001 to 10000000", "0"),
    "SPECPROBE_HUB_PROGRESS_S": (SECONDS, "-5"),
    "SPECPROBE_HUB_MAX_WAIT_S": (SECONDS_OR_NONE, "2e5"),
    "SPECPROBE_HUB_OUTAGE_S": (SECONDS_OR_NONE, "forever"),
    "SPECPROBE_HUB_DEADLINE_S": (SECONDS, "0"),
}


@pytest.mark.parametrize(
    "var, value, says", [(var, value, says) for var, (says, *values) in OUT_OF_RANGE.items() for value in values]
)
def test_a_hub_knob_out_of_range_is_refused_naming_its_variable(var: str, value: str, says: str) -> None:
    from trainer.store.hub_settings import HubSettings

    with pytest.raises(ValueError) as e:
        HubSettings.from_env({var: value})
    assert str(e.value) == f"{var}={value!r}: must be {says}"
