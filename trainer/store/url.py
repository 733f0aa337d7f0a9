"""Store URLs: which store a URL names, and `open_store(url)`, the one place that picks the backend.

URL forms:

- ``file:///abs/root/owner/name``  local store, absolute root ``/abs/root``; repo dir ``/abs/root/owner/name``
- ``file://rel/root/owner/name``   local store, root relative to the current directory
  (the last two path components are always the repo id ``owner/name``; everything before them is the root)
- ``hf://owner/name``              Hub dataset repo
- ``hf://datasets/owner/name``     Hub dataset repo (explicit)
- ``hf://models/owner/name``       Hub model repo
- ``owner/name``                   bare repo id = Hub dataset repo

A local URL may end in ``?link_mb_s=R`` (trainer/store/local.py says what it does). The Hub endpoint comes
from ``HF_ENDPOINT``; the token from the ``token`` argument or else ``huggingface_hub.get_token()`` (HF_TOKEN or a logged-in
user's token), and is never printed.

This module sits above both backends (trainer/store/local.py, trainer/store/hub.py), which never import it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from trainer.store.hub_settings import HubSettings
from trainer.store.local import META_DIR, LocalStore
from trainer.store.protocol import Store, redact_url

__all__ = ["ACCEPTED_FORMS", "StoreUrl", "parse_store_url", "open_store"]

ACCEPTED_FORMS = (
    "file:///abs/root/owner/name, file://rel/root/owner/name, hf://owner/name, "
    "hf://datasets/owner/name, hf://models/owner/name, owner/name"
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class StoreUrl:
    kind: str  # "file" | "hf"
    repo_id: str  # owner/name
    root: Path | None = None  # file: the store root (absolute)
    repo_type: str = "dataset"  # hf: dataset | model
    link_mb_s: float | None = None  # file: emulated upload rate (see the module docstring)


def _valid_repo_id(owner: str, name: str) -> bool:
    return all(_NAME.match(p) and ".." not in p for p in (owner, name))


def _bad_url(url: str, why: str) -> ValueError:
    return ValueError(f"invalid store URL {redact_url(url)!r}: {why}; accepted forms: {ACCEPTED_FORMS}")


def parse_store_url(url: str) -> StoreUrl:
    """Parse one of the URL forms in the module docstring; ValueError naming the URL otherwise."""
    if not isinstance(url, str) or not url.strip():
        raise _bad_url(str(url), "empty")
    url = url.strip()
    if url.startswith("file://"):
        rest, _, query = url[len("file://") :].partition("?")
        link_mb_s = _parse_link(url, query)
        parts = [p for p in rest.split("/") if p]
        if len(parts) < 2:
            raise _bad_url(url, "a file:// URL needs at least owner/name after the root")
        owner, name = parts[-2], parts[-1]
        if not _valid_repo_id(owner, name):
            raise _bad_url(url, f"repo id {owner}/{name} must be two names of letters, digits, '.', '_', '-'")
        root_parts = parts[:-2]
        if ".." in root_parts or META_DIR in root_parts:
            raise _bad_url(url, "the root may not contain '..' or '.specprobe'")
        root = Path("/" + "/".join(root_parts)) if rest.startswith("/") else Path.cwd().joinpath(*root_parts)
        return StoreUrl("file", f"{owner}/{name}", root=root, link_mb_s=link_mb_s)
    if url.startswith("hf://"):
        parts = url[len("hf://") :].strip("/").split("/")
        repo_type = "dataset"
        if len(parts) == 3 and parts[0] in ("datasets", "models"):
            repo_type = "dataset" if parts[0] == "datasets" else "model"
            parts = parts[1:]
        if len(parts) != 2 or not _valid_repo_id(*parts):
            raise _bad_url(url, "an hf:// URL is hf://[datasets/|models/]owner/name")
        return StoreUrl("hf", "/".join(parts), repo_type=repo_type)
    if "://" in url:
        raise _bad_url(url, "unknown scheme")
    parts = url.split("/")
    if len(parts) != 2 or not _valid_repo_id(*parts):
        raise _bad_url(url, "a bare repo id is exactly owner/name")
    return StoreUrl("hf", url, repo_type="dataset")


def _parse_link(url: str, query: str) -> float | None:
    if not query:
        return None
    key, _, value = query.partition("=")
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if key != "link_mb_s" or "&" in value or not rate > 0:
        raise _bad_url(url, "the only query a file:// URL takes is ?link_mb_s=<positive MB/s>")
    return rate


def open_store(url: str, token: str | None = None, hub: HubSettings | None = None) -> Store:
    """The store for ``url`` (forms in the module docstring). ValueError naming the URL for a bad one. ``hub``:
    the Hub client's retries and timeouts as the caller read them once (default: read from the environment now)."""
    parsed = parse_store_url(url)
    if parsed.kind == "file":
        assert parsed.root is not None
        return LocalStore(parsed.root, parsed.repo_id, url=url, link_mb_s=parsed.link_mb_s)
    # Imported here, not above: a local store must not pay for (or need) huggingface_hub's network stack.
    # Not a hidden cycle: trainer.store.hub imports trainer.store.protocol only, never this module.
    from trainer.store.hub import HubStore

    return HubStore(
        parsed.repo_id,
        parsed.repo_type,
        endpoint=os.environ.get("HF_ENDPOINT") or None,
        token=token,
        retry=hub.retry if hub is not None else None,
        timeouts=hub.timeouts if hub is not None else None,
    )
