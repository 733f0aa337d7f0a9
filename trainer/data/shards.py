"""A token mix on disk, checked before use, and batches drawn from it as a pure function of position.

Layout of a mix root (written by `python -m trainer.data.mix build`):

    manifest.json            {"format": "specprobe-mix/1", "dtype": "uint16"|"uint32", "vocab_size": V,
                              "n_shards": N, "total_tokens": T,
                              "shards": [{"path": "train/shard-00000.bin", "tokens": n, "sha256": h}, ...],
                              "val": {"path": "val/val-00000.bin", "tokens": n, "sha256": h},
                              "source": {...how it was built...}}
    train/shard-*.bin        raw little-endian token ids, memory-mapped, read as one concatenated stream
    val/val-*.bin            the held-out split, same encoding

Training samples are the non-overlapping windows of seq_len+1 tokens of the train stream, visited in the
order of one seeded permutation. Sample k of a run is global index
`(((step-1)*accum + micro)*world_size + rank)*batch + b`, so a batch depends only on
(seed, step, rank, micro): a resumed run, a different rank, or a re-run reads exactly the same tokens,
and no window is read twice before the horizon.
"""

from __future__ import annotations

import hashlib
import json
import math
import stat
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import numpy as np
import torch
from torch import Tensor

from trainer.store import NotRegularFile, file_kind, open_regular, sha256_file

FORMAT = "specprobe-mix/1"
MANIFEST_MAX_BYTES = 64 << 20  # a manifest lists its shards: megabytes would be a million of them
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}  # explicit little-endian, on any host


class DataError(Exception):
    """A mix that cannot be trained on; the message names the manifest field or the shard."""


def _entry(where: str, e: Any) -> dict[str, Any]:
    """Check one {"path", "tokens", "sha256"} entry of the manifest."""
    if not isinstance(e, dict):
        raise DataError(f"manifest.json {where}: expected an object, got {type(e).__name__}")
    for key, kind in (("path", str), ("tokens", int), ("sha256", str)):
        if key not in e:
            raise DataError(f"manifest.json {where}: missing field {key!r}")
        if not isinstance(e[key], kind) or isinstance(e[key], bool):
            raise DataError(f"manifest.json {where}.{key}: expected {kind.__name__}, got {e[key]!r}")
    p = PurePosixPath(e["path"])
    # A manifest comes from a downloaded repo: it must not point outside the mix root.
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise DataError(f"manifest.json {where}.path {e['path']!r} must be a relative path inside the mix")
    if e["tokens"] < 0:
        raise DataError(f"manifest.json {where}.tokens is negative ({e['tokens']})")
    return e


def read_manifest(root: Path) -> dict[str, Any]:
    """Load and structurally validate `root/manifest.json` (no shard is opened)."""
    path = Path(root) / "manifest.json"
    try:
        with open_regular(path) as f:
            text = f.read(MANIFEST_MAX_BYTES + 1)
    except FileNotFoundError:
        raise DataError(f"{path}: no manifest.json in the mix root") from None
    except NotRegularFile as e:
        raise DataError(f"{e}: a mix's manifest.json must be one") from None
    if len(text) > MANIFEST_MAX_BYTES:
        raise DataError(f"{path}: more than {MANIFEST_MAX_BYTES:,} bytes, not a mix's manifest")
    return parse_manifest(text, where=str(path))


def parse_manifest(text: str | bytes, where: str = "manifest.json") -> dict[str, Any]:
    """Parse and validate a manifest's JSON text; `where` names its origin in errors."""
    try:
        m = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(m, dict):
        raise DataError(f"{where}: expected a JSON object")
    for key in ("format", "dtype", "vocab_size", "n_shards", "total_tokens", "shards", "val"):
        if key not in m:
            raise DataError(f"manifest.json: missing field {key!r}")
    if m["format"] != FORMAT:
        raise DataError(f"manifest.json format is {m['format']!r}, expected {FORMAT!r}")
    if m["dtype"] not in DTYPES:
        raise DataError(f"manifest.json dtype is {m['dtype']!r}, expected one of {sorted(DTYPES)}")
    for key in ("vocab_size", "n_shards", "total_tokens"):
        if not isinstance(m[key], int) or isinstance(m[key], bool) or m[key] < 0:
            raise DataError(f"manifest.json {key}: expected a non-negative integer, got {m[key]!r}")
    if m["vocab_size"] > np.iinfo(DTYPES[m["dtype"]]).max + 1:
        raise DataError(f"manifest.json vocab_size {m['vocab_size']} does not fit dtype {m['dtype']}")
    if not isinstance(m["shards"], list) or not m["shards"]:
        raise DataError("manifest.json shards: expected a non-empty list")
    shards = [_entry(f"shards[{i}]", e) for i, e in enumerate(m["shards"])]
    _entry("val", m["val"])
    if m["n_shards"] != len(shards):
        raise DataError(f"manifest.json n_shards is {m['n_shards']} but shards lists {len(shards)}")
    if m["total_tokens"] != sum(e["tokens"] for e in shards):
        raise DataError(
            f"manifest.json total_tokens is {m['total_tokens']} but the shards sum to "
            f"{sum(e['tokens'] for e in shards)}"
        )
    return m


def _entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [*manifest["shards"], manifest["val"]]


def mix_hash(manifest: dict[str, Any]) -> str:
    """The mix's identity: sha256 over canonical JSON of what decides the tokens a run reads and is validated
    on: the dtype, the vocab size, and each train shard's and the val split's token count and sha256, in their
    order. File names and ``source`` (how the mix was built) are left out: the same tokens under other names
    are the same mix, and two mixes of one shape (same vocab, tokens and shards, other documents) differ."""
    canon = {
        "dtype": manifest["dtype"],
        "vocab_size": manifest["vocab_size"],
        "shards": [[e["tokens"], e["sha256"]] for e in manifest["shards"]],
        "val": [manifest["val"]["tokens"], manifest["val"]["sha256"]],
    }
    return hashlib.sha256(json.dumps(canon, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def verify_files(root: Path, manifest: dict[str, Any], *, hashes: bool = True) -> None:
    """Every shard and the val split exist with the manifest's length and (if `hashes`) sha256."""
    itemsize = DTYPES[manifest["dtype"]].itemsize
    for e in _entries(manifest):
        path = Path(root) / e["path"]
        try:
            st = path.stat()
        except FileNotFoundError:
            raise DataError(f"{e['path']}: listed in manifest.json but missing under {root}") from None
        if not stat.S_ISREG(st.st_mode):
            raise DataError(f"{e['path']}: listed in manifest.json, but {path} is {file_kind(st.st_mode)}")
        size = st.st_size
        if size != e["tokens"] * itemsize:
            raise DataError(
                f"{e['path']}: {size} bytes = {size / itemsize:g} tokens of {manifest['dtype']}, "
                f"manifest.json says {e['tokens']} tokens"
            )
        if hashes and (got := sha256_file(path)) != e["sha256"]:
            raise DataError(f"{e['path']}: sha256 {got} does not match manifest.json {e['sha256']}")


def _memmap(root: Path, e: dict[str, Any], dtype: np.dtype) -> np.ndarray:
    if e["tokens"] == 0:  # np.memmap refuses an empty file
        return np.zeros(0, dtype=dtype)
    return np.memmap(Path(root) / e["path"], dtype=dtype, mode="r", shape=(e["tokens"],))


def _check_token_ids(e: dict[str, Any], tokens: np.ndarray, model_vocab: int) -> None:
    if tokens.size and (top := int(tokens.max())) >= model_vocab:
        at = int(np.argmax(tokens >= model_vocab))
        raise DataError(
            f"{e['path']}: token id {top} (first out-of-range id at position {at}) >= model vocab {model_vocab}"
        )


@dataclass
class Mix:
    root: Path
    manifest: dict[str, Any]
    sha256: str  # mix_hash(manifest): the mix in the run's identity (trainer/runconfig.py)
    vocab_size: int
    total_tokens: int
    n_samples: int
    seq_len: int = 0
    shards: list[np.ndarray] = field(default_factory=list, repr=False)
    val: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint16), repr=False)
    _perms: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def window(self) -> int:
        return self.seq_len + 1  # inputs and their shifted targets come from one window

    def permutation(self, seed: int) -> np.ndarray:
        """The run's order of train windows; computed once per seed."""
        if seed not in self._perms:
            self._perms[seed] = np.random.default_rng(seed).permutation(self.n_samples)
        return self._perms[seed]

    @cached_property
    def _shard_ends(self) -> np.ndarray:
        return np.cumsum([len(s) for s in self.shards])

    def read(self, start: int, n: int) -> np.ndarray:
        """Tokens [start, start+n) of the concatenated train shards (a window may straddle shards)."""
        ends = self._shard_ends
        out, i = [], int(np.searchsorted(ends, start, side="right"))
        offset = start - (int(ends[i - 1]) if i else 0)
        while n > 0:
            part = self.shards[i][offset : offset + n]
            out.append(part)
            n -= len(part)
            i, offset = i + 1, 0
        return np.concatenate(out) if len(out) > 1 else np.asarray(out[0])


def load_mix(root: Path, *, seq_len: int, model_vocab: int, need_samples: int, verify: bool = True) -> Mix:
    """Open a mix for a run that reads `need_samples` windows of seq_len+1 tokens.

    Always checks the manifest, the file lengths and that the mix's vocabulary fits the model and holds
    enough samples. `verify` adds every file's sha256 and a scan for token ids >= `model_vocab`.
    """
    root = Path(root)
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    m = read_manifest(root)
    if m["vocab_size"] > model_vocab:
        raise DataError(f"manifest.json vocab_size {m['vocab_size']} exceeds the model's vocab {model_vocab}")
    verify_files(root, m, hashes=verify)
    dtype = DTYPES[m["dtype"]]
    shards = [_memmap(root, e, dtype) for e in m["shards"]]
    val = _memmap(root, m["val"], dtype)
    if verify:
        for e, tokens in zip(_entries(m), [*shards, val]):
            _check_token_ids(e, tokens, model_vocab)
    n_samples = m["total_tokens"] // (seq_len + 1)
    if need_samples > n_samples:
        raise DataError(
            f"mix at {root}: the horizon needs {need_samples} samples of seq_len+1={seq_len + 1} tokens = "
            f"{need_samples * (seq_len + 1)} tokens, but the {m['n_shards']} train shards hold "
            f"{m['total_tokens']} tokens ({n_samples} samples)"
        )
    return Mix(
        root=root,
        manifest=m,
        sha256=mix_hash(m),
        vocab_size=m["vocab_size"],
        total_tokens=m["total_tokens"],
        n_samples=n_samples,
        seq_len=seq_len,
        shards=shards,
        val=val,
    )


def sample_indices(*, step: int, rank: int, micro: int, world_size: int, accum: int, batch: int) -> np.ndarray:
    """Positions in the run's permutation that (step, rank, micro) reads; step is 1-based."""
    if step < 1:
        raise ValueError(f"step is 1-based, got {step}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world_size {world_size}")
    if not 0 <= micro < accum:
        raise ValueError(f"micro {micro} outside accum {accum}")
    first = (((step - 1) * accum + micro) * world_size + rank) * batch
    return np.arange(first, first + batch)


def _to_xy(windows: np.ndarray) -> tuple[Tensor, Tensor]:
    t = torch.from_numpy(windows.astype(np.int64))  # (B, seq_len+1)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def train_batch(
    mix: Mix, *, seed: int, step: int, rank: int, micro: int, world_size: int, accum: int, batch: int
) -> tuple[Tensor, Tensor]:
    """(x, y), int64 (batch, seq_len): y is x shifted by one token. Pure in (seed, step, rank, micro)."""
    idx = sample_indices(step=step, rank=rank, micro=micro, world_size=world_size, accum=accum, batch=batch)
    if idx[-1] >= mix.n_samples:
        raise DataError(
            f"mix at {mix.root}: step {step} (rank {rank}, micro {micro}) needs sample "
            f"{idx[-1]}, but the mix holds {mix.n_samples} samples of {mix.window} tokens"
        )
    windows = mix.permutation(seed)[idx]
    return _to_xy(np.stack([mix.read(int(w) * mix.window, mix.window) for w in windows]))


def val_batches(mix: Mix, *, tokens: int, batch: int, rank: int, world_size: int) -> Iterator[tuple[Tensor, Tensor]]:
    """This rank's share of about `tokens` predicted tokens of the val split, in batches of `batch` windows.

    Every rank gets the same number of windows (the total is rounded down to a multiple of world_size),
    so ranks run the same number of forward passes and can all-reduce once at the end.
    """
    available = len(mix.val) // mix.window
    n = min(math.ceil(tokens / mix.seq_len), available)
    n -= n % world_size
    if n == 0:
        raise DataError(
            f"{mix.manifest['val']['path']}: {len(mix.val)} val tokens do not give each of "
            f"{world_size} ranks one window of {mix.window} tokens"
        )
    per_rank = n // world_size
    first = rank * per_rank
    for i in range(first, first + per_rank, batch):
        rows = range(i, min(i + batch, first + per_rank))
        yield _to_xy(np.stack([mix.val[w * mix.window : (w + 1) * mix.window] for w in rows]))
