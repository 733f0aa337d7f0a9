"""The checkpoint protocol above the store seam: save, push, verify, move the pointer, prune.

Only rank 0 talks to the store. One save is, in this order, each phase announced on stdout (flushed) so a
test or a probe can tell exactly which phase a killed process was in:

1. ``CKPT push step=N -> ckpt/checkpoint-N``   ONE store commit holding every file of the checkpoint
   (``final/`` for the last segment's horizon push). Printed before the commit starts.
2. ``CKPT pushed step=N revision=R seconds=S`` after the commit returned.
3. ``CKPT verify step=N ok files=K``           every file re-hashed from the store's stored bytes and
   compared with the hashes taken locally. A mismatch raises StoreError and the pointer does not move.
4. ``latest.json -> step=N path=...``         ONE commit of ``latest.json`` alone; this is the commit
   marker: a checkpoint exists for resume only once the pointer names it.
5. ``CKPT prune step=N removed=[...]``        printed before the prune commit (see below).

A crash anywhere leaves the store resumable: before 4 the old pointer still names an intact, verified
checkpoint (the new files are orphans that the next push of that step overwrites); after 4 the new one does.
Before the very first pointer there is none to name, and resume recovers (trainer/ckpt/scan.py).

Every write goes through the store's lease (trainer/store/lease.py): one writer per store, claimed by
compare-and-swap, renewed while training, released by ``close()`` (once, on every exit path of a session:
trainer/ckpt/resume.py and trainer/ckpt/session.py call it). A second trainer is refused, naming the holder.

The checkpoint records itself. ``trainer_state.json`` is written last and carries ``files`` (the sha256 of
the other four files) and ``manifest_sha256`` (the sha256 of its own canonical JSON without that field), so a
checkpoint folder can be verified without a pointer: every file re-hashed from the stored bytes and compared
with what the checkpoint recorded at save time. A missing, truncated or altered file, or an altered
trainer_state.json, never verifies.

When verify finds stored bytes that differ from the local ones, the push repairs once (``CKPT repair``):
it deletes those files, purges their stored objects (``Store.purge_objects``: the Hub would otherwise
deduplicate the re-upload onto the corrupt object) and uploads them again, then verifies again. When the bytes
still read back wrong (a Hub without the LFS-files endpoints, or a regular file's git blob: objects no API
replaces), the push stores a byte-different copy of the same content instead (``CKPT variant``:
trainer/store/variant.py; ``trainer_state.json`` re-sealed with the copies' hashes), so the run gets past the
object every later session would deduplicate onto; the corrupt copy stays in the repo's history.

The pointer keeps its own history: ``revision`` (the store revision of the commit that pushed the checkpoint
it names) and ``previous`` (the step, path, revision and time of the pointer it replaced). A move to an
earlier step than the current pointer's (a second writer, ``--resume PATH`` over a newer run) is refused
unless ``allow_rollback`` (``--allow-pointer-rollback``); an allowed one is marked ``backward: true``.

Pruning policy. After the pointer has moved, ``optimizer.pt`` and ``rng.pt`` are deleted, in one commit,
from every ``ckpt/checkpoint-<step>/`` except the pointer's target and the newest
``keep_optimizer_states`` checkpoints. ``model.safetensors``, ``config.json`` and ``trainer_state.json``
are never pruned, so every pushed step stays listed under ``ckpt/checkpoint-<step>/`` with loadable
weights, while only the checkpoint(s) a resume can use carry the (large) optimizer state. A failed prune
is reported and does not fail training: the pointer is already durable.

Resume reads the store through the same checkpointer: trainer/ckpt/scan.py decides where a session
starts, and the pointer it finds is the one the next push replaces.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from trainer import sigterm
from trainer.store import EntryMissing, Store, StoreError, file_of_bytes, redact_url, sha256_file
from trainer.store.fields import SHA256, FieldError, Fields, load_doc
from trainer.store.lease import Lease
from trainer.store.protocol import repo_path_problem
from trainer.store.variant import write_variant

__all__ = [
    "POINTER_PATH",
    "POINTER_FORMAT",
    "CHECKPOINT_FILES",
    "PRUNABLE_FILES",
    "STATE_FILE",
    "STATE_MAX_BYTES",
    "CKPT_DIR",
    "Pointer",
    "parse_pointer",
    "read_pointer",
    "write_checkpoint_dir",
    "DiskFull",
    "disk_full",
    "Checkpointer",
    "prune_plan",
    "prune_local",
    "checkpoint_path",
    "seal_trainer_state",
    "unseal_trainer_state",
    "utc_now",
]

POINTER_PATH = "latest.json"
POINTER_FORMAT = "specprobe-pointer/1"
CHECKPOINT_FILES = ("model.safetensors", "config.json", "trainer_state.json", "optimizer.pt", "rng.pt")
STATE_FILE = "trainer_state.json"  # the checkpoint's own record: its step, tokens and the other files' hashes
PRUNABLE_FILES = ("optimizer.pt", "rng.pt")
CKPT_DIR = re.compile(r"^ckpt/checkpoint-(\d+)/")  # a path inside a checkpoint folder; group 1: its step
_CKPT_FOLDER = re.compile(r"^(final|ckpt/checkpoint-\d{1,16})$")
_HASH_MAX = 128  # a config hash is only ever compared with this run's: any short printable string is safe
_REVISION_OR_NONE = re.compile(r"^([0-9a-f]{40})?$")
_POINTER_MAX_BYTES = 1 << 20
STATE_MAX_BYTES = 16 << 20  # a trainer_state.json is a few kilobytes: past this it is not one


@dataclass
class Pointer:
    step: int
    path_in_repo: str
    files: dict[str, str]
    tokens: int
    time: str
    config_hash: str
    terminal: bool
    revision: str = ""  # the store revision of the commit that pushed the checkpoint
    previous: dict[str, Any] | None = None  # {step, path_in_repo, revision, time} of the pointer replaced
    backward: bool = False  # written by an explicitly allowed move to an earlier step

    def to_json(self) -> dict[str, Any]:
        return {"format": POINTER_FORMAT, **asdict(self)}

    def summary(self) -> dict[str, Any]:
        return {"step": self.step, "path_in_repo": self.path_in_repo, "revision": self.revision, "time": self.time}


def checkpoint_path(step: int, *, final: bool = False) -> str:
    return "final" if final else f"ckpt/checkpoint-{step}"


def utc_now() -> str:
    """The time a pointer records: UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def parse_pointer(text: str | bytes, where: str) -> Pointer:
    """Parse latest.json content, every field typed and bounded; ValueError (FieldError) naming ``where`` and
    the offending field."""
    doc = load_doc(text, where, max_bytes=_POINTER_MAX_BYTES)
    if doc.get("format") != POINTER_FORMAT:
        raise FieldError(f"{where} has format {doc.get('format')!r:.80}, expected {POINTER_FORMAT!r}")
    f = Fields(doc, where)
    step, tokens = f.int("step"), f.int("tokens")
    files = f.obj("files")
    for name, digest in files.doc.items():
        # A file name in the folder (fetch writes it under its own folder): one path part, no '..'.
        if "/" in name or repo_path_problem(name) or not isinstance(digest, str) or not SHA256.match(digest):
            raise files.fail(name, f"must map a file name in the folder to a sha256 hex digest, got {digest!r:.80}")
    # History fields came later: a pointer without them is read as having none.
    prev = f.obj("previous", default=None)
    previous = None
    if prev is not None:
        previous = {
            "step": prev.int("step"),
            "path_in_repo": _folder(prev, "path_in_repo"),
            "revision": prev.str("revision", _REVISION_OR_NONE, default=""),
            "time": prev.str("time", max_len=64, default=""),
        }
    return Pointer(
        step=step,
        path_in_repo=_folder(f, "path_in_repo"),
        files=dict(files.doc),
        tokens=tokens,
        time=f.str("time", max_len=64),
        config_hash=f.str("config_hash", max_len=_HASH_MAX),
        terminal=f.bool("terminal"),
        revision=f.str("revision", _REVISION_OR_NONE, default=""),
        previous=previous,
        backward=f.bool("backward", default=False),
    )


def _folder(f: Fields, name: str) -> str:
    """A checkpoint folder named in a pointer: ``final`` or ``ckpt/checkpoint-<step>``, nothing else."""
    path = f.str(name).rstrip("/")
    if not _CKPT_FOLDER.match(path):
        raise f.fail(name, f"{path!r:.200} is not a checkpoint folder (final or ckpt/checkpoint-<step>)")
    return path


def read_pointer(store: Store) -> Pointer | None:
    """The parsed latest.json; None when absent. StoreError (incl. RepoMissing) or ValueError otherwise."""
    try:
        raw = store.read_bytes(POINTER_PATH)
    except EntryMissing:  # RepoMissing is not an EntryMissing: a missing repo propagates
        return None
    return parse_pointer(raw, f"{POINTER_PATH} in {redact_url(store.url)}")


def _canonical_sha(doc: dict) -> str:
    canon = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(canon.encode()).hexdigest()


def seal_trainer_state(state: dict, files: dict[str, str]) -> dict:
    """``state`` plus ``files`` (the other checkpoint files' sha256) and ``manifest_sha256`` over the rest."""
    doc = {k: v for k, v in state.items() if k not in ("files", "manifest_sha256")}
    doc["files"] = dict(sorted(files.items()))
    doc["manifest_sha256"] = _canonical_sha(doc)
    return doc


def unseal_trainer_state(raw: bytes | str, where: str) -> dict:
    """The parsed trainer_state.json, its seal checked and its fields typed and bounded; ValueError naming
    ``where`` and what is wrong."""
    doc = load_doc(raw, where, max_bytes=STATE_MAX_BYTES)
    seal = doc.pop("manifest_sha256", None)
    if seal is None or not isinstance(doc.get("files"), dict):
        raise ValueError(
            f"{where} records no file hashes (written before checkpoints recorded their own): "
            "it cannot be verified without a pointer"
        )
    if _canonical_sha(doc) != seal:
        raise ValueError(f"{where} does not match its own manifest_sha256: it changed after it was written")
    want = sorted(n for n in CHECKPOINT_FILES if n != STATE_FILE)
    if sorted(doc["files"]) != want or not all(isinstance(h, str) and SHA256.match(h) for h in doc["files"].values()):
        raise ValueError(f"{where}: 'files' must give the sha256 of exactly {want}")
    f = Fields(doc, where)
    f.int("step")
    f.int("tokens_consumed")
    f.str("config_hash", max_len=_HASH_MAX, default="")
    return doc


def write_checkpoint_dir(
    out_dir: Path,
    *,
    model: Any,
    cfg: Any,
    trainer_state: dict,
    optimizer_state: dict,
    rng_states: list[dict],
    expect_bytes: int = 0,
) -> dict[str, str]:
    """Write the five checkpoint files into ``out_dir``; returns {file name: sha256}.

    ``optimizer_state`` is saved as given (the caller bundles optimizer, scheduler and scaler state dicts);
    ``rng_states`` is the list of every rank's RNG state, saved as given so ``torch.load`` returns it.
    trainer_state.json is written last, sealed with the other files' hashes (:func:`seal_trainer_state`).
    A write that fails because the disk is full raises :class:`DiskFull` naming the folder (``expect_bytes``:
    about what the checkpoint takes, to tell a full disk from another failure; see :func:`disk_full`).
    """
    out_dir = Path(out_dir)
    try:
        return _write_checkpoint_files(out_dir, model, cfg, trainer_state, optimizer_state, rng_states)
    except Exception as e:
        why = disk_full(out_dir, e, expect_bytes)
        if why is None:
            raise
        raise DiskFull(
            f"cannot write the checkpoint of step {trainer_state.get('step')} into {out_dir}: the disk is full "
            f"({why}). Free space there or give --out a folder on a larger disk; nothing of this checkpoint was "
            f"pushed. ({type(e).__name__}: {str(e)[:300]})"
        ) from e


def _write_checkpoint_files(
    out_dir: Path, model: Any, cfg: Any, trainer_state: dict, optimizer_state: dict, rng_states: list[dict]
) -> dict[str, str]:
    import torch

    from trainer.model import save_pretrained

    out_dir.mkdir(parents=True, exist_ok=True)
    hashes = dict(save_pretrained(model, cfg, out_dir))
    torch.save(optimizer_state, out_dir / "optimizer.pt")
    torch.save(list(rng_states), out_dir / "rng.pt")
    for name in ("optimizer.pt", "rng.pt"):
        hashes[name] = sha256_file(out_dir / name)
    sealed = seal_trainer_state(trainer_state, {n: hashes[n] for n in CHECKPOINT_FILES if n != STATE_FILE})
    (out_dir / STATE_FILE).write_text(json.dumps(sealed, indent=1, sort_keys=True) + "\n")
    hashes[STATE_FILE] = sha256_file(out_dir / STATE_FILE)
    return {name: hashes[name] for name in CHECKPOINT_FILES}


class DiskFull(OSError):
    """A checkpoint could not be written because the disk holding its folder is full; the message names it."""


_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NEARLY_NOTHING = 1 << 20  # free bytes under which a file system counts as full, whatever was being written


def disk_full(folder: Path, error: BaseException, expect_bytes: int = 0) -> str | None:
    """Why a failed write into ``folder`` is a full disk, in words, or None when it is not one. Either an
    ENOSPC/EDQUOT anywhere in the error's chain, or, since torch reports a short write as "unexpected pos
    N vs M" without its errno, less free space left on the folder's file system than the checkpoint takes
    (``expect_bytes``; 1 MiB when unknown)."""
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    found = next((x for x in chain if isinstance(x, OSError) and x.errno in _DISK_FULL_ERRNOS), None)
    try:
        fs = os.statvfs(folder if folder.exists() else folder.parent)
        free: int | None = fs.f_bavail * fs.f_frsize
    except OSError:
        free = None
    room = "" if free is None else f"{free:,} bytes free on its file system"
    need = f", the checkpoint takes about {expect_bytes:,}" if expect_bytes else ""
    if found is not None:
        return f"{os.strerror(found.errno or 0)}{'; ' + room if room else ''}{need}"
    if free is not None and free < max(expect_bytes, _NEARLY_NOTHING):
        return f"{room}{need}"
    return None


def prune_plan(paths: Iterable[str], *, keep_step: int | None, keep_newest: int) -> list[str]:
    """Repo paths to delete: PRUNABLE_FILES of every ckpt/checkpoint-<n>/ except step ``keep_step``
    (the pointer's target) and the ``keep_newest`` highest steps. Pure; sorted by step then name."""
    by_step: dict[int, list[str]] = {}
    for p in paths:
        m = CKPT_DIR.match(p)
        if m and p[m.end() :] in PRUNABLE_FILES:
            by_step.setdefault(int(m.group(1)), []).append(p)
    all_steps = sorted({int(m.group(1)) for p in paths if (m := CKPT_DIR.match(p))})
    keep = set(all_steps[-keep_newest:]) if keep_newest > 0 else set()
    if keep_step is not None:
        keep.add(keep_step)
    return [p for s in sorted(by_step) if s not in keep for p in sorted(by_step[s])]


def prune_local(out_dir: Path, keep: Path) -> list[Path]:
    """Delete every local checkpoint folder (``checkpoint-<n>`` or ``final``, directly under ``out_dir`` or
    ``out_dir/ckpt``) except ``keep``: the local disk holds at most the newest checkpoint."""
    out_dir, keep = Path(out_dir), Path(keep).resolve()
    removed: list[Path] = []
    for parent in (out_dir, out_dir / "ckpt"):
        if not parent.is_dir():
            continue
        for d in sorted(parent.iterdir()):
            if (
                d.is_dir()
                and not d.is_symlink()
                and (d.name == "final" or re.fullmatch(r"checkpoint-\d+", d.name))
                and d.resolve() != keep
            ):
                shutil.rmtree(d)
                removed.append(d)
    return removed


def _copy_checkpoint(local_dir: Path, out: Path, files: dict[str, str], names: list[str]) -> dict[str, str]:
    """Byte-different copies of ``names`` in ``out`` (trainer/store/variant.py), with ``trainer_state.json``
    re-sealed there when another file's hash changed; returns every file's hash after. ValueError naming a file
    no copy can be made of."""
    new = dict(files)
    for name in names:
        if name != STATE_FILE:
            write_variant(local_dir / name, out / name)
            new[name] = sha256_file(out / name)
    if STATE_FILE in names or new != files:
        where = str(local_dir / STATE_FILE)
        state = unseal_trainer_state((local_dir / STATE_FILE).read_bytes(), where)
        sealed = seal_trainer_state(state, {n: h for n, h in new.items() if n != STATE_FILE})
        (out / STATE_FILE).write_text(json.dumps(sealed, indent=1, sort_keys=True) + "\n")
        if sha256_file(out / STATE_FILE) == files[STATE_FILE]:  # only its own bytes were bad: a copy of them
            write_variant(local_dir / STATE_FILE, out / STATE_FILE)
        new[STATE_FILE] = sha256_file(out / STATE_FILE)
    return new


class Checkpointer:
    """push -> verify -> pointer -> prune over one store, under its lease."""

    def __init__(
        self,
        store: Store,
        *,
        log: Callable[[str], None] = print,
        prune: bool = True,
        keep_optimizer_states: int = 1,
        allow_rollback: bool = False,
        lease_ttl_s: float | None = None,
    ) -> None:
        if keep_optimizer_states < 1:
            raise ValueError(
                f"keep_optimizer_states must be >= 1 (the pointer's target always keeps its "
                f"optimizer state), got {keep_optimizer_states}"
            )
        self.store = store
        self.prune = prune
        self.keep_optimizer_states = keep_optimizer_states
        self.allow_rollback = allow_rollback
        self._log = log
        self.lease = Lease(store, ttl_s=lease_ttl_s, log=self.say)
        self._pointer: Pointer | None = None  # the store's pointer as this writer last read or wrote it
        self._pointer_known = False
        self._closed = False

    @property
    def url(self) -> str:
        return redact_url(self.store.url)

    def say(self, line: str) -> None:
        """One protocol line, flushed."""
        self._log(line)
        sys.stdout.flush()  # a kill right after this line must not lose it

    def close(self) -> None:
        """Release the lease (the end of a session, finished or failed), once: a second call does nothing. A
        failure is reported, not raised: the next writer then waits for the lease to expire. A SIGTERM that
        lands meanwhile does not cut the release short (trainer/sigterm.py)."""
        if self._closed:
            return
        self._closed = True
        with sigterm.shielded():
            try:
                self.lease.release()
            except (StoreError, OSError) as e:
                self.say(f"lease: release FAILED ({type(e).__name__}: {e}); the next writer waits until it expires")

    def know_pointer(self, pointer: Pointer | None) -> None:
        """The store's pointer as the resume scan read it: the next push's backward check and its
        ``previous`` start from it instead of reading the store again."""
        self._pointer, self._pointer_known = pointer, True

    def _current_pointer(self) -> Pointer | None:
        if not self._pointer_known:
            self._pointer, self._pointer_known = read_pointer(self.store), True
        return self._pointer

    # -- save path --------------------------------------------------------------------------------
    def push(
        self, step: int, local_dir: Path, files: dict[str, str], *, tokens: int, config_hash: str, final: bool = False
    ) -> Pointer:
        local_dir = Path(local_dir)
        if not files:
            raise ValueError(f"push step={step}: no files given from {local_dir}")
        for name in files:
            if "/" in name or not (local_dir / name).is_file():
                raise StoreError(f"push step={step}: {local_dir / name} is not a file in the checkpoint folder")
        dest = checkpoint_path(step, final=final)
        if not self.lease.held:
            self.lease.acquire()
        self._check_forward(step, dest, final)  # before uploading anything a backward move would waste

        self.say(f"CKPT push step={step} -> {dest}")
        t0 = time.monotonic()
        # Files of an earlier, different push to the same folder would otherwise survive next to ours.
        stale = [p for p in self.store.list_files() if p.startswith(dest + "/") and p[len(dest) + 1 :] not in files]
        revision = self.lease.commit(
            {f"{dest}/{n}": local_dir / n for n in sorted(files)},
            delete=stale,
            message=f"checkpoint step {step} -> {dest}",
        )
        self.say(f"CKPT pushed step={step} revision={revision} seconds={time.monotonic() - t0:.2f}")

        bad = self._verify(dest, files)
        if bad:
            files = self._repair(step, dest, local_dir, files, bad, revision)
        self.say(f"CKPT verify step={step} ok files={len(files)}")

        current = self._current_pointer()
        backward = current is not None and (step, final) < (current.step, current.terminal)
        pointer = Pointer(
            step=step,
            path_in_repo=dest,
            files=dict(sorted(files.items())),
            tokens=tokens,
            time=utc_now(),
            config_hash=config_hash,
            terminal=final,
            revision=revision,
            previous=current.summary() if current is not None else None,
            backward=backward,
        )
        self.write_pointer(pointer)
        self.say(
            f"latest.json -> step={step} path={dest}"
            + (f" (moved BACK from step {current.step}, allowed by --allow-pointer-rollback)" if backward else "")
        )

        if self.prune:
            self._prune(step, pointer)
        return pointer

    def _check_forward(self, step: int, dest: str, final: bool) -> None:
        current = self._current_pointer()
        if current is None or (step, final) >= (current.step, current.terminal) or self.allow_rollback:
            return
        raise StoreError(
            f"push step={step} to {self.url}: {POINTER_PATH} is at step {current.step} ({current.path_in_repo}"
            f"{', terminal' if current.terminal else ''}); moving it back to step {step} ({dest}) would fork the "
            "run. Nothing was pushed. Resume from the store's pointer (--resume auto), or pass "
            "--allow-pointer-rollback to move it back on purpose."
        )

    def _verify(self, dest: str, files: dict[str, str]) -> dict[str, str]:
        """{file name: what the store holds} for the files whose stored bytes differ from the local hashes."""
        bad = {}
        for name, want in sorted(files.items()):
            try:
                got = self.store.sha256(f"{dest}/{name}")
            except EntryMissing:
                got = "<missing>"
            if got != want:
                bad[name] = got
        return bad

    @staticmethod
    def _mismatches(dest: str, files: dict[str, str], bad: dict[str, str]) -> str:
        return "; ".join(f"{dest}/{n}: stored sha256 {got}, local sha256 {files[n]}" for n, got in bad.items())

    def _repair(
        self, step: int, dest: str, local_dir: Path, files: dict[str, str], bad: dict[str, str], revision: str
    ) -> dict[str, str]:
        """Replace the files whose stored bytes are wrong: delete them, purge their objects (so the upload is
        not deduplicated onto the bad ones), upload them again; verify again; when still wrong, push a
        byte-different copy (:meth:`_push_copy`). Returns the hashes the folder holds now; StoreError when still
        wrong."""
        names = sorted(bad)
        self.say(
            f"CKPT repair step={step}: verify found {self._mismatches(dest, files, bad)}; deleting, purging "
            f"the stored objects and uploading again: {', '.join(names)}"
        )
        listed = self.store.list_files()
        gone = [f"{dest}/{n}" for n in names if f"{dest}/{n}" in listed]
        if gone:
            self.lease.commit({}, delete=gone, message=f"repair step {step}: drop corrupt {', '.join(names)}")
        self.store.purge_objects(sorted({files[n] for n in names}))
        self.lease.commit(
            {f"{dest}/{n}": local_dir / n for n in names},
            message=f"repair step {step}: upload {', '.join(names)} again",
        )
        still = self._verify(dest, files)
        return self._push_copy(step, dest, local_dir, files, still, revision) if still else files

    def _push_copy(
        self, step: int, dest: str, local_dir: Path, files: dict[str, str], still: dict[str, str], revision: str
    ) -> dict[str, str]:
        """The store kept the corrupt objects: push byte-different copies of the same content (module docstring)
        and verify them. Returns the folder's hashes now; StoreError when no copy can be made or it is wrong too."""
        failed = (
            f"CKPT verify step={step} FAILED in {self.url} even after a repair: {self._mismatches(dest, files, still)}"
        )
        copies = Path(tempfile.mkdtemp(prefix=f".{local_dir.name}-copy-", dir=local_dir.parent))
        try:
            try:
                copied = _copy_checkpoint(local_dir, copies, files, sorted(still))
            except ValueError as e:
                raise StoreError(
                    f"{failed}; no byte-different copy could be made ({e}); {POINTER_PATH} was NOT moved"
                ) from e
            changed = sorted(n for n in copied if copied[n] != files[n])
            self.say(
                f"CKPT variant step={step}: {', '.join(sorted(still))} still read back corrupt (the store kept the "
                "corrupt object and stores the same bytes onto it); pushing a byte-different copy of the same "
                f"content: {', '.join(changed)}. The corrupt copy stays in the history of {self.url} at revision "
                f"{revision} for inspection"
            )
            self.lease.commit(
                {f"{dest}/{n}": copies / n for n in changed},
                message=f"repair step {step}: byte-different copy of {', '.join(changed)}",
            )
            again = self._verify(dest, copied)
        finally:
            shutil.rmtree(copies, ignore_errors=True)
        if again:
            raise StoreError(
                f"{failed}; the byte-different copy reads back wrong too: {self._mismatches(dest, copied, again)}; "
                f"{POINTER_PATH} was NOT moved"
            )
        return copied

    def write_pointer(self, pointer: Pointer) -> None:
        """Commit ``pointer`` as latest.json (under the lease) and read it back."""
        # An in-memory file: a kill inside the commit leaves nothing in the system's temp dir.
        with file_of_bytes(
            POINTER_PATH, (json.dumps(pointer.to_json(), indent=1, sort_keys=True) + "\n").encode()
        ) as path:
            self.lease.commit(
                {POINTER_PATH: path}, message=f"latest.json -> step {pointer.step} {pointer.path_in_repo}"
            )
        # Read it back: a commit call that errored or "succeeded" is not proof of what the repo now says.
        back = read_pointer(self.store)
        if back != pointer:
            raise StoreError(f"{POINTER_PATH} in {self.url} reads back as {back} after writing step={pointer.step}")
        self._pointer, self._pointer_known = pointer, True

    def _prune(self, step: int, pointer: Pointer) -> None:
        keep_step = None if pointer.path_in_repo == "final" else pointer.step
        removed = prune_plan(self.store.list_files(), keep_step=keep_step, keep_newest=self.keep_optimizer_states)
        self.say(f"CKPT prune step={step} removed={json.dumps(removed)}")
        if not removed:
            return
        try:
            self.lease.commit({}, delete=removed, message=f"prune optimizer/rng state older than step {step}")
        except (StoreError, OSError) as e:  # the pointer is durable; a failed prune only costs space
            self.say(f"CKPT prune step={step} failed (training continues): {type(e).__name__}: {e}")
