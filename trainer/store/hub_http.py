"""What the Hub store asks of huggingface_hub's HTTP layer directly: a time bound on every request and every
transfer, the token sent only to the store's own host, every wait the server asks for capped, and the Hub's
LFS-files endpoints.

The hooks are installed into the session factory the client uses (``configure_http_backend`` on 0.x,
``set_client_factory`` on 1.x/2.x), so they see every request the client sends, whichever call sends it; they are
process-wide, like the client's session, and read their limits from here at each request (the latest
:func:`bound_requests` sets them). Requests through ``hf_xet`` (its own HTTP stack, in Rust) are outside them.

Timeouts. The client's shared HTTP session has no timeout, on every release from 0.26 through 2.4: ``requests``
(0.x) waits forever by default, and 1.x/2.x build their ``httpx`` / ``httpx2`` client with ``timeout=None``; several
API calls pass ``timeout=None`` explicitly too. A commit whose answer never comes then waits forever, and the
lost-answer path (the commit settled by reading the history back) never runs. Every request waits at most the
given seconds to connect and for each read: a timeout the library gives is kept when it is shorter. Every body
sent or received is a transfer with a time limit from its size (trainer/store/hub_transfer.py).

The token. The client sends the token to whatever URL an answer names: the next page of a listing (the ``Link``
header) and an LFS ``verify`` action, on any host (redirects are stripped by the HTTP stacks themselves). Here the
``Authorization`` header leaves every request whose scheme, host and port are not those of an endpoint a store was
opened on; the first such request to each host is logged.

Waits. huggingface_hub 1.x/2.x sleep a ``Retry-After`` (or a ``RateLimit`` reset) in full, however long; an HTTP
date they do not read at all. Every answer's ``Retry-After`` is rewritten to whole seconds (a date parsed) and cut,
with any ``RateLimit`` reset, to ``SPECPROBE_HUB_MAX_WAIT_S``.

LFS files. ``HfApi.list_lfs_files`` / ``permanently_delete_lfs_files`` appeared in huggingface_hub 0.30; the
endpoints behind them (``GET /api/{type}s/{id}/lfs-files``, ``POST .../lfs-files/batch``) are the Hub's own, so
:func:`lfs_file_oids` and :func:`delete_lfs_objects` call them through the client's session on every release.
"""

from __future__ import annotations

import email.utils
import logging
import math
import re
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urlsplit

import huggingface_hub.utils as hf_utils

from trainer.store.hub_settings import Timeouts
from trainer.store.hub_transfer import Transfer, scoped_transfer

__all__ = [
    "allow_token_host",
    "bound_requests",
    "lfs_file_oids",
    "delete_lfs_objects",
    "origin",
    "parse_retry_after",
    "token_hosts",
]

log = logging.getLogger("trainer.hub")
_lock = threading.Lock()
_bound = Timeouts()  # read at each request: a later bound_requests() applies to sessions made before it
_max_wait_s = 300.0
_token_origins: set[tuple[str, str, int]] = set()
_withheld: set[tuple[str, str, int]] = set()  # hosts already logged as denied the token
_installed = False
_RATELIMIT_RESET = re.compile(r"(\bt\s*=\s*)(\d+)")


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL, the port made explicit."""
    parts = urlsplit(str(url))
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or (443 if scheme == "https" else 80)


def _show(o: tuple[str, str, int]) -> str:
    return f"{o[0]}://{o[1]}:{o[2]}"


def token_hosts() -> list[str]:
    """The endpoints the token may go to, as scheme://host:port."""
    return sorted(_show(o) for o in _token_origins)


def _token_allowed(url: Any) -> bool:
    o = origin(str(url))
    if not _token_origins or o in _token_origins:
        return True
    if o not in _withheld:
        _withheld.add(o)
        log.warning(
            "hub: not sending the token to %s (a URL an answer of the Hub named: a listing's next page, an LFS "
            "verify action); it goes only to the store's endpoint %s",
            _show(o),
            ", ".join(token_hosts()),
        )
    return False


def parse_retry_after(value: Any, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` value asks for: a number of seconds, or an HTTP date (seconds from ``now``);
    None when it is neither."""
    text = str(value).strip() if value is not None else ""
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None or when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _cap_waits(headers: Any) -> None:
    """Rewrite an answer's Retry-After to whole seconds no longer than the cap, and cut a RateLimit reset to it."""
    raw = headers.get("Retry-After")
    if raw is not None:
        seconds = parse_retry_after(raw)
        if seconds is not None:  # one that is neither seconds nor a date is left to the client's own backoff
            headers["Retry-After"] = str(math.ceil(min(_max_wait_s, seconds)))
    limit = headers.get("RateLimit")
    if limit is not None:
        cap = int(_max_wait_s)
        headers["RateLimit"] = _RATELIMIT_RESET.sub(lambda m: f"{m.group(1)}{min(int(m.group(2)), cap)}", limit)


def _label(method: str, url: Any) -> str:
    # Host and path only: a presigned URL carries its signature in the query, a proxy URL its password in userinfo.
    return f"{method} {_show(origin(str(url)))}{urlsplit(str(url)).path}"


def _length(headers: Any) -> int | None:
    try:
        return int(headers.get("Content-Length"))
    except (TypeError, ValueError):
        return None


def _answer_transfer(method: str, url: Any, code: int, headers: Any) -> Transfer | None:
    """The transfer an answer's body counts into: the thread's download when it carries the file, else its own."""
    if method.upper() == "HEAD":
        return None
    scoped = scoped_transfer()
    if scoped is not None and method.upper() == "GET" and code in (200, 206):
        scoped.begin()
        return scoped
    return Transfer(_label(method, url), _length(headers), _bound)


# ---------------------------------------------------------------------------------------------- requests (0.x)
def _tighter(given: Any, ours: float) -> float:
    """The library's own timeout when it is a shorter one, else ours (None, 0 or inf mean "no bound")."""
    if isinstance(given, (int, float)) and not isinstance(given, bool) and 0 < given < ours and math.isfinite(given):
        return float(given)
    return ours


def _requests_timeout(given: Any) -> Any:
    """A ``requests`` timeout (None, seconds, or (connect, read)) bounded by the current limits."""
    t = _bound
    if isinstance(given, tuple) and len(given) == 2:
        return (_tighter(given[0], t.connect_s), _tighter(given[1], t.read_s))
    if given is None or isinstance(given, (int, float)):
        return (_tighter(given, t.connect_s), _tighter(given, t.read_s))
    return given  # an urllib3 Timeout object: the caller chose it with care


class _CountedRaw:
    """A ``requests`` response's raw stream whose reads count into a Transfer."""

    def __init__(self, raw: Any, transfer: Transfer) -> None:
        self._raw, self._transfer = raw, transfer

    def stream(self, amt: int | None = 1 << 16, decode_content: bool | None = None) -> Iterator[bytes]:
        """The body in pieces as they arrive: urllib3's own stream() blocks until ``amt`` bytes (huggingface_hub
        asks for 10 MB at a time), so a trickle would be seen only once a whole piece came."""
        read1 = getattr(self._raw, "read1", None)  # urllib3 2.x
        if read1 is None:
            yield from self._transfer.chunks(self._raw.stream(amt, decode_content=decode_content))
            return
        while data := read1(amt, decode_content=decode_content):
            self._transfer.add(len(data))
            yield data

    def read(self, *args: Any, **kwargs: Any) -> bytes:
        data = self._raw.read(*args, **kwargs)
        self._transfer.add(len(data or b""))
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _CountedBody:
    """A request body (a file object) whose reads count into a Transfer; its length is the original's."""

    def __init__(self, body: Any, size: int, transfer: Transfer) -> None:
        self._body, self._size, self._transfer = body, size, transfer

    def read(self, *args: Any) -> bytes:
        data = self._body.read(*args)
        self._transfer.add(len(data or b""))
        return data

    def __len__(self) -> int:
        return self._size


def _requests_answer(response: Any, *args: Any, **kwargs: Any) -> Any:
    _cap_waits(response.headers)
    transfer = _answer_transfer(response.request.method, response.url, response.status_code, response.headers)
    if transfer is not None and response.raw is not None:
        response.raw = _CountedRaw(response.raw, transfer)
    return response


def _bounded_session(make: Callable[[], Any]) -> Callable[[], Any]:
    """0.x: a session factory whose sessions bound every request (Session.get/post/... all go through request)."""
    from requests.utils import super_len

    def factory() -> Any:
        session = make()
        inner = session.request

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            kwargs["timeout"] = _requests_timeout(kwargs.get("timeout"))
            headers = kwargs.get("headers")
            if headers and not _token_allowed(url):
                kwargs["headers"] = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            body = kwargs.get("data")
            if body is not None and hasattr(body, "read"):
                size = super_len(body)
                kwargs["data"] = _CountedBody(body, size, Transfer(_label(method, url), size, _bound))
            return inner(method, url, *args, **kwargs)

        session.request = request
        session.hooks["response"].append(_requests_answer)
        return session

    return factory


# ------------------------------------------------------------------------------------------ httpx (1.x / 2.x)
_stream_classes: dict[str, type] = {}


def _counted_stream(inner: Any, transfer: Transfer) -> Any:
    """``inner`` (a SyncByteStream of httpx or httpx2) whose chunks count into ``transfer``; the same base class, which
    the HTTP stack checks for."""
    module = type(inner).__module__.split(".")[0]
    cls = _stream_classes.get(module)
    if cls is None:
        base = sys.modules[module].SyncByteStream

        def __iter__(self: Any) -> Iterator[bytes]:
            return self.transfer.chunks(self.inner)

        def close(self: Any) -> None:
            self.inner.close()

        cls = type("CountedStream", (base,), {"__iter__": __iter__, "close": close})
        _stream_classes[module] = cls
    stream = cls()
    stream.inner, stream.transfer = inner, transfer
    return stream


def _bound_httpx_request(request: Any) -> None:
    """1.x/2.x: a request hook, run just before the transport sends (and again for each redirect)."""
    t = _bound
    given = dict(request.extensions.get("timeout") or {})
    request.extensions["timeout"] = {
        "connect": _tighter(given.get("connect"), t.connect_s),
        "pool": _tighter(given.get("pool"), t.connect_s),
        "read": _tighter(given.get("read"), t.read_s),
        "write": _tighter(given.get("write"), t.read_s),
    }
    if "authorization" in request.headers and not _token_allowed(request.url):
        del request.headers["authorization"]
    size = _length(request.headers)
    if size and type(request.stream).__name__ != "CountedStream":
        request.stream = _counted_stream(request.stream, Transfer(_label(request.method, request.url), size, t))


def _bound_httpx_answer(response: Any) -> None:
    _cap_waits(response.headers)
    transfer = _answer_transfer(response.request.method, response.request.url, response.status_code, response.headers)
    if transfer is not None:
        response.stream = _counted_stream(response.stream, transfer)


def _bounded_client(make: Callable[[], Any]) -> Callable[[], Any]:
    def factory() -> Any:
        client = make()
        hooks = client.event_hooks
        hooks["request"] = [*hooks.get("request", []), _bound_httpx_request]
        hooks["response"] = [*hooks.get("response", []), _bound_httpx_answer]
        client.event_hooks = hooks
        return client

    return factory


def allow_token_host(endpoint: str) -> None:
    """Let the token go to ``endpoint``'s host too (an endpoint used without a store: a test of the client)."""
    with _lock:
        _token_origins.add(origin(endpoint))


def bound_requests(timeouts: Timeouts, *, max_wait_s: float | None = None, endpoint: str | None = None) -> None:
    """Every request huggingface_hub sends from now on waits at most ``timeouts``, every wait an answer asks for is
    cut to ``max_wait_s``, and the token goes to ``endpoint``'s host (and those of earlier calls) only."""
    global _bound, _max_wait_s, _installed
    with _lock:
        _bound = timeouts
        if max_wait_s is not None:
            _max_wait_s = max_wait_s
        if endpoint:
            _token_origins.add(origin(endpoint))
        if _installed:
            return
        import huggingface_hub.utils._http as http  # the factory in use: a user's own (a proxy) is kept

        if hasattr(hf_utils, "set_client_factory"):  # 1.x / 2.x: one shared httpx client
            current = getattr(http, "_GLOBAL_CLIENT_FACTORY", None) or http.default_client_factory
            hf_utils.set_client_factory(_bounded_client(current))
        else:  # 0.x: one requests.Session per thread
            current = getattr(http, "_GLOBAL_BACKEND_FACTORY", None) or http._default_backend_factory
            hf_utils.configure_http_backend(backend_factory=_bounded_session(current))
        _installed = True


def _lfs_url(endpoint: str, repo_type: str, repo_id: str) -> str:
    return f"{endpoint}/api/{repo_type}s/{repo_id}/lfs-files"


def lfs_file_oids(endpoint: str, repo_type: str, repo_id: str, token: str | None) -> list[str]:
    """The sha256 of every LFS object the repo holds (all pages)."""
    headers = hf_utils.build_hf_headers(token=token)
    return [str(item.get("fileOid")) for item in hf_utils.paginate(_lfs_url(endpoint, repo_type, repo_id), {}, headers)]


def delete_lfs_objects(endpoint: str, repo_type: str, repo_id: str, token: str | None, oids: Iterable[str]) -> None:
    """Permanently delete these LFS objects; history is not rewritten (commits that named them keep a dangling file)."""
    shas = sorted(set(oids))
    if not shas:
        return
    response = hf_utils.get_session().post(
        _lfs_url(endpoint, repo_type, repo_id) + "/batch",
        headers=hf_utils.build_hf_headers(token=token),
        json={"deletions": {"sha": shas, "rewriteHistory": False}},
    )
    hf_utils.hf_raise_for_status(response)
