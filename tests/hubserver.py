"""A Hugging Face Hub protocol test server (standard library only).

It speaks the subset of the Hub API that the UNMODIFIED ``huggingface_hub`` client uses for the calls in
``trainer/store/hub.py`` (see its module docstring), so the Hub backend is exercised over real HTTP:

- ``POST /api/repos/create`` (409 with the url when it exists), ``DELETE /api/repos/delete``
- ``GET /api/{type}s/{id}[/revision/{rev}]``                 repo info with ``sha`` and ``siblings``
- ``GET /api/{type}s/{id}/tree/{rev}[/{path}]?recursive=``    paginated with a ``Link: rel="next"`` header
- ``POST /api/{type}s/{id}/paths-info/{rev}``                 form-encoded ``paths``
- ``POST /api/{type}s/{id}/preupload/{rev}``                  uploadMode / shouldIgnore / remote oid
- ``POST /api/{type}s/{id}/commit/{rev}``                     NDJSON: header, file, lfsFile, deletedFile,
  deletedFolder; ``parentCommit`` mismatch -> 412
- ``GET /api/{type}s/{id}/commits/{rev}``                     history, newest first
- ``POST /{prefix}{id}.git/info/lfs/objects/batch``           git-LFS batch, basic transfer; the upload and
  verify actions point back at this server (``/__lfs__/...``), the upload URL carries a signature instead of
  the bearer token, like a presigned storage URL
- ``GET|HEAD /{prefix}{id}/resolve/{rev}/{path}``             ETag, X-Repo-Commit, X-Linked-Etag/Size, Range
- ``GET /api/{type}s/{id}/lfs-files``, ``POST /api/{type}s/{id}/lfs-files/batch``  list / permanently delete LFS
  objects (``rewriteHistory`` drops the files that referenced them from every commit)
- ``POST /api/validate-yaml``, ``GET /api/whoami-v2``
- ``/api/{type}s/{id}/xet-*``: 501 (this server speaks LFS, not Xet); a ``status`` fault on those paths gives a
  client with Xet enabled the 4xx that hf_xet turns into ``ConnectionError``
- errors carry ``X-Error-Code`` (RepoNotFound, EntryNotFound, RevisionNotFound) and ``X-Error-Message`` so
  the client raises its own exception types.

Writes need ``Authorization: Bearer <token>`` (401 otherwise); private repos are invisible (404
RepoNotFound) without it. The request log never holds the Authorization header's value.

Faults (:meth:`HubServer.inject`, or ``POST /__control__/inject`` with the same arguments as JSON, so a test
driving a subprocess can arm them): ``status`` (any code, e.g. 429 with Retry-After, 500, 503), ``conflict``
(412), ``reset`` (connection reset while the request body is being received), ``lost_response`` (the request
is fully processed, e.g. a commit lands, then the connection drops without a response), ``truncate`` (a
download is cut mid-file: ``mode="close"`` keeps the full Content-Length and closes early, ``mode="short"``
declares and sends a shortened body), ``truncate_upload`` (storage receives only the first half of an LFS
upload's body, as behind a proxy that cut it, and rejects it with its own 400) and ``corrupt`` (after a commit
lands, the stored bytes of the added files matching ``file_pattern`` are changed while every piece of metadata
keeps the uploaded hash; bytes that are corrupt already stay as they are), ``stall`` (the request is fully
processed, e.g. a commit lands, and the answer is held back ``delay_s`` seconds, or until the server stops: an
answer that never comes) and ``stale_listing`` (a tree listing leaves out the files matching ``file_pattern``,
as a listing served from a replica that lags behind the last commit), ``trickle`` (the answer's body is sent at
``rate_bps`` bytes a second; given ``delay_s``, a second's worth, then nothing for ``delay_s``, then the connection
drops), ``foreign`` (the URLs the answer names, a listing's next page and an LFS verify
action, point at a second listener of this server, :attr:`HubServer.foreign_url`: another host to the client),
``gated`` (HTTP 403 ``GatedRepo`` with the Hub's text) and ``hidden`` (HTTP 401 ``RepoNotFound``: a repo private to
other accounts, as the Hub answers a token that cannot see it). Objects are content-addressed and never replaced
by an upload of the same content, like the Hub's: an LFS object stays until it is permanently deleted, and a
regular file's git blob for good (git writes no object it has). A fault fires on the ``nth`` matching request and
the ``times - 1`` matching requests after it, or, given ``duration_s``, on every matching request for that many
seconds from its first firing (an outage). :meth:`HubServer.corrupt` changes a stored file directly.

``HubServer(xet=True)`` answers downloads as a Xet-backed Hub does (``X-Xet-Hash`` and the ``xet-auth`` link to
the read-token endpoint); the token endpoints answer 501 (this server speaks no Xet) unless a ``status`` fault
says otherwise. Every request log record says which listener got it (``host``: hub | foreign) and whether it
carried an ``Authorization`` header at all (``auth_header``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = ["HubServer", "Fault"]

REDACTED = "<redacted>"
# The tests' server: a token recognisable wherever it leaks (tests grep every output for it), and LFS for
# files from 1 KB up, so that small test files take the LFS path too.
HUB_TOKEN = "hf_FAKE_SECRET_TOKEN_9f8e7d"
HUB_LFS_THRESHOLD = 1024


class SleepRecorder:
    """Stands in for time.sleep in a RetryPolicy: records the backoff delays, waits only a token amount."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


REPO_TYPES = ("model", "dataset", "space")
_URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
# Mirrors the Hub's default .gitattributes: these names are LFS whatever their size.
DEFAULT_LFS_PATTERNS = (
    "*.safetensors",
    "*.pt",
    "*.pth",
    "*.bin",
    "*.ckpt",
    "*.h5",
    "*.onnx",
    "*.npy",
    "*.npz",
    "*.pkl",
    "*.zip",
    "*.gz",
    "*.tar",
    "*.parquet",
    "*.arrow",
)
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in DEFAULT_LFS_PATTERNS).encode()
FAULT_KINDS = (
    "status",
    "conflict",
    "reset",
    "lost_response",
    "stall",
    "truncate",
    "truncate_upload",
    "corrupt",
    "stale_listing",
    "trickle",
    "foreign",
    "gated",
    "hidden",
)


def _repo_in(path: str) -> tuple[str, str]:
    """(kind, owner/name) a request path is about: an API path or a download path."""
    m = re.match(r"^/(?:api/)?(models/|datasets/|spaces/)?([^/?]+/[^/?]+)", path)
    if not m:
        return "model", "?"
    return {"datasets/": "dataset", "spaces/": "space"}.get(m.group(1) or "", "model"), m.group(2)


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob: what the Hub reports as a regular file's oid / ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _glob_match(pattern: str, path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    rx = "^" + re.escape(pattern).replace(r"\*", "[^/]*") + "$"
    return re.match(rx, name) is not None


@dataclass
class Entry:
    """One file in a commit's tree. ``key`` addresses the stored bytes (a blob or an LFS object); ``oid`` and
    ``sha256`` are the hashes recorded at upload and are never recomputed, so corruption stays silent."""

    size: int
    oid: str  # git blob sha1 (regular) / sha1 of the pointer file (LFS)
    lfs_sha256: str | None  # None for regular files
    key: str


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    message: str
    date: str
    author: str
    tree: dict[str, Entry]


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    created: str
    commits: list[Commit] = field(default_factory=list)  # oldest first; commits[-1] is the head of main
    blobs: dict[str, bytearray] = field(default_factory=dict)  # key -> bytes (regular blobs and LFS objects)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def head(self) -> Commit:
        return self.commits[-1]


@dataclass
class Fault:
    kind: str
    path_pattern: str = ".*"
    method: str | None = None
    nth: int = 1
    times: int = 1
    status: int = 503
    retry_after: float | str | None = None  # seconds, or an HTTP date as the header gives it
    mode: str = "close"
    file_pattern: str = ".*"
    delay_s: float | None = None  # stall: seconds the answer is held back (None: until the server stops)
    duration_s: float | None = None  # fire on every match for this long from the first firing (``times`` ignored)
    rate_bps: float = 1.0  # trickle: bytes a second
    seen: int = 0
    fired: int = 0
    first_fired: float | None = None

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and self.method.upper() != method:
            return False
        return re.search(self.path_pattern, path) is not None

    def take(self) -> bool:
        """Count one matching request; True when this one must fail."""
        self.seen += 1
        if self.seen < self.nth:
            return False
        if self.duration_s is not None:
            now = time.monotonic()
            if self.first_fired is None:
                self.first_fired = now
            if now - self.first_fired > self.duration_s:
                return False
            self.fired += 1
            return True
        if self.fired < self.times:
            self.fired += 1
            return True
        return False

    def as_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in (
                "kind",
                "path_pattern",
                "method",
                "nth",
                "times",
                "status",
                "retry_after",
                "mode",
                "file_pattern",
                "delay_s",
                "duration_s",
                "rate_bps",
                "seen",
                "fired",
            )
        }


class _Reply(Exception):
    """Raised inside a handler to answer with an error status (and X-Error-* headers)."""

    def __init__(
        self, status: int, message: str, code: str | None = None, headers: dict | None = None, repo: Repo | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.headers, self.repo = status, message, code, headers or {}, repo


class _Drop(Exception):
    """Close the connection without an answer (reset / lost response faults)."""


class HubServer:
    """The server state plus a ThreadingHTTPServer on 127.0.0.1 (port 0 picks a free port)."""

    def __init__(
        self,
        token: str | None = "hf_test_token",
        user: str = "specprobe-tester",
        lfs_threshold: int = 10 * 1024 * 1024,
        lfs_patterns: tuple[str, ...] = DEFAULT_LFS_PATTERNS,
        page_size: int = 1000,
        port: int = 0,
        xet: bool = False,
    ):
        self.token = token  # None: any non-empty bearer token is accepted
        self.user = user
        self.lfs_threshold = lfs_threshold
        self.lfs_patterns = tuple(lfs_patterns)
        self.page_size = page_size
        self.xet = xet
        self.repos: dict[tuple[str, str], Repo] = {}
        self.faults: list[Fault] = []
        self.log: list[dict[str, Any]] = []
        self._lock = threading.RLock()
        self._secret = uuid.uuid4().bytes  # signs LFS upload URLs
        self._counter = 0
        self._httpd = _QuietServer(("127.0.0.1", port), _make_handler(self))
        self._httpd.daemon_threads = True
        # A second listener on the same state: "another host" to a client (the ``foreign`` fault names it).
        self._foreign = _QuietServer(("127.0.0.1", 0), _make_handler(self, foreign=True))
        self._foreign.daemon_threads = True
        self._thread: threading.Thread | None = None
        self._foreign_thread: threading.Thread | None = None
        self._stopping = threading.Event()  # wakes every stalled answer

    # ----------------------------------------------------------------------------------- lifecycle
    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def foreign_url(self) -> str:
        return f"http://127.0.0.1:{self._foreign.server_address[1]}"

    def start(self) -> "HubServer":
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="hubserver", daemon=True
        )
        self._thread.start()
        self._foreign_thread = threading.Thread(
            target=self._foreign.serve_forever, kwargs={"poll_interval": 0.05}, name="hubserver-foreign", daemon=True
        )
        self._foreign_thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        for httpd, thread in ((self._httpd, self._thread), (self._foreign, self._foreign_thread)):
            if thread is not None:
                httpd.shutdown()
                thread.join(timeout=5)
            httpd.server_close()

    def env(self, disable_xet: bool = True) -> dict[str, str]:
        """Environment for a subprocess (a trainer) that must talk to this server."""
        env = {"HF_ENDPOINT": self.url, "HF_HUB_DISABLE_TELEMETRY": "1"}
        if self.token is not None:
            env["HF_TOKEN"] = self.token
        if disable_xet:  # Xet uploads cannot be served locally; LFS is the path this server speaks
            env["HF_HUB_DISABLE_XET"] = "1"
        return env

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --------------------------------------------------------------------------------- test API
    def inject(
        self,
        kind: str,
        path_pattern: str = ".*",
        *,
        method: str | None = None,
        nth: int = 1,
        times: int = 1,
        status: int | None = None,
        retry_after: float | str | None = None,
        mode: str = "close",
        file_pattern: str = ".*",
        delay_s: float | None = None,
        duration_s: float | None = None,
        rate_bps: float = 1.0,
    ) -> Fault:
        """Arm a fault on requests whose path (with query) matches ``path_pattern`` (``re.search``)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
        if mode not in ("close", "short"):
            raise ValueError(f"unknown truncate mode {mode!r} (close|short)")
        default_status = {"conflict": 412, "status": 503, "gated": 403, "hidden": 401}.get(kind, 503)
        fault = Fault(
            kind=kind,
            path_pattern=path_pattern,
            method=method,
            nth=max(1, int(nth)),
            times=int(times),
            status=int(status if status is not None else default_status),
            retry_after=retry_after,
            mode=mode,
            file_pattern=file_pattern,
            delay_s=None if delay_s is None else float(delay_s),
            duration_s=None if duration_s is None else float(duration_s),
            rate_bps=float(rate_bps),
        )
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def repo(self, repo_id: str, repo_type: str = "dataset") -> Repo:
        try:
            return self.repos[(repo_type, repo_id)]
        except KeyError:
            raise KeyError(f"test hub server has no {repo_type} repo {repo_id!r}") from None

    def commit_count(self, repo_id: str, repo_type: str = "dataset") -> int:
        """Commits on main, the initial commit made by repo creation included."""
        return len(self.repo(repo_id, repo_type).commits)

    def files(self, repo_id: str, repo_type: str = "dataset") -> dict[str, bytes]:
        """The head's files as the bytes actually stored."""
        repo = self.repo(repo_id, repo_type)
        with repo.lock:
            return {p: bytes(repo.blobs[e.key]) for p, e in repo.head.tree.items()}

    def corrupt(self, repo_id: str, path: str, repo_type: str = "dataset") -> None:
        """Silently change the stored bytes of ``path`` (same size; recorded hashes untouched)."""
        repo = self.repo(repo_id, repo_type)
        with repo.lock:
            entry = repo.head.tree.get(path)
            if entry is None:
                raise KeyError(f"{repo_type} repo {repo_id!r} has no file {path!r}")
            self._spoil(repo.blobs[entry.key], entry)

    @staticmethod
    def _spoil(data: bytearray, entry: Entry) -> None:
        """Change one byte of intact stored bytes. Bytes that are corrupt already stay corrupt: changing the
        same byte again would silently repair them (a re-upload deduplicated onto a bad object)."""
        intact = (
            hashlib.sha256(data).hexdigest() == entry.lfs_sha256
            if entry.lfs_sha256 is not None
            else git_blob_sha1(bytes(data)) == entry.oid
        )
        if not intact:
            return
        if not data:
            data.extend(b"\x00")
            return
        data[len(data) // 2] ^= 0xFF

    def requests(self, method: str | None = None, pattern: str = ".*") -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.log if (method is None or r["method"] == method) and re.search(pattern, r["path"])]

    # -------------------------------------------------------------------------------- internals
    def _next_oid(self, *parts: str) -> str:
        with self._lock:
            self._counter += 1
            n = self._counter
        return hashlib.sha1("\0".join((str(n), str(time.time_ns())) + parts).encode()).hexdigest()

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path) and fault.take():
                    return fault
        return None

    def _sign(self, oid: str) -> str:
        return hmac.new(self._secret, oid.encode(), hashlib.sha256).hexdigest()

    def is_lfs(self, path: str, size: int) -> bool:
        if size == 0:
            return False
        return size >= self.lfs_threshold or any(_glob_match(p, path) for p in self.lfs_patterns)


class _QuietServer(ThreadingHTTPServer):
    """A client killed mid-request (the kill tests do it on purpose) resets its connection: not a server error."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


def _make_handler(server: HubServer, foreign: bool = False) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        hub = server
        on_foreign = foreign

    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the Hub
    server_version = "specprobe-hubserver/1"
    hub: HubServer
    on_foreign: bool = False

    def setup(self) -> None:
        super().setup()
        # Without TCP_NODELAY every small response waits ~40 ms on delayed ACKs.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # `format`: the base class's name
        pass  # the structured log below replaces stderr noise (and never holds a token)

    # ------------------------------------------------------------------------------- plumbing
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        self._method = method
        self._body: bytes | None = None
        self._fault: Fault | None = None
        self._status = 0
        record = {
            "method": method,
            "path": self.path,
            "time": time.time(),
            # lower-case names: clients differ in how they spell them
            "headers": {k.lower(): (REDACTED if k.lower() == "authorization" else v) for k, v in self.headers.items()},
            "authorized": self._authorized(),
            "auth_header": self._has_auth_header(),
            "host": "foreign" if self.on_foreign else "hub",
            "status": None,
            "fault": None,
        }
        self._record = record
        with self.hub._lock:
            self.hub.log.append(record)  # before answering: a client that got its answer sees the record
        try:
            if not self.path.startswith("/__control__/"):
                self._fault = self.hub._fault_for(method, self.path)
                record["fault"] = self._fault.kind if self._fault else None
                self._pre_fault()
            self._route(method)
        except _Reply as r:
            self._error(r)
        except _Drop:
            self._status = -1
            self._drop()
        except (BrokenPipeError, ConnectionResetError):
            self._status = -1
            self.close_connection = True
        except Exception as e:  # a server bug must show as a 500 naming it, not a hang
            self._error(_Reply(500, f"test hub server error: {type(e).__name__}: {e}"))
        record["status"] = self._status

    def _pre_fault(self) -> None:
        f = self._fault
        if f is None:
            return
        if f.kind == "status":
            self._read_body()
            ra = f.retry_after
            if isinstance(ra, (int, float)):
                ra = str(int(ra) if float(ra).is_integer() else ra)
            headers = {"Retry-After": ra} if ra is not None else {}
            raise _Reply(f.status, f"injected fault: HTTP {f.status}", headers=headers)
        if f.kind == "conflict":
            self._read_body()
            raise _Reply(412, "injected fault: the parent commit is not the head of the branch")
        if f.kind == "gated":
            self._read_body()
            kind, repo_id = _repo_in(self.path)
            raise _Reply(
                f.status,
                f"Access to {kind} {repo_id} is restricted. You must have access to it and be authenticated to "
                "access it. Please log in.",
                code="GatedRepo",
            )
        if f.kind == "hidden":
            self._read_body()
            raise _Reply(f.status, "Invalid username or password.", code="RepoNotFound")
        if f.kind == "reset":
            # Take part of the upload, then reset the connection under the client's feet.
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(max(1, length // 2))
            raise _Drop()

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization") or ""
        if not auth.lower().startswith("bearer "):
            return False
        given = auth[7:].strip()
        if self.hub.token is None:
            return bool(given)
        return hmac.compare_digest(given.encode(), self.hub.token.encode())

    def _has_auth_header(self) -> bool:
        return bool(self.headers.get("Authorization"))

    def _need_write_auth(self) -> None:
        if not self._authorized():
            raise _Reply(401, "Invalid credentials in Authorization header")

    def _read_body(self) -> bytes:
        if self._body is None:
            length = int(self.headers.get("Content-Length") or 0)
            self._body = self.rfile.read(length) if length else b""
        return self._body

    def _json_body(self) -> Any:
        raw = self._read_body()
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            raise _Reply(400, "request body is not JSON") from None

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
        length: int | None = None,
    ) -> None:
        self._read_body()  # keep-alive needs the request fully consumed
        if self._fault is not None and self._fault.kind == "lost_response":
            raise _Drop()  # the work is done (a commit landed); the answer never arrives
        if self._fault is not None and self._fault.kind == "stall":
            # The work is done; the answer waits (a client without a read timeout waits with it).
            if self.hub._stopping.wait(self._fault.delay_s) or self._fault.delay_s is None:
                raise _Drop()
        self._status = status
        self._record["status"] = status
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.send_header("X-Request-Id", uuid.uuid4().hex[:16])
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self._method != "HEAD" and body:
            if self._fault is not None and self._fault.kind == "trickle":
                return self._trickle(body)
            self.wfile.write(body)

    def _trickle(self, body: bytes) -> None:
        """Send ``body`` a byte at a time at the fault's rate, until it is sent, the client hangs up or the server
        stops."""
        assert self._fault is not None
        rate, stall = max(self._fault.rate_bps, 1e-3), self._fault.delay_s
        for i in range(len(body)):
            if self.hub._stopping.wait(1.0 / rate):
                raise _Drop()
            self.wfile.write(body[i : i + 1])
            self.wfile.flush()
            if stall is not None and i + 1 >= rate:  # a second's worth sent: stall, then hang up
                self.hub._stopping.wait(stall)
                raise _Drop()

    def _json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(self, r: _Reply) -> None:
        headers = dict(r.headers)
        headers["X-Error-Message"] = r.message
        if r.code:
            headers["X-Error-Code"] = r.code
        if r.repo is not None and r.repo.commits:
            headers["X-Repo-Commit"] = r.repo.head.oid
        try:
            self._fault = None if (self._fault and self._fault.kind == "lost_response") else self._fault
            self._send(r.status, json.dumps({"error": r.message}).encode(), headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -------------------------------------------------------------------------------- routing
    def _route(self, method: str) -> None:
        split = urlsplit(self.path)
        path, self._query = unquote(split.path), parse_qs(split.query)
        raw_path = split.path
        if path.startswith("/__control__/"):
            return self._control(method, path)
        if path == "/api/repos/create" and method == "POST":
            return self._create_repo()
        if path == "/api/repos/delete" and method == "DELETE":
            return self._delete_repo()
        if path == "/api/whoami-v2" and method == "GET":
            return self._whoami()
        if path == "/api/validate-yaml" and method == "POST":
            self._read_body()
            return self._json({"errors": [], "warnings": []})
        if path.startswith("/__lfs__/"):
            return self._lfs_transfer(method, raw_path)
        m = re.match(r"^/api/(models|datasets|spaces)/([^/]+/[^/]+)(?:/(.*))?$", raw_path)
        if m:
            repo_type = m.group(1)[:-1]
            return self._api(method, repo_type, unquote(m.group(2)), m.group(3))
        m = re.match(r"^/(datasets/|spaces/)?([^/]+/[^/]+?)\.git/info/lfs/objects/batch$", path)
        if m and method == "POST":
            return self._lfs_batch(
                {"datasets/": "dataset", "spaces/": "space"}.get(m.group(1) or "", "model"), m.group(2)
            )
        m = re.match(r"^/(datasets/|spaces/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", raw_path)
        if m and method in ("GET", "HEAD"):
            return self._resolve(
                {"datasets/": "dataset", "spaces/": "space"}.get(m.group(1) or "", "model"),
                unquote(m.group(2)),
                unquote(m.group(3)),
                unquote(m.group(4)),
            )
        self._read_body()
        raise _Reply(404, f"test hub server: no route for {method} {split.path}")

    def _api(self, method: str, repo_type: str, repo_id: str, rest: str | None) -> None:
        if rest and rest.startswith("xet-"):
            self._read_body()
            raise _Reply(501, "this test server does not speak Xet: set HF_HUB_DISABLE_XET=1")
        repo = self._get_repo(repo_type, repo_id)
        if rest is None and method == "GET":
            return self._repo_info(repo, None)
        if rest is None:
            raise _Reply(405, f"{method} not allowed on repo info")
        # What follows the repo's path, and the handler of each method there; a handler takes the repo and the
        # route's parts, unquoted (a tree's path is "" when the URL names none).
        routes: tuple[tuple[str, str, Callable[..., None]], ...] = (
            ("GET", r"revision/(.+)", self._repo_info),
            ("GET", r"tree/([^/]+)(?:/(.*))?", self._tree),
            ("POST", r"paths-info/([^/]+)", self._paths_info),
            ("POST", r"preupload/([^/]+)", self._preupload),
            ("POST", r"commit/([^/]+)", self._commit),
            ("GET", r"commits/([^/]+)", self._commits),
            ("GET", r"lfs-files", self._lfs_files),
            ("POST", r"lfs-files/batch", self._lfs_files_delete),
        )
        for verb, pattern, handle in routes:
            m = re.fullmatch(pattern, rest)
            if m and method == verb:
                return handle(repo, *(unquote(part or "") for part in m.groups()))
        self._read_body()
        raise _Reply(404, f"test hub server: no route for {method} /api/{repo_type}s/{repo_id}/{rest}")

    # ------------------------------------------------------------------------------- helpers
    def _get_repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.hub.repos.get((repo_type, repo_id))
        if self._has_auth_header() and not self._authorized():
            self._read_body()
            raise _Reply(401, "Invalid credentials in Authorization header")
        if repo is None or (repo.private and not self._authorized()):
            self._read_body()
            raise _Reply(404, "Repository not found", code="RepoNotFound")
        return repo

    def _commit_at(self, repo: Repo, rev: str) -> Commit:
        if rev == "main":
            return repo.head
        for c in repo.commits:
            if c.oid == rev:
                return c
        raise _Reply(404, f"Invalid rev id: {rev}", code="RevisionNotFound", repo=repo)

    def _named_url(self) -> str:
        """The base of the URLs an answer names: this server, or its second listener under a ``foreign`` fault
        (and on that listener itself, which names itself)."""
        foreign = self.on_foreign or (self._fault is not None and self._fault.kind == "foreign")
        return self.hub.foreign_url if foreign else self.hub.url

    def _repo_url(self, repo: Repo) -> str:
        return f"{self.hub.url}/{_URL_PREFIX[repo.repo_type]}{repo.repo_id}"

    @staticmethod
    def _file_json(path: str, e: Entry) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "file", "oid": e.oid, "size": e.size, "path": path}
        if e.lfs_sha256 is not None:
            out["lfs"] = {"oid": e.lfs_sha256, "size": e.size, "pointerSize": 134}
        return out

    @staticmethod
    def _dirs(tree: dict[str, Entry]) -> set[str]:
        dirs: set[str] = set()
        for p in tree:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        return dirs

    # ----------------------------------------------------------------------------- endpoints
    def _control(self, method: str, path: str) -> None:
        if path == "/__control__/inject" and method == "POST":
            body = self._json_body()
            try:
                fault = self.hub.inject(**body)
            except (TypeError, ValueError) as e:
                raise _Reply(400, str(e)) from None
            return self._json(fault.as_dict())
        if path == "/__control__/clear" and method == "POST":
            self._read_body()
            self.hub.clear_faults()
            return self._json({"ok": True})
        if path == "/__control__/state" and method == "GET":
            with self.hub._lock:
                faults = [f.as_dict() for f in self.hub.faults]
                repos = {f"{t}/{i}": len(r.commits) for (t, i), r in self.hub.repos.items()}
            return self._json({"faults": faults, "commits": repos})
        raise _Reply(404, f"unknown control endpoint {path}")

    def _whoami(self) -> None:
        if not self._authorized():
            raise _Reply(401, "Invalid credentials in Authorization header")
        self._json(
            {
                "type": "user",
                "id": "0" * 24,
                "name": self.hub.user,
                "fullname": self.hub.user,
                "orgs": [],
                "auth": {"type": "access_token", "accessToken": {"displayName": "specprobe-test", "role": "write"}},
            }
        )

    def _create_repo(self) -> None:
        self._need_write_auth()
        body = self._json_body()
        name, org = body.get("name"), body.get("organization") or self.hub.user
        repo_type = body.get("type") or "model"
        if repo_type not in REPO_TYPES or not name:
            raise _Reply(400, f"bad create request: type={repo_type!r} name={name!r}")
        private = bool(body.get("private")) or body.get("visibility") in ("private", "protected")
        repo_id = f"{org}/{name}"
        with self.hub._lock:
            existing = self.hub.repos.get((repo_type, repo_id))
            if existing is not None:
                return self._json(
                    {"error": "You already created this repo", "url": self._repo_url(existing)}, status=409
                )
            repo = Repo(repo_type=repo_type, repo_id=repo_id, private=private, created=_now())
            # Like the Hub: a new repo starts with one commit holding .gitattributes.
            key = git_blob_sha1(GITATTRIBUTES)
            repo.blobs[key] = bytearray(GITATTRIBUTES)
            repo.commits.append(
                Commit(
                    oid=self.hub._next_oid(repo_id, "initial"),
                    parent=None,
                    title="initial commit",
                    message="initial commit",
                    date=_now(),
                    author=self.hub.user,
                    tree={".gitattributes": Entry(len(GITATTRIBUTES), key, None, key)},
                )
            )
            self.hub.repos[(repo_type, repo_id)] = repo
        self._json({"url": self._repo_url(repo), "name": repo_id, "id": uuid.uuid4().hex[:24]})

    def _delete_repo(self) -> None:
        self._need_write_auth()
        body = self._json_body()
        repo_id = f"{body.get('organization') or self.hub.user}/{body.get('name')}"
        repo_type = body.get("type") or "model"
        with self.hub._lock:
            if (repo_type, repo_id) not in self.hub.repos:
                raise _Reply(404, "Repository not found", code="RepoNotFound")
            del self.hub.repos[(repo_type, repo_id)]
        self._json({})

    def _repo_info(self, repo: Repo, rev: str | None) -> None:
        with repo.lock:
            commit = self._commit_at(repo, rev or "main")
            siblings = [{"rfilename": p} for p in sorted(commit.tree)]
        self._json(
            {
                "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
                "id": repo.repo_id,
                "author": repo.repo_id.split("/")[0],
                "sha": commit.oid,
                "private": repo.private,
                "gated": False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "createdAt": repo.created,
                "lastModified": commit.date,
                "siblings": siblings,
            }
        )

    def _tree(self, repo: Repo, rev: str, prefix: str) -> None:
        recursive = (self._query.get("recursive", ["false"])[0]).lower() in ("1", "true")
        with repo.lock:
            commit = self._commit_at(repo, rev)
            tree = dict(commit.tree)
        prefix = prefix.strip("/")
        dirs = self._dirs(tree)
        if prefix and prefix not in dirs:
            if prefix in tree:
                entries = [self._file_json(prefix, tree[prefix])]
                return self._json(entries)
            raise _Reply(404, f"{prefix} does not exist on {rev}", code="EntryNotFound", repo=repo)
        base = prefix + "/" if prefix else ""
        items: list[dict[str, Any]] = []
        for d in sorted(dirs):
            if d.startswith(base) and (recursive or "/" not in d[len(base) :]):
                items.append({"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d})
        fault = self._fault
        for p in sorted(tree):
            if fault is not None and fault.kind == "stale_listing" and re.search(fault.file_pattern, p):
                continue  # a replica that has not caught up with the commit that added it
            if p.startswith(base) and (recursive or "/" not in p[len(base) :]):
                items.append(self._file_json(p, tree[p]))
        items.sort(key=lambda i: i["path"])
        self._paged(items)

    def _paged(self, items: list[Any]) -> None:
        start = int(self._query.get("cursor", ["0"])[0] or 0)
        page = items[start : start + self.hub.page_size]
        headers = {}
        if start + self.hub.page_size < len(items):
            split = urlsplit(self.path)
            query = "&".join(f"{k}={quote(v[0])}" for k, v in self._query.items() if k != "cursor")
            nxt = f"{self._named_url()}{split.path}?{query + '&' if query else ''}cursor={start + self.hub.page_size}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._json(page, headers=headers)

    def _paths_info(self, repo: Repo, rev: str) -> None:
        raw = self._read_body().decode()
        if (self.headers.get("Content-Type") or "").startswith("application/json"):
            paths = json.loads(raw or "{}").get("paths", [])
        else:
            paths = parse_qs(raw).get("paths", [])
        with repo.lock:
            commit = self._commit_at(repo, rev)
            tree = dict(commit.tree)
        dirs = self._dirs(tree)
        out = []
        for p in paths:
            p = p.strip("/")
            if p in tree:
                out.append(self._file_json(p, tree[p]))
            elif p in dirs:
                out.append({"type": "directory", "oid": hashlib.sha1(p.encode()).hexdigest(), "size": 0, "path": p})
        self._json(out)

    def _preupload(self, repo: Repo, rev: str) -> None:
        self._need_write_auth()
        body = self._json_body()
        with repo.lock:
            tree = dict(self._commit_at(repo, rev).tree)
        files = []
        for f in body.get("files", []):
            path, size = f.get("path"), int(f.get("size", 0))
            mode = "lfs" if self.hub.is_lfs(path, size) else "regular"
            item: dict[str, Any] = {"path": path, "uploadMode": mode, "shouldIgnore": False}
            existing = tree.get(path)
            if existing is not None:
                # The client compares this with its local oid to skip unchanged files.
                item["oid"] = existing.lfs_sha256 if existing.lfs_sha256 else existing.oid
            files.append(item)
        self._json({"files": files, "commitOid": None})

    def _commit(self, repo: Repo, rev: str) -> None:
        self._need_write_auth()
        header, operations = self._commit_payload()
        summary = header.get("summary") or ""
        if not summary:
            raise _Reply(400, "commit summary is empty")
        description = header.get("description") or ""
        with repo.lock:
            if rev != "main":
                raise _Reply(
                    404, f"Invalid rev id: {rev} (this server commits to main only)", code="RevisionNotFound", repo=repo
                )
            head = repo.head
            parent = header.get("parentCommit")
            if parent is not None and not head.oid.startswith(parent):
                raise _Reply(
                    412,
                    f"A commit has happened since. Parent commit {parent} is not the head {head.oid} of main",
                    repo=repo,
                )
            tree = dict(head.tree)
            new_blobs: dict[str, bytearray] = {}
            added = [p for line in operations if (p := self._apply(repo, tree, new_blobs, line))]
            for key, data in new_blobs.items():
                repo.blobs.setdefault(key, data)  # git writes no object it has, a corrupt one included
            commit = Commit(
                oid=self.hub._next_oid(repo.repo_id, head.oid, summary),
                parent=head.oid,
                title=summary,
                message=summary + ("\n\n" + description if description else ""),
                date=_now(),
                author=self.hub.user,
                tree=tree,
            )
            repo.commits.append(commit)
            fault = self._fault
            if fault is not None and fault.kind == "corrupt":
                for p in added:
                    if re.search(fault.file_pattern, p):
                        self.hub._spoil(repo.blobs[tree[p].key], tree[p])
        self._json(
            {
                "success": True,
                "commitOid": commit.oid,
                "commitMessage": summary,
                "commitUrl": f"{self._repo_url(repo)}/commit/{commit.oid}",
                "hookOutput": "",
            }
        )

    def _commit_payload(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The commit's NDJSON body: its header's value and the operation lines after it."""
        try:
            lines = [json.loads(line) for line in self._read_body().splitlines() if line.strip()]
        except ValueError:
            raise _Reply(400, "commit payload is not NDJSON") from None
        if not lines or lines[0].get("key") != "header":
            raise _Reply(400, "commit payload must start with a header line")
        return lines[0]["value"], lines[1:]

    @staticmethod
    def _apply(repo: Repo, tree: dict[str, Entry], new_blobs: dict[str, bytearray], line: dict) -> str | None:
        """One commit operation applied to `tree` (under the repo's lock); returns the path it added, if any."""
        key, value = line.get("key"), line.get("value") or {}
        path = (value.get("path") or "").strip("/")
        if not path:
            raise _Reply(400, f"operation {key!r} without a path")
        if key == "file":
            if value.get("encoding") != "base64":
                raise _Reply(400, f"unsupported encoding for {path}")
            data = base64.b64decode(value.get("content") or "")
            blob = git_blob_sha1(data)
            new_blobs[blob] = bytearray(data)
            tree[path] = Entry(len(data), blob, None, blob)
            return path
        if key == "lfsFile":
            oid = value.get("oid")
            if oid not in repo.blobs:
                raise _Reply(422, f"LFS object {oid} for {path} was never uploaded")
            size = len(repo.blobs[oid])
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"
            tree[path] = Entry(size, git_blob_sha1(pointer.encode()), oid, oid)
            return path
        if key == "deletedFile":
            if path not in tree:
                raise _Reply(404, f"A file with this name doesn't exist: {path}", code="EntryNotFound", repo=repo)
            del tree[path]
            return None
        if key == "deletedFolder":
            gone = [p for p in tree if p.startswith(path + "/")]
            if not gone:
                raise _Reply(404, f"A folder with this name doesn't exist: {path}", code="EntryNotFound", repo=repo)
            for p in gone:
                del tree[p]
            return None
        raise _Reply(400, f"unknown commit operation {key!r}")

    def _commits(self, repo: Repo, rev: str) -> None:
        with repo.lock:
            start = self._commit_at(repo, rev)
            by_oid = {c.oid: c for c in repo.commits}
            chain: list[Commit] = []
            c: Commit | None = start
            while c is not None:
                chain.append(c)
                c = by_oid.get(c.parent) if c.parent else None
        self._paged(
            [
                {
                    "id": c.oid,
                    "title": c.title,
                    "message": c.message,
                    "date": c.date,
                    "authors": [{"user": c.author, "avatar": None}],
                }
                for c in chain
            ]
        )

    # --------------------------------------------------------------------------------- LFS
    def _lfs_files(self, repo: Repo) -> None:
        self._need_write_auth()
        with repo.lock:
            seen: dict[str, dict[str, Any]] = {}
            for c in repo.commits:
                for path, e in c.tree.items():
                    if e.lfs_sha256 is not None and e.lfs_sha256 in repo.blobs:
                        seen.setdefault(
                            e.lfs_sha256,
                            {
                                "fileOid": e.lfs_sha256,
                                "oid": e.oid,
                                "filename": path,
                                "pushedAt": c.date,
                                "ref": "main",
                                "size": e.size,
                            },
                        )
        self._paged(list(seen.values()))

    def _lfs_files_delete(self, repo: Repo) -> None:
        self._need_write_auth()
        deletions = self._json_body().get("deletions") or {}
        shas, rewrite = set(deletions.get("sha") or []), bool(deletions.get("rewriteHistory"))
        with repo.lock:
            for sha in shas:
                repo.blobs.pop(sha, None)
            if rewrite:
                for c in repo.commits:
                    c.tree = {p: e for p, e in c.tree.items() if e.lfs_sha256 not in shas}
        self._send(204)

    def _lfs_batch(self, repo_type: str, repo_id: str) -> None:
        repo = self._get_repo(repo_type, repo_id)
        self._need_write_auth()
        body = self._json_body()
        if body.get("operation") != "upload":
            raise _Reply(400, "this test server only serves LFS uploads through the batch API")
        objects = []
        for obj in body.get("objects", []):
            oid, size = str(obj.get("oid")), int(obj.get("size", -1))
            item: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if not re.fullmatch(r"[0-9a-f]{64}", oid) or size < 0:
                item["error"] = {"code": 422, "message": "bad oid or size"}
            elif oid not in repo.blobs:
                where = f"{_URL_PREFIX[repo.repo_type]}{repo.repo_id}"
                item["actions"] = {
                    "upload": {
                        "href": f"{self.hub.url}/__lfs__/upload/{where}/{oid}/{size}?sig={self.hub._sign(oid)}",
                        "header": {},
                    },
                    "verify": {"href": f"{self._named_url()}/__lfs__/verify/{where}", "header": {}},
                }
            objects.append(item)
        self._send(
            200,
            json.dumps({"transfer": "basic", "objects": objects}).encode(),
            content_type="application/vnd.git-lfs+json",
        )

    def _lfs_transfer(self, method: str, raw_path: str) -> None:
        m = re.match(r"^/__lfs__/upload/(datasets/|spaces/)?([^/]+/[^/]+)/([0-9a-f]{64})/(\d+)$", raw_path)
        if m and method == "PUT":
            repo_type = {"datasets/": "dataset", "spaces/": "space"}.get(m.group(1) or "", "model")
            oid, size = m.group(3), int(m.group(4))
            sig = self._query.get("sig", [""])[0]
            data = self._read_body()
            if self._fault is not None and self._fault.kind == "truncate_upload":
                data = data[: len(data) // 2]
            if not hmac.compare_digest(sig, self.hub._sign(oid)):
                raise _Reply(403, "bad upload signature")
            if len(data) != size or hashlib.sha256(data).hexdigest() != oid:
                raise _Reply(400, f"uploaded bytes do not match oid {oid} / size {size}")
            repo = self.hub.repos.get((repo_type, unquote(m.group(2))))
            if repo is None:
                raise _Reply(404, "Repository not found", code="RepoNotFound")
            with repo.lock:
                repo.blobs.setdefault(oid, bytearray(data))
            return self._send(200, b"")
        m = re.match(r"^/__lfs__/verify/(datasets/|spaces/)?([^/]+/[^/]+)$", raw_path)
        if m and method == "POST":
            self._need_write_auth()
            repo_type = {"datasets/": "dataset", "spaces/": "space"}.get(m.group(1) or "", "model")
            repo = self._get_repo(repo_type, unquote(m.group(2)))
            body = self._json_body()
            data = repo.blobs.get(str(body.get("oid")))
            if data is None or len(data) != int(body.get("size", -1)):
                raise _Reply(404, f"LFS object {body.get('oid')} not found")
            return self._json({"success": True})
        self._read_body()
        raise _Reply(404, f"no LFS route for {method} {raw_path}")

    # ---------------------------------------------------------------------------- downloads
    def _resolve(self, repo_type: str, repo_id: str, rev: str, path: str) -> None:
        repo = self._get_repo(repo_type, repo_id)
        with repo.lock:
            commit = self._commit_at(repo, rev)
            entry = commit.tree.get(path)
            if entry is None:
                raise _Reply(
                    404, f"Entry not found: {path}", code="EntryNotFound", headers={"X-Repo-Commit": commit.oid}
                )
            if entry.key not in repo.blobs:
                raise _Reply(
                    404, f"the LFS object of {path} was permanently deleted", headers={"X-Repo-Commit": commit.oid}
                )
            data = bytes(repo.blobs[entry.key])
        headers = {"X-Repo-Commit": commit.oid, "Accept-Ranges": "bytes"}
        if entry.lfs_sha256 is not None:
            headers["ETag"] = f'"{entry.lfs_sha256}"'
            headers["X-Linked-Etag"] = f'"{entry.lfs_sha256}"'
            headers["X-Linked-Size"] = str(entry.size)
        else:
            headers["ETag"] = f'"{entry.oid}"'
        if self.hub.xet:  # a Xet-backed Hub names the file's Xet hash and where to get a read token
            headers["X-Xet-Hash"] = hashlib.sha256(b"xet:" + data).hexdigest()
            where = f"{self.hub.url}/api/{repo_type}s/{repo_id}/xet-read-token/{commit.oid}"
            headers["Link"] = f'<{where}>; rel="xet-auth"'
        status, body = 200, data
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", rng)
            if not m or (not m.group(1) and not m.group(2)):
                raise _Reply(416, f"bad range {rng}")
            if m.group(1):
                start = int(m.group(1))
                end = int(m.group(2)) if m.group(2) else len(data) - 1
            else:
                start, end = max(0, len(data) - int(m.group(2))), len(data) - 1
            end = min(end, len(data) - 1)
            if start >= len(data) or start > end:
                raise _Reply(
                    416,
                    f"range {rng} not satisfiable for {len(data)} bytes",
                    headers={"Content-Range": f"bytes */{len(data)}"},
                )
            status, body = 206, data[start : end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        fault = self._fault
        if fault is not None and fault.kind == "truncate" and self._method == "GET" and len(body) > 1:
            cut = body[: len(body) // 2]
            if fault.mode == "short":
                if "Content-Range" in headers:
                    headers["Content-Range"] = f"bytes {start}-{start + len(cut) - 1}/{len(data)}"
                return self._send(status, cut, headers, content_type="application/octet-stream")
            # Full length announced, half sent, then the server hangs up.
            self._send(status, b"", headers, content_type="application/octet-stream", length=len(body))
            self.wfile.write(cut)
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(status, body, headers, content_type="application/octet-stream")
