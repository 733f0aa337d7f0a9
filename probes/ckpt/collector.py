"""The engine's ``ckpt_compare`` collector: two checkpoints compared, as one JSON document (probes/ckpt/compare.py).

As a plugin (entry point ``specprobe.collectors: ckpt_compare``)::

    collect: {name: final_vs_reference, collector: ckpt_compare,
              args: {a: out/checkpoint-20, b: ref/checkpoint-20, format: hf_trainer, rtol: 0, atol: 0,
                     ignore: ["trainer_state.log_history.*"]}}

``a`` and ``b`` are paths (relative ones to the step's working directory); ``b`` is the reference. ``format``
defaults to ``auto``; ``default_ignore: false`` compares what the format ignores by default (listed in the document's
``default_ignore``); ``trust_pickle: true`` loads with full pickle the files ``weights_only=True`` refuses.
``hash_a: true`` adds ``a_sha256``, the sha256 of every file under ``a`` by its path relative to ``a`` (its name,
for a file): what ties the checkpoint compared to a copy of it elsewhere, such as the one a store holds. A missing
or unreadable checkpoint is the document's ``error`` (and ``a_sha256_error``, for a file that cannot be hashed); a
wrong argument is a spec error (ValueError).

The engine loads this module to find the collector, so it imports nothing heavy; without torch, safetensors or numpy
it raises :class:`MissingDependencies`, one line naming them and the install command.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Mapping
from typing import Any

DEPENDENCIES = ("torch", "safetensors", "numpy")
ARGS = ("a", "b", "format", "rtol", "atol", "ignore", "default_ignore", "trust_pickle", "hash_a")
CHUNK = 1 << 20


class MissingDependencies(RuntimeError):
    """The comparison's dependencies are not installed; the message is one line naming them and the fix."""


def require_dependencies() -> None:
    missing = [name for name in DEPENDENCIES if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependencies(
            f"the ckpt_compare collector needs pip install 'specprobe[probes]' (missing: {', '.join(missing)})"
        )


def _path(value: Any, key: str, context: Mapping[str, Any]) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"collector 'ckpt_compare': args.{key} must be a checkpoint path, got {value!r}")
    path = os.path.expanduser(value)
    if not os.path.isabs(path):
        path = os.path.join(str(context.get("cwd") or os.getcwd()), path)
    return path


def collect(args: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """The comparison document of ``args.a`` against the reference ``args.b``."""
    args = dict(args or {})
    unknown = sorted(set(args) - set(ARGS))
    if unknown:
        raise ValueError(f"collector 'ckpt_compare': unknown args {', '.join(unknown)}; it takes {', '.join(ARGS)}")
    a, b = _path(args.get("a"), "a", context), _path(args.get("b"), "b", context)
    for key in ("default_ignore", "trust_pickle", "hash_a"):
        if not isinstance(args.get(key, False), bool):
            raise ValueError(f"collector 'ckpt_compare': args.{key} must be true or false, got {args[key]!r}")
    fmt, rtol, atol, ignore = (
        args.get("format", "auto"),
        args.get("rtol", 0.0),
        args.get("atol", 0.0),
        args.get("ignore", []),
    )
    from probes.ckpt import check_options

    problem = check_options(fmt, rtol, atol, ignore)
    if problem:
        raise ValueError(f"collector 'ckpt_compare': args.{problem}")
    require_dependencies()
    from probes.ckpt import compare_paths

    doc = compare_paths(
        a,
        b,
        fmt=fmt,
        rtol=rtol,
        atol=atol,
        ignore=ignore,
        default_ignore=args.get("default_ignore", True),
        trust_pickle=args.get("trust_pickle", False),
    )
    if args.get("hash_a", False):
        try:
            doc["a_sha256"], doc["a_sha256_error"] = sha256_of_files(a), None
        except OSError as exc:
            doc["a_sha256"], doc["a_sha256_error"] = None, f"{exc.filename or a}: {exc.strerror or exc}"
    return doc


def sha256_of_files(path: str) -> dict[str, str]:
    """The sha256 of every regular file under the folder `path` by its path relative to it, or of the file `path`
    by its name. Links are not followed: what is hashed is what the folder holds."""
    if not os.path.isdir(path):
        return {os.path.basename(path): _sha256(path)}
    hashes = {}
    for folder, dirs, files in os.walk(path, onerror=_raise):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(folder, name)
            if not os.path.islink(full):
                hashes[os.path.relpath(full, path).replace(os.sep, "/")] = _sha256(full)
    return hashes


def _raise(exc: OSError) -> None:
    raise exc  # a folder under `path` that cannot be listed: its files would be missing from the hashes


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
