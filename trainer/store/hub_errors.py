"""How a failure of a huggingface_hub call reads, for the Hub store (trainer/store/hub.py): transient or final, and
what it says about the repo, the token's host, Xet and the proxy.

Transient failures (HTTP 408/429/500/502/503/504, connection resets, timeouts) are retried. In the upload phase of
a commit (preupload, LFS batch, the storage PUT, Xet), before anything is committed, a 400 (storage rejecting a cut
body), 409, 422 and a 403 from storage (an expired presigned URL) are retried too; 401, 404 and any other 4xx from
the commit endpoint itself are final. An HTTP status carried in the text of a transport error (hf_xet raises
``ConnectionError("... HTTP status client error (404 Not Found) ...")``) is classified like the status itself.
Connection/timeout errors are recognised for all three HTTP stacks (``requests`` on 0.x, ``httpx`` on 1.x,
``httpx2`` on 2.x).

What the Hub says about access. A gated repo answers ``GatedRepo`` (HTTP 403, or 401 without a token); a repo the
token cannot see, or a missing one, answers ``RepoNotFound`` with HTTP 401 (the Hub answers both alike) or 404.
huggingface_hub raises ``GatedRepoError``, a subclass of ``RepositoryNotFoundError``, for the first: :func:`access`
tells the three apart and keeps the Hub's own words (``X-Error-Message``).
"""

from __future__ import annotations

import os
import re
import urllib.request
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit

from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

from trainer.store.hub_http import origin, parse_retry_after
from trainer.store.protocol import redact_url

__all__ = [
    "TRANSIENT_STATUS",
    "TRANSPORT_ERRORS",
    "Transient",
    "Access",
    "access",
    "chain",
    "status",
    "status_anywhere",
    "transient",
    "xet_failure",
    "foreign_request",
    "proxy_for",
]

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# 4xx answers to the upload phase of a commit that a new try can change (nothing was committed): a cut or
# rejected body (400), a presigned storage URL that expired (403, storage only), a conflict (409, 422).
UPLOAD_RETRY_STATUS = frozenset({400, 403, 409, 422})
_COMMIT_URL = re.compile(r"/api/(?:models|datasets|spaces)/[^/]+/[^/]+/commit/")
_API_URL = re.compile(r"/api/")
_XET_URL = re.compile(r"/xet-(?:read|write)-token/")
# How an HTTP status reads inside the text of a transport error (hf_xet's reqwest errors, httpx, requests).
_TEXT_STATUS = (
    re.compile(r"status (?:client |server )?error \((\d{3})\b"),
    re.compile(r"\b(\d{3}) (?:Client|Server) Error\b"),
    re.compile(r"\bstatus(?: code)?\s*[=:]\s*(\d{3})\b"),
)
_TEXT_URL = re.compile(r"(?:domain|url|URL):\s*(\S+)")


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


class Transient(Exception):
    """A failure worth retrying (``retry_after`` from a 429/503 answer, in seconds)."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.reason, self.retry_after = reason, retry_after


def chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every cause and context under it, outermost first, each once."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__]
    return seen


def status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return int(code) if isinstance(code, int) else None


def _headers(exc: BaseException) -> Mapping[str, str]:
    headers = getattr(getattr(exc, "response", None), "headers", None)
    return headers if hasattr(headers, "get") else {}


def retry_after(exc: BaseException) -> float | None:
    """The wait an answer asked for: ``Retry-After`` in seconds or as an HTTP date."""
    return parse_retry_after(_headers(exc).get("Retry-After"))


def request_url(exc: BaseException) -> str:
    """The URL of the request that failed, from the error's response (or its text); "" when unknown."""
    for holder in (getattr(exc, "response", None), exc):
        try:
            url = getattr(getattr(holder, "request", None), "url", None)  # httpx raises if unset
        except RuntimeError:
            url = None
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


def status_anywhere(exc: BaseException, code: int) -> bool:
    return any(
        status(e) == code
        or (isinstance(e, TRANSPORT_ERRORS) and _text_status(e) == code)
        or type(e).__name__ == "XetAuthenticationError"
        and code == 401
        for e in chain(exc)
    )


def _by_status(code: int, url: str, *, uploading: bool, wait: float | None) -> Transient | None:
    if code in TRANSIENT_STATUS:
        return Transient(f"HTTP {code}", wait)
    # Upload phase: the failing request is not the commit itself, so nothing was committed. A 403 from the
    # Hub API is a permission answer; from storage it is typically an expired presigned URL.
    if (
        uploading
        and code in UPLOAD_RETRY_STATUS
        and not _COMMIT_URL.search(url)
        and not (code == 403 and _API_URL.search(url))
    ):
        return Transient(f"HTTP {code} during the upload, before anything was committed")
    return None  # a definite answer (4xx): not transient


def transient(exc: BaseException, *, uploading: bool = False) -> Transient | None:
    """Whether ``exc`` (or anything it wraps, e.g. the client's "Error while uploading") is transient.
    ``uploading``: ``exc`` came out of a commit call, whose upload phase is retried on more 4xx answers."""
    from huggingface_hub.utils import LocalEntryNotFoundError

    for e in chain(exc):
        code = status(e)
        if code is not None:  # an HTTP answer (HfHubHTTPError, or the HTTP stack's own status error)
            return _by_status(code, request_url(e), uploading=uploading, wait=retry_after(e))
        if isinstance(e, LocalEntryNotFoundError):
            return Transient("the Hub could not be reached")
        if isinstance(e, TRANSPORT_ERRORS):
            code = _text_status(e)
            if code is not None and code >= 400:
                return _by_status(code, request_url(e), uploading=uploading, wait=None)
            first = (str(e).strip().splitlines() or [""])[0][:300]
            return Transient(f"{type(e).__name__}: {first}" if first else type(e).__name__)
    return None


@dataclass(frozen=True)
class Access:
    """What the Hub answered about access to a repo: ``kind`` gated | hidden (401: private to this token, or
    missing) | missing (404), the HTTP status and the Hub's own words."""

    kind: str
    status: int | None
    hub_says: str


def _hub_says(exc: BaseException) -> str:
    text = (getattr(exc, "server_message", None) or _headers(exc).get("X-Error-Message") or "").strip()
    return text.splitlines()[0] if text else ""


def access(exc: BaseException) -> Access | None:
    """The Hub's answer about access to the repo, if the first HTTP answer in ``exc``'s chain is one (module
    docstring). Only the first: a client that follows a refusal with a look of its own (``create_repo`` reading the
    repo after a 401) chains an answer about another request under it."""
    e = next((x for x in chain(exc) if status(x) is not None or isinstance(x, RepositoryNotFoundError)), None)
    if isinstance(e, GatedRepoError):
        return Access("gated", status(e), _hub_says(e))
    if isinstance(e, RepositoryNotFoundError):
        return Access("hidden" if status(e) == 401 else "missing", status(e), _hub_says(e))
    return None


def xet_failure(exc: BaseException) -> str | None:
    """What failed, when ``exc`` is a failure of Xet storage (its token endpoint answering an error, or hf_xet's
    own transfer); None otherwise."""
    for e in chain(exc):
        named = type(e).__module__.startswith("hf_xet") or type(e).__name__.startswith("Xet")
        if named or _XET_URL.search(request_url(e)) or _XET_URL.search(str(e)):
            first = (str(e).strip().splitlines() or [""])[0][:300]
            return f"{type(e).__name__}: {first}" if first else type(e).__name__
    return None


def foreign_request(exc: BaseException, endpoint: str) -> tuple[str, int | None] | None:
    """(scheme://host:port, HTTP status) of the failed request when it went to another host than ``endpoint``'s
    (sent there without the token: trainer/store/hub_http.py); None when it did not."""
    home = origin(endpoint)
    for e in chain(exc):
        url = request_url(e)
        if url.startswith(("http://", "https://")) and origin(url) != home:
            o = origin(url)
            return f"{o[0]}://{o[1]}:{o[2]}", status(e)
    return None


def proxy_for(endpoint: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The proxy requests to ``endpoint`` go through, as ``URL (from VARIABLE)`` with any credentials masked; None
    when none applies (unset, or the host is in NO_PROXY)."""
    env = os.environ if environ is None else environ
    parts = urlsplit(endpoint)
    scheme = parts.scheme.lower() or "https"
    no_proxy = env.get("no_proxy") or env.get("NO_PROXY") or ""
    if no_proxy and urllib.request.proxy_bypass_environment(parts.netloc, {"no": no_proxy}):
        return None
    for var in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY"):
        value = (env.get(var) or "").strip()
        if value:
            return f"{redact_url(value)} (from {var})"
    return None
