"""The Hugging Face Hub backend of the store (``hf://owner/name``), over the unmodified ``huggingface_hub`` client.

Client calls used (kept small on purpose; ``tests/test_hub/test_hub_store.py`` drives every one of them against
``tests/hubserver.py``), all present from huggingface_hub 0.26 through 2.4:

- ``HfApi.repo_info``           exists(), and the head revision used as ``parent_commit``
- ``HfApi.create_repo``         create() (``exist_ok=True``, private)
- ``HfApi.list_repo_tree``      list_files() (``recursive=True``; LFS entries carry their sha256)
- ``HfApi.create_commit``       commit(): ONE commit of ``CommitOperationAdd`` / ``CommitOperationDelete``
- ``HfApi.list_repo_commits``   commit(): settling an ambiguous failure by reading the history back
- ``get_hf_file_metadata`` + ``hf_hub_url``   the recorded hash (ETag / X-Linked-Etag) and the revision to pin
- ``hf_hub_download``           read_bytes(), download(), sha256() (a fresh cache dir every time: the bytes are
  always read back from the Hub, never from a local cache)
- ``HfApi.delete_repo``, ``HfApi.whoami``
- the Hub's LFS-files endpoints (trainer/store/hub_http.py; ``HfApi.list_lfs_files`` and
  ``permanently_delete_lfs_files`` from 0.30 on)   purge_objects(): the repair of a corrupt stored object
  (without it, pushing the same bytes again deduplicates onto the bad object forever)

Version notes: 0.26 .. 0.x run on ``requests``, 1.x on ``httpx``, 2.x on ``httpx2``; transport errors of all
three are recognised; every request is bounded in time (:class:`Timeouts`, installed into whichever HTTP
client the release uses: trainer/store/hub_http.py). ``LocalEntryNotFoundError`` is a subclass of
``EntryNotFoundError`` in every release and means "the Hub could not be reached", so it is checked first.
``delete_repo(missing_ok=)`` is avoided (absent in older releases).

Failure handling. Transient failures (HTTP 408/429/500/502/503/504, connection resets, timeouts) are retried
with exponential backoff and jitter, bounded by a :class:`RetryPolicy` (429 honours ``Retry-After``; the
jitter draws from the policy's own ``random.Random``, never the global one that training state saves). In
the upload phase of a commit (preupload, LFS batch, the storage PUT, Xet), before anything is committed, a
400 (storage rejecting a cut body), 409, 422 and a 403 from storage (an expired presigned URL) are retried
too; 401, 404 and any other 4xx from the commit endpoint itself are final. An HTTP status carried in the text
of a transport error (hf_xet raises ``ConnectionError("... HTTP status client error (404 Not Found) ...")``) is
classified like the status itself. Messages keep every cause in the exception chain (the server's message
included), and a 401 names HF_TOKEN and ``hf auth login``. A commit's failure after the request may have
reached the Hub is ambiguous: every commit carries a unique ``specprobe-commit`` marker, and before pushing
again the history is read back; a commit that landed is returned, not pushed twice. A request whose answer
never comes ends at the read timeout and takes the same path. A 409 from the commit endpoint (a concurrent
commit) and a 412 (the head moved under ``parent_commit``) re-read the history and the head, and retry; a 412
on a compare-and-swap (``expect_revision``) raises ``Conflict`` instead, for the caller to re-read. Downloads
compare the bytes with the hash the Hub recorded at upload (sha256 for LFS files, the git blob id for regular
ones) and re-download on a mismatch, which catches truncated transfers; a mismatch that persists is silent
corruption: ``sha256()`` reports the hash of the bytes actually stored, reads raise ``StoreError``.

The token is ``token=`` or else ``huggingface_hub.get_token()`` (HF_TOKEN, or the token ``hf auth login``
saved). It is never logged, put in a message or a repr: messages pass through :meth:`HubStore._safe`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    get_hf_file_metadata,
    get_token,
    hf_hub_download,
    hf_hub_url,
)
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import (
    EntryNotFoundError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from trainer.store.hub_http import bound_requests, delete_lfs_objects, lfs_file_oids
from trainer.store.hub_settings import HubSettings, RetryPolicy, Timeouts
from trainer.store.protocol import Conflict, EntryMissing, FileInfo, RepoMissing, StoreError, sha256_file

__all__ = ["HubStore", "RetryPolicy", "Timeouts", "DEFAULT_ENDPOINT", "TRANSIENT_STATUS", "COMMIT_MARKER"]

log = logging.getLogger("trainer.hub")  # the name its warnings carry in the log lines (readers grep it)

DEFAULT_ENDPOINT = "https://huggingface.co"
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# 4xx answers to the upload phase of a commit that a new try can change (nothing was committed): a cut or
# rejected body (400), a presigned storage URL that expired (403, storage only), a conflict (409, 422).
UPLOAD_RETRY_STATUS = frozenset({400, 403, 409, 422})
_COMMIT_URL = re.compile(r"/api/(?:models|datasets|spaces)/[^/]+/[^/]+/commit/")
_API_URL = re.compile(r"/api/")
# How an HTTP status reads inside the text of a transport error (hf_xet's reqwest errors, httpx, requests).
_TEXT_STATUS = (
    re.compile(r"status (?:client |server )?error \((\d{3})\b"),
    re.compile(r"\b(\d{3}) (?:Client|Server) Error\b"),
    re.compile(r"\bstatus(?: code)?\s*[=:]\s*(\d{3})\b"),
)
_TEXT_URL = re.compile(r"(?:domain|url|URL):\s*(\S+)")
COMMIT_MARKER = "specprobe-commit"
# Files the Hub itself keeps in every repo: bookkeeping, not store content (a local store has no such file).
HUB_BOOKKEEPING = frozenset({".gitattributes"})
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TOKENISH = re.compile(r"hf_[A-Za-z0-9_]{8,}")
_CHUNK = 1 << 20
T = TypeVar("T")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection/timeout exception classes of whichever HTTP stack this huggingface_hub release uses."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, names in (
        ("httpx2", ("TransportError",)),
        ("httpx", ("TransportError",)),
        ("requests.exceptions", ("ConnectionError", "Timeout", "ChunkedEncodingError")),
    ):
        try:
            mod = __import__(module, fromlist=list(names))
        except ImportError:
            continue
        found.extend(getattr(mod, n) for n in names if isinstance(getattr(mod, n, None), type))
    return tuple(found)


TRANSPORT_ERRORS = _transport_errors()


class _Transient(Exception):
    """Internal: a failure worth retrying (``retry_after`` from a 429/503 answer)."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.reason, self.retry_after = reason, retry_after


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__]
    return seen


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return int(code) if isinstance(code, int) else None


def _retry_after(exc: BaseException) -> float | None:
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


def _request_url(exc: BaseException) -> str:
    """The URL of the request that failed, from the error's response (or its text); "" when unknown."""
    try:
        request = getattr(getattr(exc, "response", None), "request", None)  # httpx raises if unset
    except RuntimeError:
        request = None
    url = getattr(request, "url", None)
    if url:
        return str(url)
    m = _TEXT_URL.search(str(exc))
    return m.group(1) if m else ""


def _text_status(exc: BaseException) -> int | None:
    text = str(exc)
    for rx in _TEXT_STATUS:
        m = rx.search(text)
        if m:
            return int(m.group(1))
    return None


def _status_anywhere(exc: BaseException, code: int) -> bool:
    return any(
        _status(e) == code
        or (isinstance(e, TRANSPORT_ERRORS) and _text_status(e) == code)
        or type(e).__name__ == "XetAuthenticationError"
        and code == 401
        for e in _chain(exc)
    )


def _by_status(code: int, url: str, *, uploading: bool, retry_after: float | None) -> "_Transient | None":
    if code in TRANSIENT_STATUS:
        return _Transient(f"HTTP {code}", retry_after)
    # Upload phase: the failing request is not the commit itself, so nothing was committed. A 403 from the
    # Hub API is a permission answer; from storage it is typically an expired presigned URL.
    if (
        uploading
        and code in UPLOAD_RETRY_STATUS
        and not _COMMIT_URL.search(url)
        and not (code == 403 and _API_URL.search(url))
    ):
        return _Transient(f"HTTP {code} during the upload, before anything was committed")
    return None  # a definite answer (4xx): not transient


def _transient(exc: BaseException, *, uploading: bool = False) -> _Transient | None:
    """Whether ``exc`` (or anything it wraps, e.g. the client's "Error while uploading") is transient.
    ``uploading``: ``exc`` came out of a commit call, whose upload phase is retried on more 4xx answers."""
    for e in _chain(exc):
        code = _status(e)
        if code is not None:  # an HTTP answer (HfHubHTTPError, or the HTTP stack's own status error)
            return _by_status(code, _request_url(e), uploading=uploading, retry_after=_retry_after(e))
        if isinstance(e, LocalEntryNotFoundError):
            return _Transient("the Hub could not be reached")
        if isinstance(e, TRANSPORT_ERRORS):
            code = _text_status(e)
            if code is not None and code >= 400:
                return _by_status(code, _request_url(e), uploading=uploading, retry_after=None)
            return _Transient(f"{type(e).__name__}")
    return None


def _git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _commit_texts(message: str, marker: str) -> tuple[str, str]:
    """(summary, description) of a commit: both carry ``marker``, which the history is searched for."""
    title = ((message or "specprobe commit").splitlines() or ["specprobe commit"])[0][:180]
    summary = f"{title} [{COMMIT_MARKER} {marker}]"
    description = f"{COMMIT_MARKER}: {marker}\n{message}" if message else f"{COMMIT_MARKER}: {marker}"
    return summary, description


def _operations(add: Mapping[str, Path], delete: Sequence[str]) -> list[Any]:
    """A commit's operations, fresh objects every try: the client refuses to reuse a committed CommitOperationAdd."""
    ops: list[Any] = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(local)) for p, local in add.items()]
    ops += [CommitOperationDelete(path_in_repo=d, is_folder=d.endswith("/")) for d in delete]
    return ops


@dataclass
class _Fetched:
    path: Path
    sha256: str
    matches: bool  # the bytes match the hash the Hub recorded at upload
    expected: str | None


class HubStore:
    """A Hugging Face Hub repo as a :class:`trainer.store.protocol.Store`."""

    def __init__(
        self,
        repo_id: str,
        repo_type: str = "dataset",
        endpoint: str | None = None,
        token: str | None = None,
        *,
        private: bool = True,
        retry: RetryPolicy | None = None,
        timeouts: Timeouts | None = None,
    ):
        if repo_type not in ("dataset", "model"):
            raise ValueError(f"Hub repo type must be 'dataset' or 'model', got {repo_type!r} for {repo_id}")
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            raise ValueError(f"Hub repo id must be owner/name, got {repo_id!r}")
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        # get_token(): HF_TOKEN, else the token `hf auth login` saved (what every other Hub tool uses).
        self._token = token if token is not None else (get_token() or None)
        self.private = private
        settings = HubSettings.from_env() if retry is None or timeouts is None else None
        self.retry = retry if retry is not None else settings.retry
        self.timeouts = timeouts if timeouts is not None else settings.timeouts
        bound_requests(self.timeouts)  # a request whose answer is lost ends; the retry loop settles it
        self.url = f"hf://{repo_id}" if repo_type == "dataset" else f"hf://{repo_type}s/{repo_id}"
        self._api = HfApi(endpoint=self.endpoint, token=self._token)

    def __repr__(self) -> str:
        return f"HubStore({self.url!r}, endpoint={self.endpoint!r})"

    # ------------------------------------------------------------------------------ protocol
    def exists(self) -> bool:
        try:
            self._retrying("repo info", lambda: self._api.repo_info(self.repo_id, repo_type=self.repo_type))
        except RepoMissing:
            return False
        return True

    def create(self) -> None:
        self._retrying(
            "create repo",
            lambda: self._api.create_repo(self.repo_id, repo_type=self.repo_type, private=self.private, exist_ok=True),
        )

    def head(self) -> str:
        """The commit id at the head of main."""
        info = self._retrying("repo info", lambda: self._api.repo_info(self.repo_id, repo_type=self.repo_type))
        return str(info.sha)

    def revision(self) -> str:
        return self.head()

    def list_files(self) -> dict[str, FileInfo]:
        def listing() -> list[Any]:
            return list(self._api.list_repo_tree(self.repo_id, repo_type=self.repo_type, recursive=True))

        try:
            entries = self._retrying("list files", listing)
        except _RevisionMissing:
            return {}  # a repo without any commit has no files
        out: dict[str, FileInfo] = {}
        for e in entries:
            if not isinstance(e, RepoFile) or e.path in HUB_BOOKKEEPING:
                continue
            lfs = e.lfs
            sha = getattr(lfs, "sha256", None) or (lfs.get("sha256") if isinstance(lfs, dict) else None)
            out[e.path] = FileInfo(path=e.path, size=int(e.size), sha256=sha)
        return out

    def commit(
        self, add: Mapping[str, Path], delete: Sequence[str] = (), message: str = "", expect_revision: str | None = None
    ) -> str:
        add = {str(p): Path(local) for p, local in add.items()}
        for p, local in add.items():
            if not local.is_file():
                raise StoreError(self._safe(f"{self.url}: cannot commit {p}: local file {local} does not exist"))
        if not add and not delete:
            raise StoreError(f"{self.url}: a commit needs at least one file to add or delete")
        marker = uuid.uuid4().hex[:16]
        summary, description = _commit_texts(message, marker)
        tries = 0

        def one_try() -> str:
            nonlocal tries
            tries += 1
            parent = expect_revision if expect_revision is not None else self.head()
            try:
                info = self._api.create_commit(
                    self.repo_id,
                    _operations(add, delete),
                    commit_message=summary,
                    commit_description=description,
                    repo_type=self.repo_type,
                    parent_commit=parent,
                )
            except LocalEntryNotFoundError:
                raise  # the Hub could not be reached: retried (it is an EntryNotFoundError too)
            except EntryNotFoundError as e:
                raise EntryMissing(
                    self._safe(
                        f"{self.url}: cannot delete a path that is not in the repo "
                        f"({', '.join(delete)}): {self._describe(e)}"
                    )
                ) from e
            except Exception as e:
                if expect_revision is None or _status(e) != 412:
                    raise  # judged by the retry loop
                # Compare-and-swap: a commit of ours whose answer was lost is found in the history; anything
                # else that moved the head is someone else's, and the caller decides.
                found = self._landed(marker, e) if tries > 1 else None
                if found is not None:
                    return found
                raise Conflict(
                    self._safe(
                        f"{self.url}: commit expected revision {expect_revision}, "
                        f"the head moved: {self._describe(e)}; nothing committed"
                    )
                ) from e
            return str(getattr(info, "oid", None) or str(info.commit_url).rstrip("/").rsplit("/", 1)[-1])

        return self._retrying("commit", one_try, settle=partial(self._landed, marker), commit=True)

    def read_bytes(self, path: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="specprobe-hub-") as tmp:
            got = self._fetch(path, Path(tmp))
            self._require_match(path, got)
            return got.path.read_bytes()

    def download(self, path: str, dest: Path) -> Path:
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        # The temp dir sits next to dest so the final rename is atomic (same filesystem).
        tmp = Path(tempfile.mkdtemp(prefix=".hub-download-", dir=dest.parent))
        try:
            got = self._fetch(path, tmp)
            self._require_match(path, got)
            os.replace(got.path, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def sha256(self, path: str) -> str:
        with tempfile.TemporaryDirectory(prefix="specprobe-hub-") as tmp:
            got = self._fetch(path, Path(tmp))
            if not got.matches:
                log.warning(
                    "hub: %s: %s reads back as sha256 %s, not what the Hub recorded (%s)",
                    self.url,
                    path,
                    got.sha256,
                    got.expected,
                )
            return got.sha256

    def delete_repo(self) -> None:
        tries = 0

        def one_try() -> None:
            nonlocal tries
            tries += 1
            try:
                self._api.delete_repo(self.repo_id, repo_type=self.repo_type)
            except RepositoryNotFoundError:
                if tries == 1:
                    raise
                # An earlier try deleted it; only its answer was lost.

        self._retrying("delete", one_try)

    def purge_objects(self, sha256s: Sequence[str]) -> None:
        """Permanently delete the LFS objects with these sha256 ids, so that the next upload of that content
        really uploads instead of deduplicating onto a corrupt object (the Hub's LFS-files endpoints, called on
        every client release: trainer/store/hub_http.py). History is not rewritten: commits that referenced the
        object keep a dangling (already corrupt) file. Non-LFS files need no purge: a commit carries their
        bytes, and one that adds a path deleted before sends them again."""
        wanted = set(sha256s)
        if not wanted:
            return
        where = (self.endpoint, self.repo_type, self.repo_id, self._token)
        try:
            listed = self._retrying("list LFS files", lambda: lfs_file_oids(*where))
            found = sorted(wanted.intersection(listed))
            if found:
                self._retrying("purge LFS objects", lambda: delete_lfs_objects(*where, found))
        except StoreError as e:  # the re-upload may still dedup onto the bad object: verify will say so
            log.warning("hub: %s: could not purge %s: %s", self.url, sorted(wanted), e)

    def whoami(self) -> str:
        """The user name the token belongs to (raises StoreError when the Hub rejects the token)."""
        info = self._retrying("whoami", lambda: self._api.whoami())
        return str(info.get("name"))

    # ------------------------------------------------------------------------------ internals
    def _retrying(
        self,
        what: str,
        fn: Callable[[], T],
        *,
        settle: Callable[[BaseException], T | None] | None = None,
        commit: bool = False,
    ) -> T:
        """Run ``fn`` (one try of ``what``) until it returns. Transient failures are retried with the policy's
        backoff; the rest raise the store errors they are (:meth:`_judge`; a StoreError from ``fn`` as is).
        ``settle`` answers a failure that may have been applied anyway, its answer lost: the result if it
        was, None if not. It is asked before every retry, before giving up, and before reporting a failure
        that is not an answer from the Hub. ``commit``: ``fn`` commits (see :meth:`_judge`)."""
        last: BaseException | None = None
        for attempt in range(1, self.retry.attempts + 1):
            if last is not None and settle is not None and (done := settle(last)) is not None:
                return done
            try:
                return fn()
            except StoreError:
                raise  # the operation's own verdict
            except Exception as e:  # any other failure is judged: retried, or raised as the store error it is
                last, retry = e, self._judge(what, e, commit=commit)
            if retry is None:
                # Final. One that is not an answer from the Hub (the client failing on the reply) may have been
                # applied before the client failed: look before reporting it.
                if settle is not None and _status(last) is None and (done := settle(last)) is not None:
                    return done
                raise StoreError(self._safe(f"{self.url}: {what} failed: {self._describe(last)}")) from last
            if attempt < self.retry.attempts:
                self._backoff(what, attempt, retry)
        assert last is not None
        if settle is not None and (done := settle(last)) is not None:
            return done
        raise StoreError(
            self._safe(f"{self.url}: {what} failed after {self.retry.attempts} tries: {self._describe(last)}")
        ) from last

    def _judge(self, what: str, e: Exception, *, commit: bool = False) -> _Transient | None:
        """The retry a failure deserves (None: it is final); a definite answer with a store error of its own
        raises that. ``commit``: a commit's upload phase retries more 4xx (see the module docstring), and its
        409 / 412 (a concurrent commit; the head moved under ``parent_commit``: another writer, or our own earlier
        try) re-reads the history and the head, then tries again."""
        if isinstance(e, RepositoryNotFoundError):
            raise RepoMissing(self._missing_message()) from e
        if isinstance(e, LocalEntryNotFoundError):  # checked before its base class EntryNotFoundError
            return _Transient("the Hub could not be reached")
        if isinstance(e, EntryNotFoundError):
            raise EntryMissing(self._safe(f"{self.url}: {what}: no such file in the repo")) from e
        if isinstance(e, RevisionNotFoundError) and not commit:  # main does not exist yet: a repo without commits
            raise _RevisionMissing(self._safe(f"{self.url}: {what}: {self._describe(e)}")) from e
        if _status_anywhere(e, 401):
            raise StoreError(self._auth_message(what, e)) from e
        if commit and _status(e) in (409, 412):
            # The commit endpoint's conflicts (the head moved, a concurrent commit): before the next try the
            # history is read back (settle) and the head re-read, so a try that landed is not pushed twice.
            return _Transient(f"HTTP {_status(e)} conflict")
        return _transient(e, uploading=commit)

    def _backoff(self, what: str, attempt: int, t: _Transient) -> None:
        wait = self.retry.delay(attempt, t.retry_after)
        log.warning(
            "hub: %s: %s try %d/%d failed (%s); retrying in %.2fs",
            self.url,
            what,
            attempt,
            self.retry.attempts,
            self._safe(t.reason),
            wait,
        )
        self.retry.sleep(wait)

    def _landed(self, marker: str, failure: BaseException) -> str | None:
        """The commit carrying ``marker``, if it landed although the answer to it was lost (``failure``)."""
        found = self._find_commit(marker)
        if found is not None:
            log.warning(
                "hub: %s: commit %s landed although its answer was lost (%s); not pushing again",
                self.url,
                found,
                self._describe(failure),
            )
        return found

    def _find_commit(self, marker: str) -> str | None:
        """The id of the commit carrying ``marker`` on main, if it landed."""
        commits = self._retrying(
            "read back the history", lambda: self._api.list_repo_commits(self.repo_id, repo_type=self.repo_type)
        )
        for c in commits:
            if marker in (c.title or "") or marker in (c.message or ""):
                return str(c.commit_id)
        return None

    def _fetch(self, path: str, workdir: Path) -> _Fetched:
        """Download ``path`` afresh and hash it, re-downloading while the bytes differ from the recorded hash."""
        url = hf_hub_url(self.repo_id, path, repo_type=self.repo_type, endpoint=self.endpoint)
        got: _Fetched | None = None
        for check in range(1, max(1, self.retry.verify_attempts) + 1):
            meta = self._retrying(f"metadata of {path}", lambda: get_hf_file_metadata(url, token=self._token))
            # A fresh cache dir per try: a cached copy would hide what the Hub actually holds now.
            cache = workdir / f"try-{check}"
            revision = meta.commit_hash
            local = Path(
                self._retrying(f"download of {path}", lambda c=cache, r=revision: self._download_once(path, r, c))
            )
            got = self._verify(local.resolve(), meta)
            if got.matches:
                return got
            if check < self.retry.verify_attempts:
                self._backoff(
                    f"download of {path} (bytes do not match the recorded hash {got.expected})",
                    check,
                    _Transient("hash mismatch"),
                )
        assert got is not None
        return got

    def _download_once(self, path: str, revision: str | None, cache: Path) -> str:
        try:
            return hf_hub_download(
                self.repo_id,
                path,
                repo_type=self.repo_type,
                revision=revision,
                cache_dir=str(cache),
                token=self._token,
                endpoint=self.endpoint,
            )
        except LocalEntryNotFoundError:
            raise
        except EntryNotFoundError as e:
            raise EntryMissing(self._safe(f"{self.url}: no file {path} in the repo")) from e
        except OSError as e:
            # The client's own size check ("Consistency check failed"): a cut transfer, worth another try.
            if "Consistency check failed" in str(e):
                raise ConnectionError(f"download of {path} cut short") from e
            raise

    @staticmethod
    def _verify(local: Path, meta: Any) -> _Fetched:
        sha = sha256_file(local)
        etag = (meta.etag or "").strip('"').lower()
        size_ok = meta.size is None or local.stat().st_size == int(meta.size)
        if _HEX64.match(etag):
            return _Fetched(local, sha, size_ok and sha == etag, etag)
        if _HEX40.match(etag):
            return _Fetched(local, sha, size_ok and _git_blob_sha1(local) == etag, etag)
        return _Fetched(local, sha, size_ok, etag or None)  # an ETag of another form: only the size can tell

    def _require_match(self, path: str, got: _Fetched) -> None:
        if not got.matches:
            raise StoreError(
                f"{self.url}: {path} reads back as sha256 {got.sha256}, not the hash the Hub recorded "
                f"at upload ({got.expected}) after {self.retry.verify_attempts} downloads: the stored "
                "bytes are corrupt"
            )

    def _missing_message(self) -> str:
        who = (
            "the token cannot see it"
            if self._token
            else "it is private and no token was found: set HF_TOKEN or run `hf auth login`"
        )
        return f"Hub {self.repo_type} repo {self.repo_id} does not exist at {self.endpoint} (or {who})"

    def _describe(self, e: BaseException) -> str:
        """Every cause in the chain, outermost first, so the server's own words survive the client's
        wrappers ("Error while uploading ..." <- "400 Client Error ..." <- the server's message)."""
        parts: list[str] = []
        for x in _chain(e)[:5]:
            first = (str(x).strip().splitlines() or [""])[0]
            text = f"{type(x).__name__}: {first}" if first else type(x).__name__
            server = (getattr(x, "server_message", None) or "").strip()
            if server and server.splitlines()[0] not in text:
                text += f" (server says: {server.splitlines()[0]})"
            if not any(text in p or first and first in p for p in parts):
                parts.append(text)
        return self._safe(" <- ".join(parts)[:2000])

    def _auth_message(self, what: str, e: BaseException) -> str:
        if self._token:
            hint = (
                f"the token in use (HF_TOKEN, or the one `hf auth login` saved) is invalid, expired or has no "
                f"access to {self.repo_id}: set HF_TOKEN to a valid token with write access, or run "
                "`hf auth login`"
            )
        else:
            hint = "no token was found: set HF_TOKEN or run `hf auth login`"
        return self._safe(
            f"{self.url}: {what} failed: the Hub rejected the credentials (HTTP 401): {hint}. "
            f"Cause: {self._describe(e)}"
        )

    def _safe(self, text: str) -> str:
        """``text`` with the token (and anything shaped like a Hub token) blanked out."""
        if self._token:
            text = text.replace(self._token, "<redacted>")
        return _TOKENISH.sub("<redacted>", text)


class _RevisionMissing(StoreError):
    """Internal: main does not exist yet (a repo without commits)."""
