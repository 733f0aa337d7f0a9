"""The data: a token mix on disk, and the batches a session draws from it.

- ``shards``  the mix's manifest and shards, checked before use; each batch a pure function of (seed, step, rank, micro)
- ``mix``     ``python -m trainer.data.mix build|publish|fetch``: make a mix, put it in a store, fetch it back

The names below are the ones callers use, all from ``shards``, imported on first use: ``python -m
trainer.data.mix`` runs this face first, and a face that imported numpy and torch at once would end a core-only
install's command on their import traceback before the command could say what is missing (trainer/deps.py).
``mix`` is left out because it is a command: a package that imported it would have it loaded already when
``python -m trainer.data.mix`` runs it as ``__main__`` (runpy warns, and the module then exists twice).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.data.shards import DataError, Mix, load_mix, mix_hash, read_manifest, train_batch, val_batches

__all__ = ["DataError", "Mix", "load_mix", "mix_hash", "read_manifest", "train_batch", "val_batches"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("trainer.data.shards"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
