"""Fixtures of the trainer's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.store import LocalStore
from trainer.store.url import open_store


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    """A fresh, empty local store repo (a test module may define its own)."""
    s = open_store(f"file://{tmp_path}/store/probe/ckpt-x")
    s.create()
    return s
