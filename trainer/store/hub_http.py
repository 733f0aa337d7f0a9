"""What the Hub store asks of huggingface_hub's HTTP layer directly: a time bound on every request, and the Hub's
LFS-files endpoints.

Timeouts. The client's shared HTTP session has no timeout, on every release from 0.26 through 2.4: ``requests``
(0.x) waits forever by default, and 1.x/2.x build their ``httpx`` / ``httpx2`` client with ``timeout=None``; several
API calls pass ``timeout=None`` explicitly too. A commit whose answer never comes then waits forever, and the
lost-answer path (the commit settled by reading the history back) never runs. :func:`bound_requests` wraps the
session factory the client uses (``configure_http_backend`` on 0.x, ``set_client_factory`` on 1.x/2.x) so that
every request it sends waits at most the given seconds to connect and for each read: a timeout the library gives
is kept when it is shorter. The bound is process-wide, like the client's session; the latest call sets it.
Transfers through ``hf_xet`` (its own HTTP stack, in Rust) are outside it.

LFS files. ``HfApi.list_lfs_files`` / ``permanently_delete_lfs_files`` appeared in huggingface_hub 0.30; the
endpoints behind them (``GET /api/{type}s/{id}/lfs-files``, ``POST .../lfs-files/batch``) are the Hub's own, so
:func:`lfs_file_oids` and :func:`delete_lfs_objects` call them through the client's session on every release.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Iterable

import huggingface_hub.utils as hf_utils

from trainer.store.hub_settings import Timeouts

__all__ = ["bound_requests", "lfs_file_oids", "delete_lfs_objects"]

_lock = threading.Lock()
_bound = Timeouts()  # read at each request: a later bound_requests() applies to sessions made before it
_installed = False


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


def _bounded_session(make: Callable[[], Any]) -> Callable[[], Any]:
    """0.x: a session factory whose sessions bound every request (Session.get/post/... all go through request)."""

    def factory() -> Any:
        session = make()
        inner = session.request

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            kwargs["timeout"] = _requests_timeout(kwargs.get("timeout"))
            return inner(method, url, *args, **kwargs)

        session.request = request
        return session

    return factory


def _bound_httpx_request(request: Any) -> None:
    """1.x/2.x: a request hook, run just before the transport sends, which reads the timeouts from here."""
    t = _bound
    given = dict(request.extensions.get("timeout") or {})
    request.extensions["timeout"] = {
        "connect": _tighter(given.get("connect"), t.connect_s),
        "pool": _tighter(given.get("pool"), t.connect_s),
        "read": _tighter(given.get("read"), t.read_s),
        "write": _tighter(given.get("write"), t.read_s),
    }


def _bounded_client(make: Callable[[], Any]) -> Callable[[], Any]:
    def factory() -> Any:
        client = make()
        hooks = client.event_hooks
        hooks["request"] = [*hooks.get("request", []), _bound_httpx_request]
        client.event_hooks = hooks
        return client

    return factory


def bound_requests(timeouts: Timeouts) -> None:
    """Every request huggingface_hub sends from now on waits at most ``timeouts`` (module docstring)."""
    global _bound, _installed
    with _lock:
        _bound = timeouts
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
