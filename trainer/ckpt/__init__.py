"""The checkpoint side of a session: the protocol over the store, where a session starts, and what it saves.

- ``checkpointer``  the checkpoint protocol over a store, under its lease: push -> verify -> pointer -> prune
- ``scan``          the resume decision over a store (rank 0): which checkpoint a session starts from; ``fetch``
- ``load``          a fetched checkpoint folder checked file by file, then loaded into the session
- ``resume``        where a session starts across ranks: rank 0 decides, each host fetches, every rank loads
- ``session``       one session's checkpoints as the training loop sees them: ``due``, ``save``, ``wait``, ``close``
- ``snapshot``      rank 0's copy of the training state into host memory, blocking or async
- ``rng``           every random-number generator a rank uses, captured and restored

The names below are the ones callers use, from the protocol and the scan, which read and write a store without
torch. The session's modules (``load``, ``resume``, ``session``, ``snapshot``, ``rng``) are not among them: they
work on torch's tensors and generators, and all but ``rng`` import torch at once. Imported here, they would load
torch for every reader of a store, the engine's ``hub`` collector included, which must load where the trainer's
dependencies are not installed (trainer/collector.py). trainer/train.py imports each by its module's name.
"""

from __future__ import annotations

from trainer.ckpt.checkpointer import (
    CHECKPOINT_FILES,
    POINTER_PATH,
    Checkpointer,
    Pointer,
    read_pointer,
    seal_trainer_state,
    write_checkpoint_dir,
)
from trainer.ckpt.scan import ResumeRefused, ResumeScan, fetch

__all__ = [
    "CHECKPOINT_FILES",
    "POINTER_PATH",
    "Checkpointer",
    "Pointer",
    "ResumeRefused",
    "ResumeScan",
    "fetch",
    "read_pointer",
    "seal_trainer_state",
    "write_checkpoint_dir",
]
