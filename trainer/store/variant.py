"""A byte-different copy of a file that reads back the same: the way past a corrupt stored object the store cannot
replace.

A store that keeps objects by their content (the Hub: LFS objects by sha256, git blobs by their id) deduplicates
an upload onto the object it already holds. When that object is corrupt and cannot be purged (a Hub without the
LFS-files endpoints; a regular file's git blob, which no API rewrites), every later push of the same bytes lands
on the same corrupt object, and a trainer that retrains the same steps deterministically pushes the same bytes
every session. A copy whose bytes differ is stored as a new object; each form below changes only what its format
defines as meaningless, so every reader gets the same content back:

- ``.json``: whitespace after the document (JSON allows any);
- ``.safetensors``: 8 more spaces of header padding (the format pads its JSON header with spaces; the header
  length grows by 8, the tensors and their offsets do not move);
- ``.pt`` (a zip archive, ``torch.save``'s format): the archive comment (the end-of-central-directory record's
  comment field, which readers skip).

``n`` numbers the copy, so a second copy differs from the first.
"""

from __future__ import annotations

import struct
from pathlib import Path

__all__ = ["VARIANT_SUFFIXES", "write_variant"]

VARIANT_SUFFIXES = (".json", ".safetensors", ".pt")
_EOCD = b"PK\x05\x06"
_EOCD_LEN = 22


def _json(data: bytes, n: int) -> bytes:
    body = data.rstrip(b" \t\r\n")
    return body + b" " * n + b"\n"


def _safetensors(data: bytes, n: int) -> bytes:
    if len(data) < 8:
        raise ValueError("shorter than a safetensors header length")
    size = struct.unpack("<Q", data[:8])[0]
    if not 2 <= size <= len(data) - 8 or data[8:9] != b"{":
        raise ValueError(f"its header length {size} does not fit the file")
    pad = 8 * n
    return struct.pack("<Q", size + pad) + data[8 : 8 + size] + b" " * pad + data[8 + size :]


def _zip(data: bytes, n: int) -> bytes:
    at = data.rfind(_EOCD, max(0, len(data) - _EOCD_LEN - 0xFFFF))
    if at < 0 or at + _EOCD_LEN > len(data):
        raise ValueError("no zip end-of-central-directory record")
    (old,) = struct.unpack("<H", data[at + 20 : at + 22])
    if at + _EOCD_LEN + old != len(data):
        raise ValueError("its zip end record is not at the end of the file")
    comment = f"specprobe copy {n}".encode()
    return data[: at + 20] + struct.pack("<H", len(comment)) + comment


def write_variant(src: Path, dest: Path, n: int = 1) -> None:
    """Write to ``dest`` a copy of ``src`` whose bytes differ and whose content reads back the same (module
    docstring). ValueError naming the file when its form is not one of VARIANT_SUFFIXES or it is not well formed."""
    src, dest = Path(src), Path(dest)
    forms = {".json": _json, ".safetensors": _safetensors, ".pt": _zip}
    form = forms.get(src.suffix)
    if form is None:
        raise ValueError(f"{src.name}: no byte-different copy is known for a {src.suffix or 'suffix-less'} file")
    try:
        out = form(src.read_bytes(), max(1, n))
    except ValueError as e:
        raise ValueError(f"{src.name}: not a well-formed {src.suffix} file: {e}") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(out)
