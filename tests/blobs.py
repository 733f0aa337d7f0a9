"""Small files for store tests: write bytes under a temp dir, hash them."""

from __future__ import annotations

import hashlib
from pathlib import Path


def write(tmp: Path, name: str, data: bytes) -> Path:
    p = tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
