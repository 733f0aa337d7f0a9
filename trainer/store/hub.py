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

Failure handling (the classification: trainer/store/hub_errors.py). Transient failures (HTTP 408/429/5xx,
connection resets, timeouts) are retried with exponential backoff and jitter, bounded by a :class:`RetryPolicy`
(a ``Retry-After`` is honoured, cut to ``SPECPROBE_HUB_MAX_WAIT_S``; the jitter draws from the policy's own
``random.Random``, never the global one that training state saves). When every try failed transiently (the Hub
down or unreachable), the operation keeps trying at the longest backoff until ``SPECPROBE_HUB_OUTAGE_S`` after its
first try, and never waits past ``SPECPROBE_HUB_DEADLINE_S``; then it raises :class:`StoreUnavailable`. Messages
keep every cause in the exception chain (the server's message included); a 401 names HF_TOKEN and ``hf auth
login``; a gated repo, one the token cannot see and a missing one are told apart, quoting the Hub; a connection
error names the proxy it went through. A commit's failure after the request may have reached the Hub is
ambiguous: every commit carries a unique ``specprobe-commit`` marker, and before pushing again the history is read
back; a commit that landed is returned, not pushed twice. A request whose answer never comes ends at the read
timeout and takes the same path. A 409 from the commit endpoint (a concurrent commit) and a 412 (the head moved
under ``parent_commit``) re-read the history and the head, and retry; a 412 on a compare-and-swap
(``expect_revision``) raises ``Conflict`` instead, for the caller to re-read. Downloads compare the bytes with the
hash the Hub recorded at upload (sha256 for LFS files, the git blob id for regular ones) and re-download on a
mismatch, which catches truncated transfers; a mismatch that persists is silent corruption: ``sha256()`` reports
the hash of the bytes actually stored, reads raise ``StoreError``.

Xet. huggingface_hub 1.x/2.x move LFS-sized files through Xet storage when ``hf_xet`` is installed, with no way
back when Xet fails (its token endpoint answering 404 or 503, hf_xet's own transfer failing). A Xet failure turns
Xet off for the rest of the process, says so, and tries again over plain HTTP (what ``HF_HUB_DISABLE_XET=1`` does
from the start).

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

from trainer.store.hub_errors import (
    TRANSIENT_STATUS,
    TRANSPORT_ERRORS,
    Transient,
    access,
    chain,
    foreign_request,
    proxy_for,
    status,
    status_anywhere,
    transient,
    xet_failure,
)
from trainer.store.hub_http import bound_requests, delete_lfs_objects, lfs_file_oids
from trainer.store.hub_settings import ENV, HubSettings, RetryPolicy, Timeouts
from trainer.store.hub_transfer import transfer_scope
from trainer.store.protocol import (
    Conflict,
    EntryMissing,
    FileInfo,
    RepoMissing,
    StoreError,
    StoreUnavailable,
    sha256_file,
)

__all__ = ["HubStore", "RetryPolicy", "Timeouts", "DEFAULT_ENDPOINT", "TRANSIENT_STATUS", "COMMIT_MARKER"]

log = logging.getLogger("trainer.hub")  # the name its warnings carry in the log lines (readers grep it)

DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT_MARKER = "specprobe-commit"
# Files the Hub itself keeps in every repo: bookkeeping, not store content (a local store has no such file).
HUB_BOOKKEEPING = frozenset({".gitattributes"})
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TOKENISH = re.compile(r"hf_[A-Za-z0-9_]{8,}")
# A presigned storage URL's signature is a credential for its object until it expires: kept out of messages too.
_SIGNED = re.compile(r"(?i)([?&](?:X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|Signature|sig)=)[^&\s'\"]*")
_CHUNK = 1 << 20
T = TypeVar("T")


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
        # A request whose answer is lost ends (the retry loop settles it), a trickle ends, no wait an answer asks for
        # outlasts the cap, and the token goes to this endpoint's host only (trainer/store/hub_http.py).
        bound_requests(self.timeouts, max_wait_s=self.retry.max_retry_after_s, endpoint=self.endpoint)
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
                if expect_revision is None or status(e) != 412:
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
        backoff, then through an outage (module docstring); the rest raise the store errors they are
        (:meth:`_judge`; a StoreError from ``fn`` as is). ``settle`` answers a failure that may have been applied
        anyway, its answer lost: the result if it was, None if not. It is asked before every retry, before giving
        up, and before reporting a failure that is not an answer from the Hub. ``commit``: ``fn`` commits (see
        :meth:`_judge`)."""
        last: BaseException | None = None
        first, attempt = self.retry.clock(), 0
        while True:
            attempt += 1
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
                if settle is not None and status(last) is None and (done := settle(last)) is not None:
                    return done
                raise StoreError(self._safe(f"{self.url}: {what} failed: {self._describe(last)}")) from last
            gave_up = self._wait(what, attempt, retry, first)
            if gave_up is not None:
                break
        if settle is not None and (done := settle(last)) is not None:
            return done
        raise StoreUnavailable(self._safe(f"{self.url}: {what} failed {gave_up}: {self._describe(last)}")) from last

    def _wait(self, what: str, attempt: int, t: Transient, first: float) -> str | None:
        """Sleep before the next try of ``what``; or, when no next try comes, say why (the tries spent, the outage
        waited out, the deadline)."""
        r = self.retry
        if attempt < r.attempts:
            wait, outage = r.delay(attempt, t.retry_after), False
        else:
            wait, outage, elapsed = r.outage_delay(t.retry_after), True, r.clock() - first
            if r.outage_s <= 0 or elapsed + wait > r.outage_s:
                waited = f" and {elapsed:.0f}s of an outage ({ENV['outage']}={r.outage_s:g})" if r.outage_s > 0 else ""
                return f"after {attempt} tries{waited}"
        if not r.fits(wait):
            return (
                f"after {attempt} tries: a next try would come after the session's deadline ({ENV['deadline']}), "
                "so it was not waited for"
            )
        if outage:
            log.warning(
                "hub: %s: %s: %d tries failed over %.0fs (last: %s): the Hub looks unreachable or down; trying "
                "again in %.1fs, for up to %.0fs after the first try (%s)",
                self.url,
                what,
                attempt,
                r.clock() - first,
                self._safe(t.reason),
                wait,
                r.outage_s,
                ENV["outage"],
            )
        else:
            log.warning(
                "hub: %s: %s try %d/%d failed (%s); retrying in %.2fs",
                self.url,
                what,
                attempt,
                r.attempts,
                self._safe(t.reason),
                wait,
            )
        r.sleep(wait)
        return None

    def _judge(self, what: str, e: Exception, *, commit: bool = False) -> Transient | None:
        """The retry a failure deserves (None: it is final); a definite answer with a store error of its own
        raises that. ``commit``: a commit's upload phase retries more 4xx (trainer/store/hub_errors.py), and its
        409 / 412 (a concurrent commit; the head moved under ``parent_commit``: another writer, or our own earlier
        try) re-reads the history and the head, then tries again."""
        away = foreign_request(e, self.endpoint)
        if away is not None and away[1] in (401, 403, 404):
            foreign = away[0]
            raise StoreError(
                self._safe(
                    f"{self.url}: {what} failed: an answer of the Hub sent a request to {foreign}, another host than "
                    f"the endpoint {self.endpoint}; the token goes to the endpoint's host only, and {foreign} refused "
                    f"the request without it: {self._describe(e)}. Check HF_ENDPOINT and the proxy between you and "
                    "the Hub (a mirror must name its own host in the URLs it answers with)"
                )
            ) from e
        if (xet := xet_failure(e)) is not None and self._xet_off(what, xet):
            return Transient(f"Xet storage failed ({xet}); trying again over plain HTTP", 0.0)
        if (seen := access(e)) is not None:
            raise self._access_error(what, seen.kind, seen.status, seen.hub_says) from e
        if isinstance(e, LocalEntryNotFoundError):  # checked before its base class EntryNotFoundError
            return Transient("the Hub could not be reached")
        if isinstance(e, EntryNotFoundError):
            raise EntryMissing(self._safe(f"{self.url}: {what}: no such file in the repo")) from e
        if isinstance(e, RevisionNotFoundError) and not commit:  # main does not exist yet: a repo without commits
            raise _RevisionMissing(self._safe(f"{self.url}: {what}: {self._describe(e)}")) from e
        if status_anywhere(e, 401):
            raise StoreError(self._auth_message(what, e)) from e
        if commit and status(e) in (409, 412):
            # The commit endpoint's conflicts (the head moved, a concurrent commit): before the next try the
            # history is read back (settle) and the head re-read, so a try that landed is not pushed twice.
            return Transient(f"HTTP {status(e)} conflict")
        return transient(e, uploading=commit)

    def _xet_off(self, what: str, failure: str) -> bool:
        """Turn Xet storage off for the rest of this process after it failed; False when it was off already."""
        import huggingface_hub.constants as hf_constants

        if getattr(hf_constants, "HF_HUB_DISABLE_XET", True):
            return False
        hf_constants.HF_HUB_DISABLE_XET = True  # read by the client at every transfer (is_xet_available)
        log.warning(
            "hub: %s: %s: Xet storage failed (%s); this process moves files over plain HTTP from now on "
            "(HF_HUB_DISABLE_XET=1 does that from the start)",
            self.url,
            what,
            self._safe(failure),
        )
        return True

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
            size = int(meta.size) if meta.size is not None else None
            local = Path(
                self._retrying(
                    f"download of {path}", lambda c=cache, r=revision, n=size: self._download_once(path, r, c, n)
                )
            )
            got = self._verify(local.resolve(), meta)
            if got.matches:
                return got
            if check < self.retry.verify_attempts:
                wait = self.retry.delay(check)
                log.warning(
                    "hub: %s: download of %s: the bytes do not match the recorded hash %s (download %d/%d); "
                    "downloading again in %.2fs",
                    self.url,
                    path,
                    got.expected,
                    check,
                    self.retry.verify_attempts,
                    wait,
                )
                self.retry.sleep(wait)
        assert got is not None
        return got

    def _download_once(self, path: str, revision: str | None, cache: Path, size: int | None) -> str:
        try:
            # One transfer however often the client resumes it: a trickle ends (trainer/store/hub_transfer.py).
            with transfer_scope(f"download of {self.url}/{path}", size, self.timeouts):
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

    def _access_error(self, what: str, kind: str, code: int | None, hub_says: str) -> StoreError:
        """The store error for the Hub's answer about access (trainer/store/hub_errors.py: ``access``): a missing
        repo is RepoMissing (a fresh start may create it); a gated one, or one the token cannot see, never is."""
        repo = f"Hub {self.repo_type} repo {self.repo_id}"
        said = f' The Hub says (HTTP {code}): "{hub_says}"' if hub_says else f" (HTTP {code})"
        if kind == "gated":
            return StoreError(
                self._safe(
                    f"{self.url}: {what} failed: {repo} is gated and the "
                    f"{'token in use has' if self._token else 'request (no token was found) has'} no access to it."
                    f"{said}. Ask for access on its page ({self.endpoint}/{self._web_path()}) with the account of the "
                    "token (HF_TOKEN, or `hf auth login`)"
                )
            )
        if kind == "hidden" and self._token:
            return StoreError(
                self._safe(
                    f"{self.url}: {what} failed: the token in use cannot see {repo}: it is private to other accounts, "
                    f"or it was deleted (the Hub answers both alike).{said}. Use a token with read and write access "
                    "to it (HF_TOKEN, or `hf auth login`); nothing was created in its place"
                )
            )
        who = (
            "the token cannot see it"
            if self._token
            else "it is private and no token was found: set HF_TOKEN or run `hf auth login`"
        )
        return RepoMissing(self._safe(f"{repo} does not exist at {self.endpoint} (or {who}).{said}"))

    def _web_path(self) -> str:
        return self.repo_id if self.repo_type == "model" else f"{self.repo_type}s/{self.repo_id}"

    def _describe(self, e: BaseException) -> str:
        """Every cause in the chain, outermost first, so the server's own words survive the client's
        wrappers ("Error while uploading ..." <- "400 Client Error ..." <- the server's message)."""
        parts: list[str] = []
        everything = chain(e)
        for x in everything[:5]:
            first = (str(x).strip().splitlines() or [""])[0]
            text = f"{type(x).__name__}: {first}" if first else type(x).__name__
            server = (getattr(x, "server_message", None) or "").strip()
            if server and server.splitlines()[0] not in text:
                text += f" (server says: {server.splitlines()[0]})"
            if not any(text in p or first and first in p for p in parts):
                parts.append(text)
        said = " <- ".join(parts)[:2000]
        proxy = proxy_for(self.endpoint)
        if proxy is not None and any(isinstance(x, TRANSPORT_ERRORS) for x in everything):
            said += f" (the request went through the proxy {proxy}: a connection error may be the proxy's)"
        return self._safe(said)

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
        """``text`` with the token (and anything shaped like a Hub token, and a presigned URL's signature) blanked
        out."""
        if self._token:
            text = text.replace(self._token, "<redacted>")
        return _SIGNED.sub(r"\1<redacted>", _TOKENISH.sub("<redacted>", text))


class _RevisionMissing(StoreError):
    """Internal: main does not exist yet (a repo without commits)."""
