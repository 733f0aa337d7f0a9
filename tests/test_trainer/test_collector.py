"""The `hub` collector and `python -m trainer.collector`: the store's state as one JSON document."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from trainer.ckpt.checkpointer import CHECKPOINT_FILES, Checkpointer
from trainer.collector import collect, hub_state
from trainer.store import sha256_file
from trainer.store.url import open_store

REPO_ROOT = Path(__file__).resolve().parents[2]


def checkpoint_dir(d: Path, step: int) -> dict[str, str]:
    d.mkdir(parents=True, exist_ok=True)
    for name in CHECKPOINT_FILES:
        (d / name).write_text(f"{name} {step}\n")
    return {n: sha256_file(d / n) for n in CHECKPOINT_FILES}


def cli(url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer.collector", "--repo", url],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_missing_repo_reports_exists_false_without_error(tmp_path):
    doc = collect({"repo": f"file://{tmp_path}/o/absent"}, {})
    assert doc == {
        "repo": f"file://{tmp_path}/o/absent",
        "exists": False,
        "error": None,
        "files": [],
        "sha256": {},
        "sha256_source": "local-manifest",
        "checkpoints": [],
        "has_final": False,
        "pointer": None,
        "pointer_error": None,
    }
    assert not (tmp_path / "o/absent").exists()  # collecting never creates the repo


def test_empty_repo_has_no_pointer_and_no_pointer_error(tmp_path):
    url = f"file://{tmp_path}/o/empty"
    open_store(url).create()
    doc = collect({"repo": url}, {})
    assert doc["exists"] is True and doc["files"] == [] and doc["pointer"] is None and doc["pointer_error"] is None


def test_state_after_pushes_lists_steps_numerically_final_and_pointer(tmp_path):
    url = f"file://{tmp_path}/o/run"
    store = open_store(url)
    store.create()
    ck = Checkpointer(store, log=lambda _line: None)
    for step in (10, 20, 100):
        ck.push(step, tmp_path / f"l{step}", checkpoint_dir(tmp_path / f"l{step}", step), tokens=step, config_hash="c")
    ck.push(100, tmp_path / "lf", checkpoint_dir(tmp_path / "lf", 100), tokens=100, config_hash="c", final=True)

    doc = collect({"repo": url}, {})
    assert doc["checkpoints"] == [10, 20, 100]  # numeric, not "10" < "100" < "20"
    assert doc["has_final"] is True and doc["error"] is None
    assert doc["pointer"]["step"] == 100 and doc["pointer"]["path_in_repo"] == "final"
    assert doc["pointer"]["terminal"] is True
    assert doc["files"] == sorted(store.list_files())
    assert "ckpt/checkpoint-10/model.safetensors" in doc["files"]
    assert "ckpt/checkpoint-10/optimizer.pt" not in doc["files"]  # pruned
    assert doc["sha256"]["final/config.json"] == sha256_file(tmp_path / "lf/config.json")
    assert set(doc["sha256"]) == set(doc["files"])


def test_malformed_pointer_is_reported_not_raised(tmp_path):
    url = f"file://{tmp_path}/o/bad"
    store = open_store(url)
    store.create()
    (tmp_path / "l.json").write_text("{broken")
    store.commit({"latest.json": tmp_path / "l.json"})
    doc = hub_state(store)
    assert doc["pointer"] is None and doc["files"] == ["latest.json"]
    assert "latest.json in file://" in doc["pointer_error"] and "not valid JSON" in doc["pointer_error"]


def test_a_broken_store_goes_into_error(tmp_path):
    url = f"file://{tmp_path}/o/broken"
    store = open_store(url)
    store.create()
    (tmp_path / "o/broken/.specprobe/manifest.json").write_text("garbage")
    doc = hub_state(store)
    assert doc["exists"] is True and "manifest.json" in doc["error"] and doc["files"] == []


def test_cli_prints_the_same_document_on_one_line(tmp_path):
    url = f"file://{tmp_path}/o/run"
    store = open_store(url)
    store.create()
    Checkpointer(store, log=lambda _l: None).push(
        10, tmp_path / "l", checkpoint_dir(tmp_path / "l", 10), tokens=10, config_hash="c"
    )
    proc = cli(url)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == collect({"repo": url}, {})


def test_cli_rejects_an_invalid_url_with_rc_2():
    proc = cli("not a url")
    assert proc.returncode == 2 and "invalid store URL 'not a url'" in proc.stderr and proc.stdout == ""


def test_collect_requires_a_repo_argument():
    with pytest.raises(ValueError, match="args.repo"):
        collect({}, {})


def test_the_hub_collector_is_discoverable_through_its_entry_point():
    found = [ep for ep in entry_points(group="specprobe.collectors") if ep.name == "hub"]
    assert len(found) == 1 and found[0].load() is collect


def test_hub_state_over_the_hub_backend_reports_lfs_hashes(hub_store, tmp_path):
    store = hub_store("collect-me")
    store.create()
    d = tmp_path / "l"
    files = checkpoint_dir(d, 10)
    (d / "model.safetensors").write_bytes(b"\x01" * 4096)  # LFS on the test server (>= 1 KB)
    files["model.safetensors"] = sha256_file(d / "model.safetensors")
    Checkpointer(store, log=lambda _l: None).push(10, d, files, tokens=10, config_hash="c")
    doc = hub_state(store)
    assert doc["repo"] == "hf://tester/collect-me" and doc["exists"] is True and doc["error"] is None
    assert doc["sha256_source"] == "hub-lfs" and doc["checkpoints"] == [10]
    assert doc["sha256"]["ckpt/checkpoint-10/model.safetensors"] == files["model.safetensors"]
    assert doc["sha256"]["latest.json"] is None  # small file: no LFS hash on the Hub
    assert doc["pointer"]["path_in_repo"] == "ckpt/checkpoint-10"


def test_hash_stored_bytes_sees_an_object_damaged_after_its_upload(tmp_path):
    """The listing repeats the hash recorded at commit (as the Hub's LFS metadata does at upload): a stored
    object damaged later still lists as intact. Only reading the bytes back shows it."""
    url = f"file://{tmp_path}/o/run"
    store = open_store(url)
    store.create()
    recorded = checkpoint_dir(tmp_path / "l", 10)
    Checkpointer(store, log=lambda _l: None).push(10, tmp_path / "l", recorded, tokens=10, config_hash="c")
    clean = collect({"repo": url, "hash_stored_bytes": True}, {})
    assert clean["pointer_target_sha256_stored"] == clean["pointer"]["files"] == recorded
    assert "pointer_target_sha256_stored" not in collect({"repo": url}, {})  # off by default: no download

    sha = recorded["model.safetensors"]
    (obj,) = [p for p in (tmp_path / "o").rglob(sha) if p.is_file()]
    obj.chmod(0o644)
    obj.write_bytes(b"bit rot")
    damaged = collect({"repo": url, "hash_stored_bytes": True}, {})
    assert damaged["pointer_target_sha256"] == recorded  # the listing: still as recorded
    assert damaged["pointer_target_sha256_stored"]["model.safetensors"] == hashlib.sha256(b"bit rot").hexdigest()
    assert {k: v for k, v in damaged["pointer_target_sha256_stored"].items() if k != "model.safetensors"} == {
        k: v for k, v in recorded.items() if k != "model.safetensors"
    }


def test_hash_stored_bytes_must_be_a_boolean_and_unknown_args_are_refused():
    with pytest.raises(ValueError, match="hash_stored_bytes must be true or false"):
        collect({"repo": "file:///tmp/o/x", "hash_stored_bytes": "yes"}, {})
    with pytest.raises(ValueError, match="unknown args hash_stored_byte; it takes repo, hash_stored_bytes"):
        collect({"repo": "file:///tmp/o/x", "hash_stored_byte": True}, {})
