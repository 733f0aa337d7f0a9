"""The engine's ``hub`` collector: the checkpoint store's state as one JSON document.

As a plugin (entry point ``specprobe.collectors: hub``): ``collect({"repo": URL}, context)``.
As a command: ``python -m trainer.collector --repo URL`` prints the same document on one line.
The document's fields are described in docs/DESIGN.md ("Hub-state document") and
:func:`hub_state` below; ``sha256_source`` says whether the per-file hashes are the local
store's manifest ("local-manifest") or the Hub's LFS metadata ("hub-lfs", null for non-LFS files): both
are hashes recorded when the file was written. ``hash_stored_bytes: true`` (``--hash-stored-bytes``)
also reads back every file the pointer names and hashes those bytes (``pointer_target_sha256_stored``):
the only way to see a stored object corrupted after its upload. It costs a download of the target.

The engine loads this module to find the collector, so it imports nothing heavy; without the trainer's
dependencies (trainer/deps.py) the collector raises :class:`MissingDependencies`, one line naming the
missing ones and the install command, and the command exits with 3 (2: a bad argument).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Sequence

from trainer.ckpt import Pointer, read_pointer
from trainer.deps import EXIT_MISSING, MissingDependencies, require_trainer_dependencies
from trainer.log import setup_logging
from trainer.store import FileInfo, LocalStore, RepoMissing, Store, open_store, redact_url

_CKPT_DIR = re.compile(r"^ckpt/checkpoint-(\d+)/")


def sha256_source(store: Store) -> str:
    """Where hub_state's per-file sha256 values come from (they are metadata, not a re-read)."""
    if isinstance(store, LocalStore):
        return "local-manifest"  # hashes recorded by the commit that wrote each file
    return "hub-lfs"  # the Hub's LFS sha256; null for files stored without LFS


def hub_state(store: Store, hash_stored_bytes: bool = False) -> dict[str, Any]:
    """The hub-state document of docs/DESIGN.md. Never raises: failures go into error/pointer_error.
    ``hash_stored_bytes``: also read back every file the pointer names and hash the bytes themselves
    (``pointer_target_sha256_stored``), where the listing only repeats the hash recorded at upload."""
    doc: dict[str, Any] = {
        "repo": None,
        "exists": False,
        "error": None,
        "files": [],
        "sha256": {},
        "sha256_source": None,
        "checkpoints": [],
        "has_final": False,
        "pointer": None,
        "pointer_error": None,
    }
    try:
        doc["repo"] = redact_url(store.url)
        doc["sha256_source"] = sha256_source(store)
        doc["exists"] = bool(store.exists())
        if not doc["exists"]:
            return doc
        listing = store.list_files()
    except RepoMissing:
        doc["exists"] = False
        return doc
    except Exception as e:  # a collector reports, it does not crash the run
        doc["error"] = redact_url(f"{type(e).__name__}: {e}")
        return doc
    doc["files"] = sorted(listing)
    doc["sha256"] = {p: listing[p].sha256 for p in doc["files"]}
    doc["checkpoints"] = sorted({int(m.group(1)) for p in listing if (m := _CKPT_DIR.match(p))})
    doc["has_final"] = any(p.startswith("final/") for p in listing)
    try:
        pointer = read_pointer(store)
        doc["pointer"] = pointer.to_json() if pointer else None
        if pointer:
            doc["pointer_target_sha256"] = _target_hashes(store, pointer, listing)
            if hash_stored_bytes:
                doc["pointer_target_sha256_stored"] = {
                    name: store.sha256(path) if (path := f"{pointer.path_in_repo}/{name}") in listing else None
                    for name in pointer.files
                }
    except Exception as e:
        doc["pointer_error"] = redact_url(f"{type(e).__name__}: {e}")
    return doc


def _target_hashes(store: Store, pointer: Pointer, listing: dict[str, FileInfo]) -> dict[str, str | None]:
    """What the store holds for each file the pointer names (None when absent), so a check can compare
    the pointer's recorded hashes with the store's. The listing's hash is used where the store records
    one (local manifest, Hub LFS); small Hub files without one are read back and hashed."""
    out: dict[str, str | None] = {}
    for name in pointer.files:
        path = f"{pointer.path_in_repo}/{name}"
        info = listing.get(path)
        out[name] = None if info is None else (info.sha256 or store.sha256(path))
    return out


def collect(args: dict, context: dict) -> dict[str, Any]:
    """Hub state of ``args["repo"]``. A missing or invalid URL is a spec error and raises ValueError, an
    environment without the trainer's dependencies MissingDependencies; everything that can go wrong with
    the store itself is reported inside the document."""
    repo = (args or {}).get("repo")
    if not isinstance(repo, str) or not repo:
        raise ValueError(f"collector 'hub' needs args.repo (a store URL), got {repo!r}")
    hash_bytes = (args or {}).get("hash_stored_bytes", False)
    if not isinstance(hash_bytes, bool):
        raise ValueError(f"collector 'hub': args.hash_stored_bytes must be true or false, got {hash_bytes!r}")
    unknown = sorted(set(args) - {"repo", "hash_stored_bytes"})
    if unknown:
        raise ValueError(f"collector 'hub': unknown args {', '.join(unknown)}; it takes repo, hash_stored_bytes")
    require_trainer_dependencies("the hub collector")
    return hub_state(open_store(repo), hash_stored_bytes=hash_bytes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.collector", description="Print a checkpoint store's state as one JSON line."
    )
    parser.add_argument("--repo", required=True, help="store URL: file:///root/owner/name, hf://owner/name, owner/name")
    parser.add_argument(
        "--hash-stored-bytes",
        action="store_true",
        help="read back the pointer's files and hash their bytes (pointer_target_sha256_stored)",
    )
    ns = parser.parse_args(argv)
    try:
        doc = collect({"repo": ns.repo, "hash_stored_bytes": ns.hash_stored_bytes}, {})
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MissingDependencies as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_MISSING
    print(json.dumps(doc, sort_keys=True, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    setup_logging(int(os.environ.get("RANK", "0")))  # a Hub retry's warning carries the time and the rank
    sys.exit(main())
