"""A checkpoint's pieces for the checkpoint tests: a run config and its hash, the five files of a checkpoint
(small, sealed like the real ones), a recorder of the protocol's lines, and a push of a fake checkpoint.

Import as `from checkpoints import ...` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainer_helpers import IDENTITY, RUN_CONFIG

from trainer.ckpt.checkpointer import (
    CHECKPOINT_FILES,
    Checkpointer,
    Pointer,
    seal_trainer_state,
)
from trainer.runconfig import RunIdentity
from trainer.store import sha256_file
from trainer.store.lease import LEASE_PATH

CH = IDENTITY.hash
# Another run: the same but for its learning rate.
OTHER = RunIdentity({**RUN_CONFIG, "lr": 6e-4})


def fake_checkpoint(dir_: Path, step: int, tokens: int | None = None, *, size: int = 64) -> dict[str, str]:
    """The five checkpoint files with small, step-specific contents; trainer_state.json sealed like the real one."""
    dir_.mkdir(parents=True, exist_ok=True)
    for name in CHECKPOINT_FILES:
        if name != "trainer_state.json":
            (dir_ / name).write_bytes(f"{name} at step {step}\n".encode() + os.urandom(size))
    others = {n: sha256_file(dir_ / n) for n in CHECKPOINT_FILES if n != "trainer_state.json"}
    state = {"step": step, "tokens_consumed": step * 128 if tokens is None else tokens, "config_hash": CH}
    (dir_ / "trainer_state.json").write_text(json.dumps(seal_trainer_state(state, others), indent=1))
    return {name: sha256_file(dir_ / name) for name in CHECKPOINT_FILES}


class Recorder:
    """The protocol lines; the lease's own lines (``lease: ...``) apart."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.lease: list[str] = []

    def __call__(self, line: str) -> None:
        (self.lease if line.startswith("lease: ") else self.lines).append(line)


def content(store) -> list[str]:
    """The repo's files, without the writer's lease."""
    return sorted(p for p in store.list_files() if p != LEASE_PATH)


def push(ck: Checkpointer, tmp_path: Path, step: int, *, final: bool = False, tokens: int | None = None) -> Pointer:
    d = tmp_path / "local" / f"checkpoint-{step}{'-final' if final else ''}"
    tokens = step * 128 if tokens is None else tokens
    files = fake_checkpoint(d, step, tokens)
    return ck.push(step, d, files, tokens=tokens, config_hash=CH, final=final)
