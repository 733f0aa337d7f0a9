"""LocalStore and store URLs: atomic commits, reads through the manifest, kills mid-commit, locking."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainer.store import (
    Conflict,
    EntryMissing,
    FileInfo,
    LocalStore,
    MetadataMissing,
    RepoMissing,
    StoreError,
    redact_url,
)
from trainer.store.url import open_store, parse_store_url

REPO_ROOT = Path(__file__).resolve().parents[2]


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    s = open_store(f"file://{tmp_path}/store/probe/ckpt-a")
    assert isinstance(s, LocalStore)
    s.create()
    return s


# ------------------------------------------------------------------------------------------ URLs


@pytest.mark.parametrize(
    "url,kind,repo_id,repo_type",
    [
        ("hf://owner/name", "hf", "owner/name", "dataset"),
        ("hf://datasets/owner/name", "hf", "owner/name", "dataset"),
        ("hf://models/owner/name", "hf", "owner/name", "model"),
        ("Cion-lab/ounce100m-ckpt", "hf", "Cion-lab/ounce100m-ckpt", "dataset"),
        ("file:///abs/root/owner/name", "file", "owner/name", "dataset"),
    ],
)
def test_url_forms_parse_to_backend_and_repo_id(url, kind, repo_id, repo_type):
    parsed = parse_store_url(url)
    assert (parsed.kind, parsed.repo_id, parsed.repo_type) == (kind, repo_id, repo_type)


def test_file_url_root_is_everything_before_owner_name(tmp_path, monkeypatch):
    assert parse_store_url("file:///abs/root/owner/name").root == Path("/abs/root")
    monkeypatch.chdir(tmp_path)
    parsed = parse_store_url("file://rel/root/owner/name")
    assert parsed.root == tmp_path / "rel" / "root"
    store = open_store("file://rel/root/owner/name")
    assert store.dir == tmp_path / "rel/root/owner/name"
    assert store.url == "file://rel/root/owner/name"


@pytest.mark.parametrize(
    "url",
    [
        "",
        "name",
        "a/b/c",
        "s3://bucket/a/b",
        "hf://only",
        "hf://spaces/a/b",
        "file://name",
        "file:///root/../a/b",
        "hf://a/..",
        "/abs/path/a/b",
    ],
)
def test_invalid_url_names_it_and_the_accepted_forms(url):
    with pytest.raises(ValueError) as e:
        parse_store_url(url)
    assert repr(url) in str(e.value)
    assert "hf://datasets/owner/name" in str(e.value) and "file:///abs/root/owner/name" in str(e.value)


def test_redact_url_hides_credentials_and_the_env_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "s3cr3t-value")
    assert redact_url("https://user:pw@host/x?token=abc&x=1") == "https://<redacted>@host/x?token=<redacted>&x=1"
    assert redact_url("hf://o/n s3cr3t-value hf_ABCDEFGHIJKLMN") == "hf://o/n <redacted> <redacted>"


def test_hf_url_opens_the_hub_backend_lazily(monkeypatch):
    hub = pytest.importorskip("trainer.store.hub")
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token_for_test")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    store = open_store("hf://models/owner/name")
    assert isinstance(store, hub.HubStore)


# --------------------------------------------------------------------------------- basic semantics


def test_create_is_idempotent_and_an_empty_repo_lists_nothing(tmp_path):
    s = open_store(f"file://{tmp_path}/o/n")
    assert not s.exists()
    s.create()
    s.create()
    assert s.exists() and s.list_files() == {}


def test_commit_adds_many_files_atomically_and_mirrors_the_hub_layout(store, tmp_path):
    a = write(tmp_path / "src/a.bin", b"A" * 1000)
    b = write(tmp_path / "src/b.json", b'{"x": 1}')
    rev = store.commit({"ckpt/checkpoint-10/a.bin": a, "ckpt/checkpoint-10/b.json": b}, message="step 10")
    assert isinstance(rev, str) and len(rev) == 40 and store.revision() == rev
    assert store.list_files() == {
        "ckpt/checkpoint-10/a.bin": FileInfo("ckpt/checkpoint-10/a.bin", 1000, sha(b"A" * 1000)),
        "ckpt/checkpoint-10/b.json": FileInfo("ckpt/checkpoint-10/b.json", 8, sha(b'{"x": 1}')),
    }
    assert store.read_bytes("ckpt/checkpoint-10/b.json") == b'{"x": 1}'
    assert (store.dir / "ckpt/checkpoint-10/a.bin").read_bytes() == b"A" * 1000
    assert store.sha256("ckpt/checkpoint-10/a.bin") == sha(b"A" * 1000)
    out = store.download("ckpt/checkpoint-10/a.bin", tmp_path / "dl/deep/a.bin")
    assert out == tmp_path / "dl/deep/a.bin" and out.read_bytes() == b"A" * 1000
    manifest = json.loads((store.dir / ".specprobe/manifest.json").read_text())
    assert manifest["revision"] == 1 and manifest["log"][-1]["message"] == "step 10"


def test_commit_is_a_snapshot_of_the_source_bytes(store, tmp_path):
    src = write(tmp_path / "f", b"before")
    store.commit({"f": src})
    src.write_bytes(b"after, changed locally")
    assert store.read_bytes("f") == b"before"


def test_overwrite_replaces_bytes_and_revision_changes(store, tmp_path):
    r1 = store.commit({"x": write(tmp_path / "1", b"one")})
    r2 = store.commit({"x": write(tmp_path / "2", b"two!")})
    assert r1 != r2
    assert store.read_bytes("x") == b"two!" and store.list_files()["x"].size == 4
    objects = sorted(p.name for p in (store.dir / ".specprobe/objects").iterdir())
    assert objects == [sha(b"two!")]  # the old object is collected once nothing points at it


def test_folder_delete_removes_every_file_under_it_and_keeps_the_rest(store, tmp_path):
    f = write(tmp_path / "f", b"data")
    store.commit({"ckpt/checkpoint-1/a": f, "ckpt/checkpoint-1/b": f, "ckpt/checkpoint-10/a": f, "latest.json": f})
    store.commit({}, delete=["ckpt/checkpoint-1/"])
    assert sorted(store.list_files()) == ["ckpt/checkpoint-10/a", "latest.json"]
    assert not (store.dir / "ckpt/checkpoint-1").exists()  # visible tree follows, empty dirs removed


def test_add_and_delete_land_in_one_commit(store, tmp_path):
    store.commit({"old": write(tmp_path / "o", b"o")})
    store.commit({"new": write(tmp_path / "n", b"n")}, delete=["old"])
    assert sorted(store.list_files()) == ["new"]
    assert json.loads((store.dir / ".specprobe/manifest.json").read_text())["revision"] == 2


def test_deleting_an_absent_path_raises_entry_missing_and_commits_nothing(store, tmp_path):
    store.commit({"keep": write(tmp_path / "k", b"k")})
    with pytest.raises(EntryMissing, match="nope/ from .*ckpt-a"):
        store.commit({"other": write(tmp_path / "x", b"x")}, delete=["nope/"])
    assert sorted(store.list_files()) == ["keep"]


@pytest.mark.parametrize("bad", ["/abs", "../up", "a/../b", "a//b", ".specprobe/manifest.json", ""])
def test_commit_rejects_paths_outside_the_repo(store, tmp_path, bad):
    with pytest.raises(StoreError, match="invalid path in repo"):
        store.commit({bad: write(tmp_path / "f", b"f")})


def test_commit_of_a_missing_local_file_names_it(store, tmp_path):
    with pytest.raises(StoreError, match=r"cannot commit a/b .*does-not-exist"):
        store.commit({"a/b": tmp_path / "does-not-exist"})


def test_stray_file_on_disk_is_not_in_the_repo(store, tmp_path):
    store.commit({"real": write(tmp_path / "r", b"r")})
    write(store.dir / "stray.bin", b"not committed")
    assert "stray.bin" not in store.list_files()
    with pytest.raises(EntryMissing, match="stray.bin is not in"):
        store.read_bytes("stray.bin")
    with pytest.raises(EntryMissing):
        store.sha256("stray.bin")
    store.commit({"real2": write(tmp_path / "r2", b"r2")})
    assert (store.dir / "stray.bin").read_bytes() == b"not committed"  # not the store's: never deleted


def test_no_commit_deletes_a_file_it_did_not_write(store, tmp_path):
    store.commit(
        {
            "ckpt/checkpoint-10/model.safetensors": write(tmp_path / "m", b"weights"),
            "latest.json": write(tmp_path / "l", b"{}"),
        }
    )
    notes = write(store.dir / "ckpt/checkpoint-10/NOTES.md", b"someone's notes")
    mine = write(store.dir / "ckpt/checkpoint-10/model.safetensors.bak", b"weights")  # same bytes, a copy by hand
    store.commit({}, delete=["ckpt/checkpoint-10/"])  # the folder goes from the repo ...
    store.commit({"latest.json": write(tmp_path / "l2", b'{"v": 2}')})
    assert notes.read_bytes() == b"someone's notes"  # ... the files the store did not write stay
    assert mine.read_bytes() == b"weights"
    assert not (store.dir / "ckpt/checkpoint-10/model.safetensors").exists()  # its own file is gone
    assert sorted(store.list_files()) == ["latest.json"]


def test_a_repo_folder_without_its_metadata_is_refused_never_recreated(store, tmp_path):
    store.commit(
        {
            "ckpt/checkpoint-10/model.safetensors": write(tmp_path / "m", b"weights"),
            "latest.json": write(tmp_path / "l", b'{"step": 10}'),
        }
    )
    copy = tmp_path / "copy/probe/ckpt-a"
    copy.mkdir(parents=True)
    for child in store.dir.iterdir():  # what `cp -r repo/* copy/` copies: no dot-folders
        if not child.name.startswith("."):
            (shutil.copytree if child.is_dir() else shutil.copy2)(child, copy / child.name)
    before = {p.relative_to(copy).as_posix(): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    s = open_store(f"file://{tmp_path}/copy/probe/ckpt-a")
    for call in (
        s.exists,
        s.create,
        s.list_files,
        lambda: s.read_bytes("latest.json"),
        lambda: s.commit({"x": write(tmp_path / "x", b"x")}),
    ):
        with pytest.raises(MetadataMissing) as e:
            call()
        assert "latest.json" in str(e.value) and ".specprobe/manifest.json" in str(e.value)
        assert "cp -r repo/*" in str(e.value)
    after = {p.relative_to(copy).as_posix(): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert after == before and not (copy / ".specprobe").exists()  # nothing created, nothing deleted


def test_commit_with_expect_revision_is_a_compare_and_swap(store, tmp_path):
    rev = store.commit({"a": write(tmp_path / "a", b"a")})
    rev2 = store.commit({"b": write(tmp_path / "b", b"b")}, expect_revision=rev)
    with pytest.raises(Conflict, match=f"expected revision {rev}, the repo is at {rev2}"):
        store.commit({"c": write(tmp_path / "c", b"c")}, expect_revision=rev)
    assert sorted(store.list_files()) == ["a", "b"] and store.revision() == rev2


def test_store_objects_without_a_manifest_are_refused(store, tmp_path):
    store.commit({"a": write(tmp_path / "a", b"a")})
    (store.dir / ".specprobe/manifest.json").unlink()
    (store.dir / "a").unlink()
    with pytest.raises(MetadataMissing, match="objects/ without .specprobe/manifest.json"):
        store.exists()


def test_missing_repo_raises_repo_missing_naming_the_url(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "tok-not-in-messages")
    s = open_store(f"file://{tmp_path}/o/absent")
    for call in (
        s.list_files,
        lambda: s.read_bytes("x"),
        lambda: s.commit({"x": write(tmp_path / "x", b"")}),
        s.delete_repo,
    ):
        with pytest.raises(RepoMissing, match=f"file://{tmp_path}/o/absent"):
            call()
    assert not (tmp_path / "o/absent").exists()  # a failed commit does not half-create the repo


def test_delete_repo_removes_it(store, tmp_path):
    store.commit({"x": write(tmp_path / "x", b"x")})
    store.delete_repo()
    assert not store.exists() and not store.dir.exists()
    with pytest.raises(RepoMissing):
        store.list_files()


def test_sha256_rereads_bytes_and_catches_silent_corruption(store, tmp_path):
    store.commit({"w.bin": write(tmp_path / "w", b"\x00" * 4096)})
    recorded = store.list_files()["w.bin"].sha256
    with open(store.dir / "w.bin", "r+b") as f:  # bit rot in place: same inode as the stored object
        f.seek(100)
        f.write(b"\x01")
    assert store.list_files()["w.bin"].sha256 == recorded  # metadata cannot see it
    assert store.sha256("w.bin") != recorded  # a re-read does


def test_corrupt_manifest_is_a_store_error_naming_it(store):
    (store.dir / ".specprobe/manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match="manifest.json .* not valid JSON"):
        store.list_files()


# --------------------------------------------------------------------------- kills and concurrency

KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from trainer import store as S
    from trainer.store.url import open_store
    url, point, src = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    def die():
        print("DYING", point, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    orig_stage, orig_publish, orig_sync = S.LocalStore._stage_object, S.LocalStore._publish, S.LocalStore._sync_visible
    staged = []
    def stage(self, s, dst):
        out = orig_stage(self, s, dst)
        staged.append(dst)
        if point == "staging" and len(staged) == 2:
            die()
        return out
    def publish(self, doc):
        if point == "before_publish" and doc.get("revision", 0) > 0:
            die()
        orig_publish(self, doc)
    def sync(self, files, **kw):
        if point == "after_publish":
            die()
        orig_sync(self, files, **kw)
    S.LocalStore._stage_object, S.LocalStore._publish, S.LocalStore._sync_visible = stage, publish, sync
    st = open_store(url)
    st.commit({"ckpt/a.bin": src, "ckpt/b.bin": src, "ckpt/c.bin": src}, delete=["old.txt"])
    print("COMMITTED", flush=True)
""")


def run_killed(url: str, point: str, src: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, url, point, str(src)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("point", ["staging", "before_publish"])
def test_commit_killed_before_publish_leaves_the_old_commit_intact(store, tmp_path, point):
    store.commit({"ckpt/a.bin": write(tmp_path / "v1", b"version one"), "old.txt": write(tmp_path / "o", b"old")})
    before = store.list_files()
    src = write(tmp_path / "v2", os.urandom(256 * 1024))

    proc = run_killed(store.url, point, src)
    assert proc.returncode == -signal.SIGKILL and f"DYING {point}" in proc.stdout, proc.stderr
    assert any((store.dir / ".specprobe/staging").iterdir())  # it really died mid-commit

    assert store.list_files() == before
    assert store.read_bytes("ckpt/a.bin") == b"version one"  # the object of the old commit is untouched
    assert store.sha256("ckpt/a.bin") == sha(b"version one")
    assert (store.dir / "ckpt/a.bin").read_bytes() == b"version one"

    store.commit({"ckpt/d.bin": write(tmp_path / "d", b"d")})  # the next commit works and cleans up
    assert sorted(store.list_files()) == ["ckpt/a.bin", "ckpt/d.bin", "old.txt"]
    assert list((store.dir / ".specprobe/staging").glob("*")) == []
    live = {i.sha256 for i in store.list_files().values()}
    assert {p.name for p in (store.dir / ".specprobe/objects").iterdir()} == live  # orphans collected


def test_commit_killed_after_publish_is_complete_and_the_visible_tree_is_repaired(store, tmp_path):
    store.commit({"ckpt/a.bin": write(tmp_path / "v1", b"version one"), "old.txt": write(tmp_path / "o", b"old")})
    data = os.urandom(64 * 1024)
    proc = run_killed(store.url, "after_publish", write(tmp_path / "v2", data))
    assert proc.returncode == -signal.SIGKILL, proc.stderr

    assert sorted(store.list_files()) == ["ckpt/a.bin", "ckpt/b.bin", "ckpt/c.bin"]
    assert store.read_bytes("ckpt/b.bin") == data and store.sha256("ckpt/a.bin") == sha(data)
    assert (store.dir / "old.txt").exists()  # visible tree lags the manifest ...
    store.commit({"z": write(tmp_path / "z", b"z")})
    assert not (store.dir / "old.txt").exists()  # ... until the next commit repairs it
    assert (store.dir / "ckpt/b.bin").read_bytes() == data


CONCURRENT_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from trainer.store.url import open_store
    url, tag, tmp = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    st = open_store(url)
    for i in range(8):
        f = tmp / f"{tag}-{i}"
        f.write_bytes(f"{tag} {i}".encode())
        st.commit({f"{tag}/{i}.txt": f}, message=f"{tag} {i}")
""")


def test_concurrent_writers_serialise_and_lose_no_commit(store, tmp_path):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_SCRIPT, store.url, tag, str(tmp_path)],
            cwd=REPO_ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("w1", "w2")
    ]
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read()
    files = store.list_files()
    assert sorted(files) == sorted(f"{t}/{i}.txt" for t in ("w1", "w2") for i in range(8))
    assert store.read_bytes("w2/7.txt") == b"w2 7"
    assert json.loads((store.dir / ".specprobe/manifest.json").read_text())["revision"] == 16


def test_a_path_cannot_become_both_file_and_folder(store, tmp_path):
    f = write(tmp_path / "f", b"f")
    store.commit({"ckpt": f})
    with pytest.raises(StoreError, match="ckpt both a file and a folder"):
        store.commit({"ckpt/checkpoint-1/a": f})
    assert sorted(store.list_files()) == ["ckpt"]
    store.commit({"ckpt/checkpoint-1/a": f}, delete=["ckpt"])  # allowed once the file goes in the same commit
    assert sorted(store.list_files()) == ["ckpt/checkpoint-1/a"]


def test_link_rate_makes_a_commit_last_as_long_as_its_upload(tmp_path: Path) -> None:
    # p4_preempt kills a leg mid-push; a local commit of a tiny checkpoint is over in milliseconds,
    # so the emulated link is what gives the kill a push to land in.
    store = open_store(f"file://{tmp_path}/root/me/repo?link_mb_s=2")
    store.create()
    payload = tmp_path / "payload.bin"
    payload.write_bytes(b"\0" * 1_000_000)
    started = time.monotonic()
    store.commit({"a/payload.bin": payload})
    assert time.monotonic() - started >= 0.5  # 1 MB at 2 MB/s
    assert store.list_files()["a/payload.bin"].size == 1_000_000
    with pytest.raises(ValueError, match="link_mb_s"):
        open_store(f"file://{tmp_path}/root/me/repo?link_mb_s=0")


# ------------------------------------------------------------------- the store's own metadata, checked


def edit_manifest(store: LocalStore, change) -> None:
    """Rewrite .specprobe/manifest.json by hand, as a person or a damaged disk would."""
    path = store.dir / ".specprobe/manifest.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("entry", ["../../../x", "ckpt/../../../../x", "/tmp/x", ".specprobe/objects/x", "a//b"])
def test_a_manifest_entry_reaching_outside_the_repo_is_refused_naming_it(store, tmp_path, entry):
    store.commit({"a.bin": write(tmp_path / "a", b"a")})
    obj = sha(b"a")
    edit_manifest(store, lambda d: d["files"].__setitem__(entry, {"size": 1, "sha256": obj}))
    for call in (store.list_files, lambda: store.commit({"b.bin": write(tmp_path / "b", b"b")})):
        with pytest.raises(StoreError) as e:
            call()
        assert f"the entry {entry!r} is not a path inside the repo" in str(e.value)
        assert "manifest.json of file://" in str(e.value)
    assert not (tmp_path / "x").exists() and not (store.dir / "b.bin").exists()


def test_an_object_name_that_is_a_path_is_refused_never_read(store, tmp_path):
    secret = write(tmp_path / "secret.txt", b"not the store's")
    store.commit({"a.bin": write(tmp_path / "a", b"a")})
    # objects/ is <tmp>/store/probe/ckpt-a/.specprobe/objects: five levels below the secret.
    edit_manifest(store, lambda d: d["files"]["a.bin"].__setitem__("sha256", "../../../../../secret.txt"))
    with pytest.raises(StoreError, match=r"field \"files\['a.bin'\].sha256\": '../../../../../secret.txt' does"):
        store.read_bytes("a.bin")
    assert secret.read_bytes() == b"not the store's"


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda d: d["files"]["a.bin"].__setitem__("size", "1"), "size\": must be an integer, got '1'"),
        (lambda d: d["files"]["a.bin"].__setitem__("size", True), 'size": must be an integer, got True'),
        (lambda d: d["files"]["a.bin"].__setitem__("size", -1), 'size": -1 is out of range'),
        (lambda d: d.__setitem__("revision", 1.5), "field 'revision': must be an integer, got 1.5"),
        (lambda d: d.__setitem__("files", []), "field 'files': must be a JSON object"),
        (lambda d: d.__setitem__("log", {"a": 1}), "field 'log': must be a list"),
        (lambda d: d["log"].append({"added": "a.bin"}), "field 'log[2].added': must be a list"),
        (lambda d: d["files"].__setitem__("a.bin/c", d["files"]["a.bin"]), "'a.bin' is both a file and a folder"),
    ],
)
def test_a_manifest_field_of_the_wrong_type_or_range_is_refused_naming_it(store, tmp_path, change, needle):
    store.commit({"a.bin": write(tmp_path / "a", b"a")})
    edit_manifest(store, change)
    with pytest.raises(StoreError) as e:
        store.list_files()
    assert needle in str(e.value) and "Restore .specprobe/ from a copy" in str(e.value)


@pytest.mark.parametrize(
    "raw", [b'{"format": "specprobe-local-store/1", "revision": NaN, "files": {}}', b"[" * 100_000]
)
def test_a_manifest_json_cannot_parse_to_nan_or_crash_the_parser(store, raw):
    (store.dir / ".specprobe/manifest.json").write_bytes(raw)
    with pytest.raises(StoreError, match="manifest.json of file://.* (is not valid JSON: NaN|is nested deeper)"):
        store.list_files()


def test_a_symlinked_objects_folder_is_refused_and_nothing_in_it_deleted(store, tmp_path):
    # The repo moved to a bigger disk: its objects went to a shared folder, linked back into .specprobe/.
    store.commit({"a.bin": write(tmp_path / "a", b"version one")})
    shared = tmp_path / "shared"
    shutil.move(store.dir / ".specprobe/objects", shared)
    (store.dir / ".specprobe/objects").symlink_to(shared)
    theirs = {write(shared / sha(b"another repo's"), b"another repo's"), write(shared / "README", b"shared")}
    with pytest.raises(StoreError, match=r"\.specprobe/objects is a symbolic link \(to .*shared\)"):
        store.commit({"a.bin": write(tmp_path / "a2", b"version two")})
    assert all(p.exists() for p in theirs) and (shared / sha(b"version one")).exists()
    assert store.read_bytes("a.bin") == b"version one"  # reading through it is still possible


def test_the_collection_deletes_only_objects_the_store_wrote(store, tmp_path):
    store.commit({"a.bin": write(tmp_path / "a", b"version one")})
    objects = store.dir / ".specprobe/objects"
    foreign = [write(objects / sha(b"put here by hand"), b"put here by hand"), write(objects / "notes.txt", b"n")]
    store.commit({"a.bin": write(tmp_path / "a2", b"version two")})
    assert not (objects / sha(b"version one")).exists()  # its own, replaced: collected
    assert all(p.read_bytes() for p in foreign)  # never recorded by the store: kept
    assert (objects / sha(b"version two")).exists()


def test_a_folder_linked_out_of_the_repo_is_never_written_through(store, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (store.dir / "ckpt").symlink_to(outside)
    with pytest.raises(StoreError, match=r"ckpt is a symbolic link .*placing ckpt/checkpoint-2/m.bin there"):
        store.commit({"ckpt/checkpoint-2/m.bin": write(tmp_path / "m", b"m")})
    assert list(outside.iterdir()) == [] and "ckpt/checkpoint-2/m.bin" not in store.list_files()


def test_a_stored_object_that_is_a_symlink_is_not_read_through(store, tmp_path):
    write(tmp_path / "secret.txt", b"not the store's")
    store.commit({"a.bin": write(tmp_path / "a", b"a")})
    obj = store.dir / ".specprobe/objects" / sha(b"a")
    obj.unlink()
    obj.symlink_to(tmp_path / "secret.txt")
    with pytest.raises(StoreError, match="its stored object .* is a symbolic link"):
        store.read_bytes("a.bin")
