"""The engine's ``hub`` collector: the checkpoint store's state as one JSON document.

As a plugin (entry point ``specprobe.collectors: hub``): ``collect({"repo": URL}, context)``.
As a command: ``python -m trainer.collector --repo URL`` prints the same document on one line.
The document's fields are described in docs/DESIGN.md ("Hub-state document") and
:func:`trainer.checkpoint.hub_state`; ``sha256_source`` says whether the per-file hashes are the local
store's manifest ("local-manifest") or the Hub's LFS metadata ("hub-lfs", null for non-LFS files): both
are hashes recorded when the file was written. ``hash_stored_bytes: true`` (``--hash-stored-bytes``)
also reads back every file the pointer names and hashes those bytes (``pointer_target_sha256_stored``):
the only way to see a stored object corrupted after its upload. It costs a download of the target.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from trainer.checkpoint import hub_state
from trainer.log import setup_logging
from trainer.store_url import open_store


def collect(args: dict, context: dict) -> dict[str, Any]:
    """Hub state of ``args["repo"]``. A missing or invalid URL is a spec error and raises ValueError;
    everything that can go wrong with the store itself is reported inside the document."""
    repo = (args or {}).get("repo")
    if not isinstance(repo, str) or not repo:
        raise ValueError(f"collector 'hub' needs args.repo (a store URL), got {repo!r}")
    hash_bytes = (args or {}).get("hash_stored_bytes", False)
    if not isinstance(hash_bytes, bool):
        raise ValueError(f"collector 'hub': args.hash_stored_bytes must be true or false, got {hash_bytes!r}")
    unknown = sorted(set(args) - {"repo", "hash_stored_bytes"})
    if unknown:
        raise ValueError(f"collector 'hub': unknown args {', '.join(unknown)}; it takes repo, hash_stored_bytes")
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
    print(json.dumps(doc, sort_keys=True, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    setup_logging(int(os.environ.get("RANK", "0")))  # a Hub retry's warning carries the time and the rank
    sys.exit(main())
