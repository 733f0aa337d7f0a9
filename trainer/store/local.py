"""The local backend of the store (``file://``): a directory repo with atomic, compare-and-swap commits.

A local URL may end in ``?link_mb_s=R``: every commit then takes as long as uploading its bytes at R MB/s
would (the pause sits between staging and publishing, where a Hub upload's time goes). A local commit of
a tiny checkpoint takes milliseconds, a Hub push seconds to minutes; a probe that kills a session
mid-push (specs/p4_preempt.yaml) needs the push to last long enough for the kill to land inside it.

Local store layout. The visible tree mirrors the Hub repo (``<repo>/ckpt/checkpoint-10/model.safetensors`` ...),
but the truth lives under ``<repo>/.specprobe/``:

- ``manifest.json``   ``{"format", "revision", "files": {path: {"size", "sha256"}}, "log": [...]}``; the ONLY
  thing ``list_files`` reads. Replacing it (temp, fsync, ``os.replace``, fsync dir) is the last step of a
  commit, so a reader sees the old commit or the new one, never half of one.
- ``objects/<sha256>`` the file bytes, content-addressed and never rewritten in place. A commit that changes
  ``x`` writes a NEW object, so the bytes the previous commit's manifest points at are untouched until that
  manifest has been replaced: a commit killed at any point leaves the previous commit readable and intact.
- ``staging/<id>/``   where a commit copies and fsyncs its files before they become objects; a killed
  commit's leftovers are removed by the next commit.
- ``written.json``    the journal: the objects a commit is about to add, written before they enter objects/.
  Objects are collected only when the store provably wrote them (the previous manifest or the journal
  names them) and the new manifest does not name them; a file in objects/ the store never recorded stays.
- ``lock``            ``fcntl.flock`` held around a whole commit (concurrent writers serialise). A commit
  given ``expect_revision`` checks the manifest's revision under that lock and raises :class:`Conflict` when
  another commit came first: the compare-and-swap a lease (trainer/store/lease.py) is claimed with.

Visible files are hard links to their objects (a copy where the filesystem refuses links), placed after the
manifest flips; each commit also repairs the visible tree (missing links, files of deleted paths), so a kill
between the flip and the placement is healed by the next commit. Reads go through the manifest and the
objects, never the visible tree: a stray file on disk is not in the repo, and no commit deletes it (the store
removes only files that are its own objects' links or copies).

Nothing in the manifest is believed unchecked: every path must stay inside the repo and out of
``.specprobe/`` (the rule a committed path follows), every object name must be a sha256, every size an
integer; a manifest that breaks this is refused with :class:`StoreError` naming the entry. The store writes
only a metadata folder that is its own: a ``.specprobe/`` (or its ``objects/``, ``staging/``, manifest or
journal) that is a symbolic link is refused at the next write, and so is a visible folder that is a link
out of the repo. Objects are opened without following a symbolic link, and every file the store reads (the
manifest, the journal, an object) must be a regular file: a FIFO or a device there is refused, never waited on.

A repo folder that holds files but no ``.specprobe/manifest.json`` (copied with ``cp -r repo/*``, or by an
rsync that skipped dot-folders) is refused with :class:`MetadataMissing`, never taken for a missing repo: a
fresh start there would bury a run's history under a new one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from trainer.store.fields import REVISION, SHA256, FieldError, Fields, load_doc
from trainer.store.protocol import (
    Conflict,
    EntryMissing,
    FileInfo,
    MetadataMissing,
    NotRegularFile,
    RepoMissing,
    StoreError,
    file_kind,
    open_regular,
    redact_url,
    repo_path_problem,
    sha256_file,
)

__all__ = ["LocalStore", "META_DIR", "MANIFEST_FORMAT"]

MANIFEST_FORMAT = "specprobe-local-store/1"
META_DIR = ".specprobe"  # the local store's own folder inside a repo dir
_LOG_KEEP = 50  # the manifest's commit log is a short history for humans, not an audit trail
_MANIFEST_MAX_BYTES = 256 << 20  # about a million entries: far past any run's checkpoints
_CHUNK = 1 << 20


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def normalize_repo_path(path: str, *, folder: bool = False) -> str:
    """A repo-relative POSIX path; rejects absolute paths, '..', empty parts and the store's own folder."""
    raw = path
    if folder:
        path = path.rstrip("/")
    if repo_path_problem(path) is not None:
        raise StoreError(f"invalid path in repo {raw!r}: must be relative, '/'-separated, without '.' or '..'")
    if path.split("/")[0] == META_DIR:
        raise StoreError(f"invalid path in repo {raw!r}: {META_DIR}/ is reserved for the local store's metadata")
    return str(PurePosixPath(path)) + ("/" if folder else "")


# -------------------------------------------------------------------------------------- LocalStore


class LocalStore:
    """A directory repo with atomic multi-file commits (see the module docstring)."""

    def __init__(self, root: Path, repo_id: str, *, url: str | None = None, link_mb_s: float | None = None) -> None:
        self.root = Path(root)
        self.link_mb_s = link_mb_s
        self.repo_id = repo_id
        self.dir = self.root / repo_id
        self.url = url or f"file://{self.dir}"
        self._meta = self.dir / META_DIR
        self._manifest = self._meta / "manifest.json"
        self._objects = self._meta / "objects"
        self._staging = self._meta / "staging"
        self._journal = self._meta / "written.json"  # objects a commit wrote before its manifest named them

    def __repr__(self) -> str:
        return f"LocalStore({redact_url(self.url)!r})"

    # -- reading ----------------------------------------------------------------------------------
    def exists(self) -> bool:
        try:
            mode = os.stat(self._manifest).st_mode
        except FileNotFoundError:
            self._refuse_unmanaged()
            return False
        if not stat.S_ISREG(mode):
            raise StoreError(
                f"{redact_url(self.url)}: {self._manifest} is {file_kind(mode)}, not the store's manifest file; "
                "refusing to read the repo through it or to start a new one over it. Restore "
                f"{META_DIR}/manifest.json from a copy of the repo."
            )
        return True

    def _refuse_unmanaged(self) -> None:
        """MetadataMissing when the repo folder holds files (or store objects) but no manifest."""
        found = _files_under(self.dir, skip=self._meta, limit=6)
        objects = _files_under(self._objects, limit=1) if self._objects.is_dir() else []
        if not found and not objects:
            return
        what = (
            ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
            if found
            else f"{META_DIR}/objects/ without {META_DIR}/manifest.json"
        )
        raise MetadataMissing(
            f"{redact_url(self.url)}: the folder {self.dir} holds files ({what}) but no "
            f"{self._manifest.relative_to(self.dir)}: the store's metadata is missing (a copy made with "
            f"`cp -r repo/*` or an rsync that skipped dot-folders loses {META_DIR}/). Refusing to take it for a "
            "missing repo: a fresh start would bury that history. Copy the repo again with its "
            f"{META_DIR}/ folder, or move these files out of the way."
        )

    def _load(self) -> dict:
        try:
            raw = self._read_meta(self._manifest, "manifest")
        except FileNotFoundError:
            self._refuse_unmanaged()
            raise RepoMissing(f"repo {redact_url(self.url)} does not exist (no {self._manifest})") from None
        try:
            return _checked_manifest(raw, f"{self._manifest} of {redact_url(self.url)}")
        except FieldError as e:
            raise StoreError(
                f"{e}. The manifest is the store's record of what the repo holds; refusing to read or write "
                f"through it. Restore {META_DIR}/ from a copy of the repo, or mend the entry by hand."
            ) from None

    def _read_meta(self, path: Path, what: str) -> bytes:
        """The bytes of a metadata file, at most one past the manifest's size limit (load_doc refuses a longer
        one); FileNotFoundError when absent, StoreError when it is not a regular file: a FIFO there would block
        every reader, a character device never end."""
        try:
            with open_regular(path) as f:
                return f.read(_MANIFEST_MAX_BYTES + 1)
        except NotRegularFile as e:
            raise StoreError(
                f"{redact_url(self.url)}: its {what} {path} is {e.kind}, not a file the store wrote; refusing to "
                f"read the repo through it. Restore {META_DIR}/ from a copy of the repo."
            ) from None

    def list_files(self) -> dict[str, FileInfo]:
        files = self._load()["files"]
        return {p: FileInfo(p, m["size"], m["sha256"]) for p, m in sorted(files.items())}

    def revision(self) -> str:
        """The id of the current commit (what the last ``commit`` returned)."""
        return self._load().get("revision_id", "")

    def _entry(self, path: str) -> dict:
        entry = self._load()["files"].get(path)
        if entry is None:
            raise EntryMissing(f"{path} is not in {redact_url(self.url)}")
        return entry

    @contextlib.contextmanager
    def _open_object(self, path: str) -> Iterator:
        # A concurrent commit may delete an object between our manifest read and open (it was replaced);
        # the manifest read after that says what the path holds now.
        for attempt in (0, 1):
            obj = self._objects / self._entry(path)["sha256"]
            try:
                f = open_regular(obj, follow_links=False)
            except FileNotFoundError:
                if attempt:
                    raise StoreError(
                        f"{path} in {redact_url(self.url)}: its stored object {obj} is missing (the store is damaged)"
                    ) from None
                continue
            except NotRegularFile as e:
                raise StoreError(
                    f"{path} in {redact_url(self.url)}: its stored object {obj} is {e.kind}, not bytes the store "
                    "wrote (the store is damaged); refusing to read it"
                ) from None
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                raise StoreError(
                    f"{path} in {redact_url(self.url)}: its stored object {obj} is a symbolic link, not bytes the "
                    "store wrote; refusing to read through it"
                ) from None
            with f:
                yield f
            return

    def read_bytes(self, path: str) -> bytes:
        with self._open_object(path) as f:
            return f.read()

    def sha256(self, path: str) -> str:
        h = hashlib.sha256()
        with self._open_object(path) as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def download(self, path: str, dest: Path) -> Path:
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
        try:
            with self._open_object(path) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    # -- writing ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._meta.mkdir(parents=True, exist_ok=True)
        self._refuse_linked_metadata()
        with open(self._meta / "lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _refuse_linked_metadata(self) -> None:
        """StoreError when the metadata folder, or a folder in it, is a symbolic link: a commit deletes objects
        and staging leftovers there, which it may do only in a folder that is the store's own."""
        for path in (self._meta, self._objects, self._staging, self._manifest, self._journal):
            if path.is_symlink():
                raise StoreError(
                    f"{redact_url(self.url)}: {path} is a symbolic link (to {os.readlink(path)}); a commit deletes "
                    f"the objects and leftovers it wrote there, so it writes only into a {META_DIR}/ folder that "
                    "is the repo's own. Refusing to write. To move the repo to another disk, move (or link) the "
                    "whole repo folder, not its metadata."
                )

    def _refuse_linked_parents(self, paths: Iterable[str]) -> None:
        """StoreError when a folder on the way to a visible file is a symbolic link: placing the file would
        write outside the repo folder."""
        seen: set[str] = set()
        for p in paths:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                folder = "/".join(parts[:i])
                if folder in seen:
                    continue
                seen.add(folder)
                if (self.dir / folder).is_symlink():
                    raise StoreError(
                        f"{redact_url(self.url)}: {self.dir / folder} is a symbolic link (to "
                        f"{os.readlink(self.dir / folder)}); placing {p} there would write outside the repo "
                        "folder. Nothing was committed. Replace the link with a folder."
                    )

    def _write_json(self, target: Path, doc: dict) -> None:
        """Atomically replace ``target`` (in the metadata folder) with ``doc``: temp file, fsync, rename."""
        fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".tmp", dir=self._meta)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
        _fsync_dir(self._meta)

    def _publish(self, doc: dict) -> None:
        """Atomically replace the manifest: the single step that makes a commit visible."""
        self._write_json(self._manifest, doc)

    def create(self) -> None:
        self.exists()  # MetadataMissing, before the lock creates .specprobe/
        with self._locked():
            if self.exists():
                return
            self._objects.mkdir(parents=True, exist_ok=True)
            self._staging.mkdir(parents=True, exist_ok=True)
            self._publish(
                {
                    "format": MANIFEST_FORMAT,
                    "revision": 0,
                    "revision_id": _revision_id(0, {}),
                    "files": {},
                    "log": [{"revision": 0, "message": "create", "time": _now()}],
                }
            )

    def commit(
        self, add: Mapping[str, Path], delete: Sequence[str] = (), message: str = "", expect_revision: str | None = None
    ) -> str:
        adds = {normalize_repo_path(p): Path(src) for p, src in add.items()}
        deletes = [normalize_repo_path(p, folder=p.endswith("/")) for p in delete]
        if not adds and not deletes:
            raise StoreError(f"empty commit to {redact_url(self.url)}: nothing to add or delete")
        for p, src in adds.items():
            if not src.is_file():
                what = "is not a regular file" if src.exists() else "does not exist"
                raise StoreError(f"cannot commit {p} to {redact_url(self.url)}: local file {src} {what}")
        if not self.exists():
            raise RepoMissing(f"cannot commit to {redact_url(self.url)}: the repo does not exist")
        with self._locked():
            doc = self._load()
            if expect_revision is not None and doc.get("revision_id", "") != expect_revision:
                raise Conflict(
                    f"commit to {redact_url(self.url)} expected revision {expect_revision}, the repo "
                    f"is at {doc.get('revision_id', '')}: another commit came first; nothing committed"
                )
            shutil.rmtree(self._staging, ignore_errors=True)  # a killed commit's leftovers
            self._objects.mkdir(parents=True, exist_ok=True)
            files = dict(doc["files"])
            _apply_deletes(files, deletes, self.url)
            clash = _file_folder_clash({**files, **dict.fromkeys(adds)})
            if clash is not None:
                raise StoreError(f"commit to {redact_url(self.url)} would make {clash} both a file and a folder")
            self._refuse_linked_parents([*files, *adds])
            log = list(doc.get("log", []))[-(_LOG_KEEP - 1) :]
            known = set(doc["files"]) | {p for e in log for p in e.get("added", ())}
            self._refuse_blocked_places(adds, known)
            files.update(self._store_objects(adds))
            revision = doc.get("revision", 0) + 1
            rev_id = _revision_id(revision, files)
            log.append(
                {
                    "revision": revision,
                    "revision_id": rev_id,
                    "message": message,
                    "time": _now(),
                    "added": sorted(adds),
                    "deleted": sorted(deletes),
                }
            )
            self._publish(
                {"format": MANIFEST_FORMAT, "revision": revision, "revision_id": rev_id, "files": files, "log": log}
            )
            # Published. Everything below only tidies the visible tree and the object pool.
            self._sync_visible(files, known=known | set(adds))
            self._gc_objects(files, previous=doc["files"])
            shutil.rmtree(self._staging, ignore_errors=True)
            return rev_id

    def _store_objects(self, adds: Mapping[str, Path]) -> dict[str, dict]:
        """The added files as objects: each copied into staging (hashed, fsynced), their names written to the
        journal (so a commit killed from here on leaves objects the next commit knows it wrote), then moved to
        objects/<sha256>. Returns {path: {size, sha256}}."""
        stage = self._staging / uuid.uuid4().hex
        stage.mkdir(parents=True)
        entries = {p: self._stage_object(src, stage / str(i)) for i, (p, src) in enumerate(sorted(adds.items()))}
        digests = sorted({e["sha256"] for e in entries.values()})
        if digests:
            self._write_json(self._journal, {"objects": sorted(set(self._journaled()) | set(digests))})
        for i, p in enumerate(sorted(entries)):
            # Same name = same content, so replacing an existing object cannot change what any commit reads
            # (and it heals an object that rotted on disk).
            os.replace(stage / str(i), self._objects / entries[p]["sha256"])
        _fsync_dir(self._objects)
        if self.link_mb_s:
            time.sleep(sum(e["size"] for e in entries.values()) / (self.link_mb_s * 1e6))
        return entries

    def _journaled(self) -> list[str]:
        """The objects commits wrote that no manifest may name yet (a killed commit's), from the journal."""
        try:
            raw = self._read_meta(self._journal, "journal")
        except FileNotFoundError:
            return []
        where = f"{self._journal} of {redact_url(self.url)}"
        try:
            names = Fields(load_doc(raw, where, max_bytes=_MANIFEST_MAX_BYTES), where).list("objects", 10_000_000)
        except FieldError as e:
            raise StoreError(f"{e}; delete it to let the store forget which objects it wrote") from None
        if not all(isinstance(n, str) and SHA256.match(n) for n in names):
            raise StoreError(f"{where}: 'objects' must be a list of sha256 names; delete it to reset it")
        return names

    def _stage_object(self, src: Path, staged: Path) -> dict:
        """Copy ``src`` to ``staged``, hashing on the way, and fsync it; returns its {size, sha256}."""
        h, size = hashlib.sha256(), 0
        with open(src, "rb") as fin, open(staged, "wb") as fout:
            while chunk := fin.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
        return {"size": size, "sha256": h.hexdigest()}

    def purge_objects(self, sha256s: Sequence[str]) -> None:
        """Nothing to do: every commit re-copies its files into their objects (see _stage_object)."""

    def _sync_visible(self, files: dict[str, dict], known: set[str] = frozenset()) -> None:
        # First remove what is on disk but not in the commit (deleted paths, a killed commit's temps), so a
        # path that changes between file and folder has room; then place the commit's files. A file is removed
        # only when it is the store's own: a link to one of its objects, or, at a path the store wrote
        # (``known``: the previous commit's and the log's), a copy of one (the previous commit's objects are
        # still there, collected after this). Anything else is left where it is.
        own_inodes = self._own_inodes()
        for dirpath, _dirnames, filenames in os.walk(self.dir, topdown=False):
            d = Path(dirpath)
            if d == self._meta or self._meta in d.parents:
                continue
            for name in filenames:
                rel = (d / name).relative_to(self.dir).as_posix()
                if rel not in files and self._is_own_file(d / name, own_inodes, rel in known):
                    (d / name).unlink(missing_ok=True)
            if d != self.dir and not any(d.iterdir()):
                d.rmdir()
        for p, entry in files.items():
            obj, visible = self._objects / entry["sha256"], self.dir / p
            if visible.is_file() and os.path.samefile(visible, obj):
                continue
            visible.parent.mkdir(parents=True, exist_ok=True)
            tmp = visible.with_name(f".{visible.name}.specprobe-tmp")
            tmp.unlink(missing_ok=True)
            try:
                os.link(obj, tmp)
            except OSError:  # filesystems without hard links get a copy
                shutil.copyfile(obj, tmp)
            os.replace(tmp, visible)

    def _own_inodes(self) -> set[tuple[int, int]]:
        """(device, inode) of every object: a visible file that is one of them is a link the store placed."""
        return {
            (st.st_dev, st.st_ino) for st in (o.lstat() for o in self._objects.iterdir()) if stat.S_ISREG(st.st_mode)
        }

    def _refuse_blocked_places(self, adds: Iterable[str], known: set[str]) -> None:
        """StoreError, before anything is published, when a file of this commit could not be placed in the
        visible tree: a folder at its path, or a file where one of its folders must be, that the tidying before
        placement may not remove because the store did not write it. Published, the commit would then fail to
        place the file, and so would every commit after it. An empty folder, or the store's own files of a path
        that changes between file and folder, are tidied away: no blocker."""
        own: set[tuple[int, int]] = set()  # listed once, and only when something is in the way

        def owned(path: Path, rel: str) -> bool:
            if not own:
                own.update(self._own_inodes())
            return self._is_own_file(path, own, rel in known)

        for p in adds:
            parts = p.split("/")
            for i in range(1, len(parts)):
                folder = self.dir.joinpath(*parts[:i])
                if os.path.lexists(folder) and not folder.is_dir():
                    if not owned(folder, "/".join(parts[:i])):
                        raise StoreError(
                            f"cannot commit {p} to {redact_url(self.url)}: {folder} is a file the store did not "
                            f"write, where a folder of {p} must be. Nothing was committed. Move it out of the repo "
                            "folder (the store deletes only files it wrote), then try again."
                        )
            target = self.dir / p
            if target.is_dir() and not target.is_symlink():
                strays = _strays_under(target, p, owned)
                if strays:
                    shown = ", ".join(strays[:5]) + (", ..." if len(strays) > 5 else "")
                    raise StoreError(
                        f"cannot commit {p} to {redact_url(self.url)}: {target} is a folder on disk, holding files "
                        f"the store did not write ({shown}); a file cannot be placed there, so the commit would be "
                        "published and then fail, and so would every commit after it. Nothing was committed. Move "
                        f"{target} out of the repo folder (the store deletes only files it wrote), then try again."
                    )

    def _is_own_file(self, path: Path, own_inodes: set[tuple[int, int]], known_path: bool) -> bool:
        if path.name.startswith(".") and path.name.endswith(".specprobe-tmp"):
            return True  # a placement this store started and a kill interrupted
        try:
            st = path.lstat()  # a symbolic link is never the store's: it places links to objects, not symlinks
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(st.st_mode):
            return False
        if (st.st_dev, st.st_ino) in own_inodes:
            return True
        # A copy placed where the filesystem refused a hard link.
        return known_path and (self._objects / sha256_file(path)).is_file()

    def _gc_objects(self, files: dict[str, dict], previous: dict[str, dict]) -> None:
        """Delete the objects this store provably wrote that the new manifest no longer names: those the
        previous manifest named and those in the journal. Anything else in objects/ (a file the store never
        recorded) is left where it is."""
        live = {e["sha256"] for e in files.values()}
        for name in ({e["sha256"] for e in previous.values()} | set(self._journaled())) - live:
            obj = self._objects / name
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(obj.lstat().st_mode):
                    obj.unlink()
        self._journal.unlink(missing_ok=True)

    def delete_repo(self) -> None:
        if not self.dir.is_dir():
            raise RepoMissing(f"cannot delete {redact_url(self.url)}: it does not exist")
        # Rename first so a reader never sees a half-deleted repo; then remove at leisure.
        trash = self.dir.with_name(f".{self.dir.name}.deleting-{uuid.uuid4().hex[:8]}")
        os.replace(self.dir, trash)
        shutil.rmtree(trash, ignore_errors=True)


def _files_under(root: Path, *, skip: Path | None = None, limit: int) -> list[str]:
    """Up to ``limit`` files below ``root`` (relative POSIX paths, sorted per folder), not descending into ``skip``."""
    out: list[str] = []
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = sorted(n for n in dirnames if skip is None or d / n != skip)
        for name in sorted(filenames):
            out.append((d / name).relative_to(root).as_posix())
            if len(out) >= limit:
                return out
    return out


def _strays_under(folder: Path, rel: str, owned: Callable[[Path, str], bool]) -> list[str]:
    """What under ``folder`` (repo path ``rel``) the tidying before placement would leave: files that are not
    the store's own (``owned``), and links (a link to a folder is not a file it removes either). Relative to
    ``folder``, sorted per folder."""
    strays: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        d = Path(dirpath)
        strays += [(d / n).relative_to(folder).as_posix() for n in sorted(dirnames) if (d / n).is_symlink()]
        for name in sorted(filenames):
            sub = (d / name).relative_to(folder).as_posix()
            if not owned(d / name, f"{rel}/{sub}"):
                strays.append(sub)
    return strays


def _apply_deletes(files: dict[str, dict], deletes: Sequence[str], url: str) -> set[str]:
    removed: set[str] = set()
    for d in deletes:
        hits = [p for p in files if p.startswith(d)] if d.endswith("/") else ([d] if d in files else [])
        if not hits:
            raise EntryMissing(f"cannot delete {d} from {redact_url(url)}: it is not in the repo")
        for p in hits:
            files.pop(p)
            removed.add(p)
    return removed


def _file_folder_clash(paths: Mapping[str, object]) -> str | None:
    """A path that is a file and a folder at once (refused before publishing, like the Hub does)."""
    folders = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
    clash = sorted(folders & set(paths))
    return clash[0] if clash else None


def _checked_manifest(raw: bytes, where: str) -> dict:
    """The manifest with every field checked (FieldError naming the entry otherwise): its paths and object
    names reach the filesystem, so a path must stay inside the repo and out of its metadata, and an object
    name must be a sha256."""
    doc = load_doc(raw, where, max_bytes=_MANIFEST_MAX_BYTES)
    if doc.get("format") != MANIFEST_FORMAT:
        raise FieldError(f"{where} is not a {MANIFEST_FORMAT} manifest (format {doc.get('format')!r:.80})")
    f = Fields(doc, where)
    f.int("revision", default=0)
    f.str("revision_id", REVISION, default="")
    files = f.obj("files")
    for path, entry in files.doc.items():
        problem = repo_path_problem(path)
        if problem is None and path.split("/")[0] == META_DIR:
            problem = f"is inside {META_DIR}/, the store's own folder"
        if problem is not None:
            raise FieldError(f"{where}: the entry {path!r:.200} is not a path inside the repo: it {problem}")
        e = Fields(entry, where, f"files[{path!r}].")
        e.int("size")
        e.str("sha256", SHA256)
    clash = _file_folder_clash(files.doc)
    if clash is not None:
        raise FieldError(f"{where}: the entry {clash!r:.200} is both a file and a folder")
    for i, entry in enumerate(f.list("log", 10 * _LOG_KEEP, default=[])):
        e = Fields(entry, where, f"log[{i}].")
        for key in ("added", "deleted"):
            if not all(isinstance(x, str) for x in e.list(key, 1_000_000, default=[])):
                raise e.fail(key, "must be a list of paths")
    return doc


def _revision_id(revision: int, files: dict[str, dict]) -> str:
    blob = json.dumps([revision, files], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:40]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
