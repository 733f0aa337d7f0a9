"""python -m trainer.data.mix -- build, publish and fetch the token mix that `trainer.train` reads.

A mix is a directory: `manifest.json`, `train/shard-NNNNN.bin` and `val/val-00000.bin` (raw little-endian
token ids; the format is described in `trainer/data/shards.py`).

    python -m trainer.data.mix build --out DIR --synthetic [--tokens N] [--val-tokens M] [--vocab V] [--seed S] [--shards K]
        A deterministic synthetic mix that a small model can learn: documents of DOC_LEN tokens ending in
        EOS (id 0), each a walk of a fixed random sparse Markov chain (every token has 4 likely successors,
        plus 5 % uniform noise), with fixed random 12-token phrases pasted in at random places. The best
        achievable loss is about 1.5-1.8 nats, far below ln(V). Same arguments, same bytes. Defaults:
        50,000,000 train tokens in 4 shards, 2,000,000 val tokens, vocab 49152, seed 0.

    python -m trainer.data.mix build --out DIR --text FILE... --tokenizer tokenizer.json [--eos-token T] [--val-tokens M] [--shards K]
        Tokenise text files with a local Hugging Face `tokenizers` file (needs `pip install tokenizers`).
        A plain file is one document; in a `.jsonl` file each line's "text" field is one. EOS follows every
        document; the last M tokens become the val split.

    python -m trainer.data.mix publish --from DIR --repo URL
        Verify the mix in DIR and put it in the store repo URL as ONE commit (creating the repo if missing,
        deleting files of an older mix). URL forms: see `trainer/store/url.py` (file://ROOT/owner/name, hf://...).

    python -m trainer.data.mix fetch --repo URL --out ROOT [--if-missing-build-synthetic [synthetic build options]]
        Download the mix into ROOT and verify every file's sha256 against the manifest, then print
        `mix at ROOT shards=N total_tokens=T`. Files already in ROOT with the right hash are not downloaded
        again. With --if-missing-build-synthetic a missing repo is first filled with a synthetic mix built
        from the build options (how a default setup gets its mix on first use).

Exit codes: 0 done; 1 the mix or the store is bad (the message names the file); 2 usage error or the repo
does not exist; 3 the trainer's dependencies are not installed (the message names them and the install command).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from trainer.deps import command_imports
from trainer.log import setup_logging
from trainer.store import sha256_file

# A core-only install says which dependency is missing, in one line (trainer/deps.py).
with command_imports("python -m trainer.data.mix", __name__):
    import numpy as np

    from trainer.data.shards import DTYPES, FORMAT, DataError, parse_manifest, read_manifest, verify_files

EOS_ID = 0  # the synthetic mix's end-of-document token
DOC_LEN = 2048  # synthetic tokens per document, EOS included
SUCCESSOR_P = (0.55, 0.25, 0.10, 0.05)  # chance of each of a token's 4 successors ...
NOISE_P = 0.05  # ... and of a uniformly random token instead (keeps every token reachable)
N_PHRASES = 1024  # fixed random n-grams that recur throughout the mix
PHRASE_LEN = 12
PHRASE_EVERY = 64  # each 64-token block of a document holds a phrase with probability PHRASE_P
PHRASE_P = 0.25
DEFAULTS = {"tokens": 50_000_000, "val_tokens": 2_000_000, "vocab": 49152, "seed": 0, "shards": 4}


class MixError(Exception):
    """A usage problem the CLI reports with exit code 2."""


# --------------------------------------------------------------------------- synthetic generation


def _dtype_for(vocab: int) -> str:
    return "uint16" if vocab <= 1 << 16 else "uint32"


def _language(seed: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed "grammar" every split shares: successor table (V, 4) and phrase bank (N_PHRASES, PHRASE_LEN)."""
    rng = np.random.default_rng([seed, 1])
    successors = rng.integers(1, vocab, size=(vocab, len(SUCCESSOR_P)))
    phrases = rng.integers(1, vocab, size=(N_PHRASES, PHRASE_LEN))
    return successors, phrases


def synthetic_tokens(n: int, *, seed: int, vocab: int, stream: int) -> np.ndarray:
    """`n` tokens of the synthetic language; `stream` (0 = val, 1.. = train shards) picks independent docs."""
    if vocab < 2:
        raise MixError(f"--vocab must be at least 2 (EOS plus one token), got {vocab}")
    dtype = DTYPES[_dtype_for(vocab)]
    successors, phrases = (a.astype(dtype) for a in _language(seed, vocab))
    rng = np.random.default_rng([seed, 2, stream])
    n_docs = -(-n // DOC_LEN)
    cum = np.cumsum((*SUCCESSOR_P, NOISE_P))
    # Time-major, so each step of the walk reads and writes one contiguous row across all documents.
    docs = np.empty((DOC_LEN, n_docs), dtype=dtype)
    docs[0] = rng.integers(1, vocab, n_docs)
    for t in range(1, DOC_LEN - 1):
        pick = np.minimum(np.searchsorted(cum, rng.random(n_docs) * cum[-1], side="right"), len(cum) - 1)
        nxt = successors[docs[t - 1], np.minimum(pick, len(SUCCESSOR_P) - 1)]
        docs[t] = np.where(pick == len(SUCCESSOR_P), rng.integers(1, vocab, n_docs).astype(dtype), nxt)
    docs[DOC_LEN - 1] = EOS_ID
    docs = np.ascontiguousarray(docs.T)  # (n_docs, DOC_LEN)
    # Paste phrases into blocks that end before the EOS, each at a random offset inside its block.
    doc_i, block_i = np.nonzero(rng.random((n_docs, (DOC_LEN - 1) // PHRASE_EVERY)) < PHRASE_P)
    starts = block_i * PHRASE_EVERY + rng.integers(0, PHRASE_EVERY - PHRASE_LEN + 1, len(block_i))
    which = rng.integers(0, N_PHRASES, len(block_i))
    docs[doc_i[:, None], starts[:, None] + np.arange(PHRASE_LEN)] = phrases[which]
    return docs.reshape(-1)[:n]


def _split_sizes(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# --------------------------------------------------------------------------------- writing a mix


def _write_tokens(out: Path, rel: str, tokens: np.ndarray, dtype: str) -> dict[str, Any]:
    data = np.ascontiguousarray(tokens, dtype=DTYPES[dtype]).tobytes()
    path = out / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"path": rel, "tokens": int(tokens.size), "sha256": hashlib.sha256(data).hexdigest()}


def _clear_old_mix(out: Path) -> None:
    """Remove a previous mix's manifest and listed files, so no stale shard survives a rebuild."""
    try:
        old = read_manifest(out)
    except DataError:
        return
    (out / "manifest.json").unlink()
    for e in [*old["shards"], old["val"]]:
        (out / e["path"]).unlink(missing_ok=True)


def write_mix(
    out: Path, shards: Sequence[np.ndarray], val: np.ndarray, *, vocab: int, source: dict[str, Any]
) -> dict[str, Any]:
    """Write shards, val and, last, the manifest (atomically): a mix without a manifest is not a mix."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _clear_old_mix(out)
    dtype = _dtype_for(vocab)
    entries = [_write_tokens(out, f"train/shard-{i:05d}.bin", s, dtype) for i, s in enumerate(shards)]
    manifest = {
        "format": FORMAT,
        "dtype": dtype,
        "vocab_size": vocab,
        "n_shards": len(entries),
        "total_tokens": sum(e["tokens"] for e in entries),
        "shards": entries,
        "val": _write_tokens(out, "val/val-00000.bin", val, dtype),
        "source": source,
    }
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, out / "manifest.json")
    return manifest


def build_synthetic(out: Path, *, tokens: int, val_tokens: int, vocab: int, seed: int, shards: int) -> dict[str, Any]:
    if tokens < 1 or val_tokens < 1 or shards < 1 or shards > tokens:
        raise MixError(
            f"need --tokens >= --shards >= 1 and --val-tokens >= 1 "
            f"(got tokens={tokens} shards={shards} val_tokens={val_tokens})"
        )
    if vocab > 1 << 32:
        raise MixError(f"--vocab {vocab} does not fit uint32 token ids")
    source = {
        "kind": "synthetic",
        # The generator's name as every mix built so far records it in its manifest: a name, not a module path
        # (a new name would make the same bytes read as another mix).
        "generator": "trainer.mix markov+phrases/1",
        "seed": seed,
        "vocab": vocab,
        "tokens": tokens,
        "val_tokens": val_tokens,
        "shards": shards,
        "eos_id": EOS_ID,
        "doc_len": DOC_LEN,
        "successor_p": list(SUCCESSOR_P),
        "noise_p": NOISE_P,
        "n_phrases": N_PHRASES,
        "phrase_len": PHRASE_LEN,
        "phrase_every": PHRASE_EVERY,
        "phrase_p": PHRASE_P,
    }
    train = [
        synthetic_tokens(n, seed=seed, vocab=vocab, stream=i + 1) for i, n in enumerate(_split_sizes(tokens, shards))
    ]
    val = synthetic_tokens(val_tokens, seed=seed, vocab=vocab, stream=0)
    return write_mix(out, train, val, vocab=vocab, source=source)


# ------------------------------------------------------------------------------------ text + tokenizer


def _documents(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return [text]
    docs = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                docs.append(json.loads(line)["text"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise MixError(f'{path}:{n}: expected a JSON object with a "text" field') from None
    return docs


def _eos_id(tok: Any, name: str | None, tokenizer_path: Path) -> tuple[str, int]:
    candidates = [name] if name else ["<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>"]
    for c in candidates:
        if (i := tok.token_to_id(c)) is not None:
            return c, i
    raise MixError(f"{tokenizer_path}: has no end-of-document token among {candidates}; name one with --eos-token")


def build_text(
    out: Path, *, files: Sequence[Path], tokenizer: Path, eos_token: str | None, val_tokens: int, shards: int
) -> dict[str, Any]:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MixError("build --text needs the `tokenizers` package: pip install tokenizers") from None
    tok = Tokenizer.from_file(str(tokenizer))
    eos_name, eos = _eos_id(tok, eos_token, tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    ids: list[int] = []
    for f in files:
        for doc in _documents(Path(f)):
            ids.extend(tok.encode(doc, add_special_tokens=False).ids)
            ids.append(eos)
    all_ids = np.asarray(ids, dtype=np.int64)
    if all_ids.size - val_tokens < shards or val_tokens < 1:
        raise MixError(
            f"the text gives {all_ids.size} tokens: not enough for {val_tokens} val tokens and {shards} train shards"
        )
    train, val = all_ids[:-val_tokens], all_ids[-val_tokens:]
    source = {
        "kind": "text",
        "tokenizer": {"file": Path(tokenizer).name, "sha256": sha256_file(Path(tokenizer))},
        "eos_token": eos_name,
        "eos_id": eos,
        "val_tokens": val_tokens,
        "shards": shards,
        "files": [{"file": Path(f).name, "sha256": sha256_file(Path(f))} for f in files],
    }
    return write_mix(out, np.array_split(train, shards), val, vocab=vocab, source=source)


# ------------------------------------------------------------------------------------- store side


def _open(url: str) -> Any:
    from trainer.store import open_store

    try:
        return open_store(url)
    except ValueError as e:  # a malformed URL is a usage error
        raise MixError(str(e)) from None


def _mix_files(manifest: dict[str, Any]) -> list[str]:
    return [e["path"] for e in [*manifest["shards"], manifest["val"]]]


def publish(src: Path, url: str) -> str:
    """One commit of the verified mix in `src` to `url`; returns the revision."""
    manifest = read_manifest(src)
    verify_files(src, manifest, hashes=True)
    store = _open(url)
    store.create()
    add = {p: Path(src) / p for p in _mix_files(manifest)}
    add["manifest.json"] = Path(src) / "manifest.json"
    stale = [p for p in store.list_files() if p not in add]
    rev = store.commit(
        add, delete=stale, message=f"mix: {manifest['n_shards']} shards, {manifest['total_tokens']} tokens"
    )
    print(f"published {len(add)} files of {src} to {store.url} revision={rev}", flush=True)
    return rev


def _local_matches(root: Path, remote: dict[str, Any]) -> bool:
    """ROOT already holds this exact mix, verified byte for byte."""
    try:
        local = read_manifest(root)
        if any(local[k] != remote[k] for k in ("dtype", "vocab_size", "shards", "val")):
            return False
        verify_files(root, local, hashes=True)
    except DataError:
        return False
    return True


def fetch(url: str, root: Path) -> dict[str, Any]:
    """Make ROOT a verified copy of the mix in `url`; returns its manifest."""
    from trainer.store import EntryMissing

    store = _open(url)
    root = Path(root)
    try:
        remote = parse_manifest(store.read_bytes("manifest.json"), where=f"{url} manifest.json")
    except EntryMissing:
        raise DataError(f"{url} holds no manifest.json: it is not a mix repo") from None
    if _local_matches(root, remote):
        print(f"mix at {root} already matches {store.url}: download skipped", flush=True)
    else:
        (root / "manifest.json").unlink(missing_ok=True)  # until every file is in, ROOT is not a mix
        listed = store.list_files()
        missing = [p for p in _mix_files(remote) if p not in listed]
        if missing:
            raise DataError(f"{url}: manifest.json lists {missing[0]}, which the repo does not hold")
        by_hash = {e["path"]: e["sha256"] for e in [*remote["shards"], remote["val"]]}
        got = 0
        for path in sorted(listed, key=lambda p: p == "manifest.json"):  # the manifest last
            dest = root / path
            if path in by_hash and dest.is_file() and sha256_file(dest) == by_hash[path]:
                continue  # a file an earlier, interrupted fetch already brought in
            store.download(path, dest)
            got += 1
        print(f"downloaded {got} of {len(listed)} files from {store.url}", flush=True)
    verify_files(root, remote, hashes=True)
    print(f"mix at {root} shards={remote['n_shards']} total_tokens={remote['total_tokens']}", flush=True)
    return remote


# ------------------------------------------------------------------------------------------- CLI


def _synthetic_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=DEFAULTS["tokens"], help="train tokens (synthetic)")
    p.add_argument("--val-tokens", type=int, default=DEFAULTS["val_tokens"], help="held-out tokens")
    p.add_argument("--vocab", type=int, default=DEFAULTS["vocab"], help="vocabulary size (synthetic)")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="seed of the synthetic language and docs")
    p.add_argument("--shards", type=int, default=DEFAULTS["shards"], help="number of train shards")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m trainer.data.mix", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build a mix directory")
    b.add_argument("--out", type=Path, required=True)
    kind = b.add_mutually_exclusive_group(required=True)
    kind.add_argument("--synthetic", action="store_true")
    kind.add_argument("--text", type=Path, nargs="+", metavar="FILE")
    b.add_argument("--tokenizer", type=Path, help="tokenizer.json (with --text)")
    b.add_argument("--eos-token", help="end-of-document token (with --text; default: a usual name)")
    _synthetic_options(b)
    p = sub.add_parser("publish", help="put a mix into a store repo, one commit")
    p.add_argument("--from", dest="src", type=Path, required=True)
    p.add_argument("--repo", required=True)
    f = sub.add_parser("fetch", help="download and verify a mix from a store repo")
    f.add_argument("--repo", required=True)
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--if-missing-build-synthetic", action="store_true")
    _synthetic_options(f)
    return ap


def _synthetic_kwargs(a: argparse.Namespace) -> dict[str, int]:
    return {"tokens": a.tokens, "val_tokens": a.val_tokens, "vocab": a.vocab, "seed": a.seed, "shards": a.shards}


def _run(a: argparse.Namespace) -> int:
    from trainer.store import RepoMissing

    if a.cmd == "build":
        if a.synthetic:
            m = build_synthetic(a.out, **_synthetic_kwargs(a))
        else:
            if a.tokenizer is None:
                raise MixError("build --text needs --tokenizer tokenizer.json")
            m = build_text(
                a.out,
                files=a.text,
                tokenizer=a.tokenizer,
                eos_token=a.eos_token,
                val_tokens=a.val_tokens,
                shards=a.shards,
            )
        print(
            f"built mix at {a.out} shards={m['n_shards']} total_tokens={m['total_tokens']} "
            f"vocab={m['vocab_size']} val_tokens={m['val']['tokens']}",
            flush=True,
        )
    elif a.cmd == "publish":
        publish(a.src, a.repo)
    else:
        store = _open(a.repo)
        if not store.exists():
            if not a.if_missing_build_synthetic:
                raise RepoMissing(
                    f"mix repo {store.url} does not exist (publish one, or pass --if-missing-build-synthetic)"
                )
            print(f"mix repo {store.url} missing: building a synthetic mix to publish", flush=True)
            build_synthetic(a.out, **_synthetic_kwargs(a))
            publish(a.out, a.repo)
        fetch(a.repo, a.out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from trainer.store import RepoMissing, StoreError

    a = _parser().parse_args(argv)
    try:
        return _run(a)
    except (MixError, RepoMissing) as e:
        print(f"mix: error: {e}", file=sys.stderr, flush=True)
        return 2
    except (DataError, StoreError, OSError) as e:
        print(f"mix: error: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    setup_logging(int(os.environ.get("RANK", "0")))  # a Hub retry's warning carries the time and the rank
    sys.exit(main())
