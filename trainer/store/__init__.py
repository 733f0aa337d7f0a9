"""The checkpoint store: one protocol, two backends, the URL that picks one, and the lease over a store.

- ``protocol``  the :class:`Store` protocol, its errors, :class:`FileInfo`, ``sha256_file``, ``redact_url``
- ``local``     :class:`LocalStore` (``file://``): a directory repo with atomic, compare-and-swap commits
- ``hub``       ``HubStore`` (``hf://``): a Hugging Face Hub repo over ``huggingface_hub``
- ``url``       the URL forms and :func:`open_store`, the one place that picks a backend
- ``lease``     one writer per store: ``lease.json`` claimed, renewed and released by compare-and-swap

The names below are the ones callers use. ``HubStore`` is not among them: importing it loads
``huggingface_hub``, which a local store never needs (``open_store`` imports it for an ``hf://`` URL only).
"""

from __future__ import annotations

from trainer.store.local import META_DIR, LocalStore
from trainer.store.protocol import (
    Conflict,
    EntryMissing,
    FileInfo,
    MetadataMissing,
    NotRegularFile,
    RepoMissing,
    Store,
    StoreError,
    StoreUnavailable,
    file_kind,
    file_of_bytes,
    open_regular,
    redact_url,
    sha256_file,
)
from trainer.store.url import open_store, parse_store_url

__all__ = [
    "Conflict",
    "EntryMissing",
    "FileInfo",
    "LocalStore",
    "META_DIR",
    "MetadataMissing",
    "NotRegularFile",
    "RepoMissing",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "file_kind",
    "file_of_bytes",
    "open_regular",
    "open_store",
    "parse_store_url",
    "redact_url",
    "sha256_file",
]
