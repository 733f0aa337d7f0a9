"""What every checkpoint store is: the :class:`Store` protocol, its errors and :class:`FileInfo`, and the
helpers every backend and caller shares: :func:`open_regular` (and :func:`sha256_file` over it) and :func:`redact_url`.

Two backends implement the protocol: a local directory (trainer/store/local.py) and a Hugging Face Hub repo
(trainer/store/hub.py); trainer/store/url.py turns a URL into the right one (``open_store``). The token is
never printed: every URL that reaches a message goes through :func:`redact_url`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Mapping, Protocol, Sequence, runtime_checkable

__all__ = [
    "StoreError",
    "RepoMissing",
    "EntryMissing",
    "Conflict",
    "StoreUnavailable",
    "MetadataMissing",
    "FileInfo",
    "NotRegularFile",
    "Store",
    "file_of_bytes",
    "open_regular",
    "redact_url",
    "sha256_file",
    "repo_path_problem",
]

_CHUNK = 1 << 20


class StoreError(Exception):
    """Any store failure (bad path, I/O, corrupt metadata, hash mismatch)."""


class RepoMissing(StoreError):
    """The repo does not exist."""


class EntryMissing(StoreError):
    """A path is not part of the repo's current commit."""


class Conflict(StoreError):
    """A commit given ``expect_revision`` found the repo at another revision; nothing was committed."""


class StoreUnavailable(StoreError):
    """The store could not be reached, or failed transiently, on every try (an outage): trying again later may
    succeed, unlike any other StoreError."""


class MetadataMissing(StoreError):
    """A local repo folder holds files but not the store's metadata (``.specprobe/``): refused, never recreated."""


class NotRegularFile(OSError):
    """A path that must hold a file's bytes is something else: ``kind`` says what (a FIFO, a device, a folder)."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(f"{path} is {kind}, not a regular file")
        self.path, self.kind = path, kind


@dataclass(frozen=True)
class FileInfo:
    path: str
    size: int
    sha256: str | None  # None where the backend cannot say (a non-LFS Hub file)


@runtime_checkable
class Store(Protocol):
    """Same semantics for every backend (trainer/store/local.py, trainer/store/hub.py)."""

    url: str

    def exists(self) -> bool: ...

    def create(self) -> None:
        """Create the repo; a no-op when it exists."""

    def revision(self) -> str:
        """The id of the current commit (what ``expect_revision`` compares with)."""

    def list_files(self) -> dict[str, FileInfo]:
        """path_in_repo -> FileInfo for the current commit; raises RepoMissing."""

    def commit(
        self, add: Mapping[str, Path], delete: Sequence[str] = (), message: str = "", expect_revision: str | None = None
    ) -> str:
        """ONE atomic commit adding ``add`` (path_in_repo -> local file) and deleting ``delete`` (a path
        ending in "/" deletes that folder). Returns the new revision id. Deleting an absent path raises
        EntryMissing and commits nothing. With ``expect_revision``, the commit lands only on that revision
        (compare-and-swap) and raises Conflict otherwise."""

    def purge_objects(self, sha256s: Sequence[str]) -> None:
        """Forget the stored bytes of these contents so that the next commit of the same content stores it
        afresh instead of deduplicating onto a corrupt object (the repair after a failed verify)."""

    def read_bytes(self, path: str) -> bytes:
        """The bytes of ``path``; raises EntryMissing."""

    def download(self, path: str, dest: Path) -> Path:
        """Write ``path`` to the local FILE ``dest`` (parents created, written atomically); returns dest."""

    def sha256(self, path: str) -> str:
        """sha256 of the bytes actually stored, read back now (never from metadata)."""

    def delete_repo(self) -> None:
        """Delete the whole repo; raises RepoMissing when absent."""


_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@")
_HF_TOKEN_SHAPE = re.compile(r"hf_[A-Za-z0-9]{8,}")
_QUERY_SECRET = re.compile(r"(?i)([?&](?:token|access_token|key|secret|password)=)[^&#]*")


def redact_url(url: object) -> str:
    """``url`` as a string with credentials removed: userinfo, secret query values, HF tokens."""
    text = str(url)
    text = _USERINFO.sub(r"\1<redacted>@", text)
    text = _QUERY_SECRET.sub(r"\1<redacted>", text)
    token = os.environ.get("HF_TOKEN")
    if token and len(token) >= 4:
        text = text.replace(token, "<redacted>")
    return _HF_TOKEN_SHAPE.sub("<redacted>", text)


_PATH_MAX = 1024
_PATH_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def repo_path_problem(path: object) -> str | None:
    """Why ``path`` is not a repo-relative POSIX file path (None when it is one): the one rule for paths a
    caller commits and for paths read back from the store (a manifest entry, a pointer's folder), so no
    path read from a store can reach outside the repo."""
    if not isinstance(path, str):
        return f"must be a string, got {type(path).__name__}"
    if not path or len(path) > _PATH_MAX:
        return f"must be 1 to {_PATH_MAX} characters long"
    if path.startswith("/") or "\\" in path or _PATH_CONTROL.search(path):
        return "must be relative and '/'-separated, without a backslash or a control character"
    if any(p in ("", ".", "..") for p in path.split("/")):
        return "must not hold '.', '..' or an empty part"
    return None


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a FIFO", "a folder", ...)."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return f"of an unknown type (mode {mode:o})"


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = True) -> BinaryIO:
    """``path`` opened for reading once it is known to be a regular file; :class:`NotRegularFile` naming what
    it is otherwise. Opening a FIFO blocks until a writer comes and a character device never ends, so the
    open does not block (O_NONBLOCK) and the kind is read from the open descriptor (a check by path, then an
    open, could meet two different files). ``follow_links=False``: a symbolic link fails the open (ELOOP)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(os.fspath(path), file_kind(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    # Outside the handler: once fdopen has built its file object, the descriptor is the object's to close.
    # An interrupt landing there, closed here too, closed it twice: the second close's EBADF replaced the
    # KeyboardInterrupt, or closed a file opened since under the same number.
    return os.fdopen(fd, "rb")


def sha256_file(path: Path) -> str:
    """The sha256 of a local regular file, read in chunks (NotRegularFile for anything else)."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def file_of_bytes(name: str, data: bytes) -> Iterator[Path]:
    """A path whose file holds ``data``, for a commit (stores commit files by path), that no exit leaves
    behind: an anonymous in-memory file (memfd) reached through /proc/self/fd, which the kernel frees when the
    process ends, however it ends. A temporary folder would stay in the system's temp dir after every
    SIGKILL that lands inside a commit. Where memfd is missing (not Linux), a temporary folder it is."""
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        with tempfile.TemporaryDirectory(prefix="specprobe-") as tmp:
            path = Path(tmp) / name
            path.write_bytes(data)
            yield path
        return
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        yield Path(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
