"""The resume decision over a store: which checkpoint a session starts from, read by rank 0 alone.

``ResumeScan(checkpointer).decide(...)`` starts fresh only from a missing repo or one without checkpoints, and
with ``require_run`` (``--resume must``) refuses both instead: a session that continues a run never starts
it afresh. A repo with checkpoints but no pointer (a session killed after its first verify, before its first pointer)
resumes from the newest checkpoint that fully verifies against the stored bytes, and the pointer is moved
there (logged); it is refused only when none verifies, saying what was found in each. It refuses
(:class:`ResumeRefused`, saying what was found, why, and what to do) a malformed pointer, a pointer whose
files are missing or whose hashes differ, a pointer that disagrees with its checkpoint's trainer_state.json
(step, tokens, config hash, recorded file hashes), a pointer that moved backwards (unless allowed), a
terminal pointer, a pointer written under a different run configuration, and a pointer past this run's
horizon. :func:`fetch` then downloads the pointer's files, each checked against the pointer's sha256.

A refusal changes nothing in the store and never advises deleting anything: it says what is missing or wrong,
and how to resume from a checkpoint of one's choosing (:func:`resume_from_hint`). A Hub listing can lag behind
the commit that added a file, so a file the pointer names that the listing does not show is listed again a few
times before it is called missing. A checkpoint newer than the pointer is verified and named, with the reason
the resume still starts from the pointer's.

The scan claims the checkpointer's lease before it reads (from then on nobody else moves the pointer), and
hands the pointer it found to the checkpointer, whose next push replaces it.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from trainer.ckpt.checkpointer import (
    CHECKPOINT_FILES,
    CKPT_DIR,
    POINTER_PATH,
    PRUNABLE_FILES,
    STATE_FILE,
    STATE_MAX_BYTES,
    Checkpointer,
    Pointer,
    checkpoint_path,
    read_pointer,
    unseal_trainer_state,
    utc_now,
)
from trainer.runconfig import RunIdentity, judge_config_change
from trainer.store import (
    EntryMissing,
    FileInfo,
    LocalStore,
    RepoMissing,
    Store,
    StoreError,
    parse_store_url,
    redact_url,
    sha256_file,
)
from trainer.store.fields import load_doc

__all__ = ["ResumeRefused", "ResumeScan", "fetch", "resume_from_hint", "RELIST_DELAYS_S"]

# Waits before each new listing when the listing does not show a file the pointer names (a Hub listing can lag
# behind a commit for seconds); a local store's listing is its manifest and never lags.
RELIST_DELAYS_S = (2.0, 5.0, 10.0)


class ResumeRefused(Exception):
    """The store's state does not allow this run to start or resume; the message says what to do."""


class _Unverified(Exception):
    """Internal: why a checkpoint folder does not verify."""


class ResumeScan:
    """Rank 0's reading of the store at a session's start, through ``checkpointer`` (its store, its lease,
    its pointer writes, its ``allow_rollback``). ``allow_changes``: the run-config fields
    ``--allow-config-change`` lets differ from the pointer's checkpoint."""

    def __init__(
        self,
        checkpointer: Checkpointer,
        *,
        allow_changes: frozenset[str] = frozenset(),
        relist_delays_s: Sequence[float] = RELIST_DELAYS_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.ck = checkpointer
        self.relist_delays_s = tuple(relist_delays_s)
        self._sleep = sleep
        self.store = checkpointer.store
        self.url = checkpointer.url
        self.allow_changes = allow_changes
        self.config_changes: list[dict[str, Any]] = []  # what --allow-config-change let the resume change
        self._say = checkpointer.say

    def decide(self, *, identity: RunIdentity, horizon_step: int, require_run: bool = False) -> Pointer | None:
        """The pointer to resume from (None: fresh start), or ResumeRefused. A pointer of another config hash
        than ``identity``'s is refused naming the fields that changed (from the pointer's trainer_state.json),
        unless ``allow_changes`` covers each. `require_run` (``--resume must``): a missing repo, or one without
        a run, is refused, never started."""
        if not self.store.exists():
            if require_run:
                raise ResumeRefused(
                    f"--resume must: repo {self.url} does not exist, and this session continues a run: the run's "
                    "repo was deleted or renamed, or --hub-repo names another one. Nothing was created. Point "
                    "--hub-repo at the run's repo; to start a new run, use --resume auto."
                )
            self.store.create()
            self.ck.lease.acquire()
            self.ck.know_pointer(None)
            self._say(f"auto-resume: repo missing, created {self.url}, fresh start")
            return None
        self.ck.lease.acquire()  # before reading: from here on nobody else moves the pointer
        listing = self.store.list_files()
        try:
            pointer = read_pointer(self.store)
        except ValueError as e:
            raise ResumeRefused(
                f"{e}; refusing to guess which checkpoint is current. Repair {POINTER_PATH} by hand, or "
                f"{self._way_out(listing)}"
            ) from None
        if pointer is None:
            if any(p.startswith(("ckpt/", "final/")) for p in listing):
                pointer = self._recover(listing, identity=identity, horizon_step=horizon_step)
            elif require_run:
                raise ResumeRefused(
                    f"--resume must: {self.url} holds no run (no {POINTER_PATH}, no checkpoint), and this "
                    "session continues one: the run's checkpoints are gone, or "
                    "--hub-repo names another repo. Point --hub-repo at the run's repo; to start a new run, use "
                    "--resume auto."
                )
            else:
                self.ck.know_pointer(None)
                self._say(f"auto-resume: no pointer in {self.url}, fresh start")
                return None
        else:
            listing = self._listing_showing([f"{pointer.path_in_repo}/{n}" for n in pointer.files], listing)
            self._check_pointer(pointer, listing, identity=identity, horizon_step=horizon_step)
            self.ck.know_pointer(pointer)
            self._note_newer(pointer, listing)
        self._say(f"auto-resume: pointer step={pointer.step} path={pointer.path_in_repo}")
        return pointer

    def _recover(self, listing: dict[str, FileInfo], *, identity: RunIdentity, horizon_step: int) -> Pointer:
        """No pointer, but checkpoints: point at the newest one that fully verifies, or refuse saying why none does."""
        steps = sorted({int(m.group(1)) for p in listing if (m := CKPT_DIR.match(p))}, reverse=True)
        # A ckpt/ folder before final/ at the same step: resuming there only re-does the final push.
        candidates = [checkpoint_path(s) for s in steps] + (
            ["final"] if any(p.startswith("final/") for p in listing) else []
        )
        found: list[str] = []
        for path in candidates:
            try:
                state, files = self._verify_checkpoint(path, listing)
            except _Unverified as e:
                found.append(f"{path}: {e}")
                continue
            pointer = Pointer(
                step=state["step"],
                path_in_repo=path,
                files=files,
                tokens=state["tokens_consumed"],
                time=utc_now(),
                config_hash=str(state.get("config_hash", "")),
                terminal=path == "final",
                revision=self.store.revision(),
            )
            self._check_pointer(pointer, listing, identity=identity, horizon_step=horizon_step)
            skipped = f"; newer ones do not verify: {'; '.join(found)}" if found else ""
            self._say(
                f"auto-resume: {self.url} has no {POINTER_PATH}; {path} verifies ({len(files)} files re-hashed "
                f"from the stored bytes match what it recorded){skipped}; moving {POINTER_PATH} there"
            )
            self.ck.know_pointer(None)
            self.ck.write_pointer(pointer)
            self._say(f"latest.json -> step={pointer.step} path={path} (recovered)")
            return pointer
        raise ResumeRefused(
            f"{self.url} has no {POINTER_PATH} and none of its checkpoints verifies against the bytes the store "
            f"holds: {'; '.join(found)}. Refusing to start fresh over a repo with history. A file a listing "
            f"did not show may only lag behind its commit: run again later; or "
            f"{self._way_out(listing, skip=candidates)}"
        )

    def _verify_checkpoint(self, path: str, listing: dict[str, FileInfo]) -> tuple[dict, dict[str, str]]:
        """(trainer_state, {file: sha256}) when every file of ``path`` re-hashes, from the stored bytes, to what
        its trainer_state.json recorded at save time; _Unverified saying why not otherwise."""
        missing = [n for n in CHECKPOINT_FILES if f"{path}/{n}" not in listing]
        if missing:
            pruned = " (pruned: only the newest checkpoints keep them)" if set(missing) <= set(PRUNABLE_FILES) else ""
            raise _Unverified(f"{', '.join(missing)} missing{pruned}")
        try:
            raw = self.store.read_bytes(f"{path}/{STATE_FILE}")
            state = unseal_trainer_state(raw, STATE_FILE)
        except (StoreError, ValueError) as e:
            raise _Unverified(str(e)) from None
        m = CKPT_DIR.match(path + "/")
        if m and int(m.group(1)) != state["step"]:
            raise _Unverified(f"{STATE_FILE} says step {state['step']}, the folder is step {m.group(1)}")
        bad = []
        for name, want in sorted(state["files"].items()):
            try:
                got = self.store.sha256(f"{path}/{name}")
            except StoreError as e:
                got = f"<unreadable: {e}>"
            if got != want:
                bad.append(f"{name} stored sha256 {got}, {STATE_FILE} records {want}")
        if bad:
            raise _Unverified("; ".join(bad))
        return state, {**state["files"], STATE_FILE: hashlib.sha256(raw).hexdigest()}

    def _note_newer(self, pointer: Pointer, listing: dict[str, FileInfo]) -> None:
        """Name the checkpoints newer than the pointer, verify the newest, and say why the resume still starts
        from the pointer's: only the pointer says which checkpoint is the run's. Its history cannot say why a
        newer one exists (a pointer moved back with its ``previous`` removed reads like a session stopped
        between push and pointer), so the note names both and claims neither."""
        newer = sorted({s for p in listing if (m := CKPT_DIR.match(p)) and (s := int(m.group(1))) > pointer.step})
        if not newer:
            return
        newest = checkpoint_path(newer[-1])
        try:
            _state, files = self._verify_checkpoint(newest, listing)
            found = f"verifies ({len(files)} files re-hashed from the stored bytes match what it recorded)"
            instead = f" To resume from {newest} instead: {resume_from_hint(self.store.url, newest)}"
        except _Unverified as e:
            found, instead = f"does not verify ({e})", ""
        self._say(
            f"auto-resume: note: {', '.join(checkpoint_path(s) for s in newer)} newer than {POINTER_PATH} "
            f"(step {pointer.step}); {newest} {found}. Resuming from {POINTER_PATH}'s {pointer.path_in_repo}: "
            f"a checkpoint is the run's only once {POINTER_PATH} names it, and it does not name {newest} (its "
            f"session stopped, or its pointer commit failed, between push and pointer; or {POINTER_PATH} was "
            f"moved back from it). Steps {pointer.step + 1}..{newer[-1]} are trained again, from the same "
            f"batches, and the push of step {newer[-1]} replaces it.{instead}"
        )

    def _check_pointer(self, p: Pointer, listing: dict, *, identity: RunIdentity, horizon_step: int) -> None:
        where = f"{POINTER_PATH} in {self.url}"
        if p.terminal:
            if horizon_step > p.step:
                raise ResumeRefused(
                    f"{where} is terminal: that run finished at step {p.step} ({p.path_in_repo}), and this run "
                    f"asks to train further, to step {horizon_step}; a finished run is not extended. "
                    "Start a new run in a new repo (optionally initialised from final/)."
                )
            raise ResumeRefused(
                f"{where} is terminal: the run already finished at step {p.step} ({p.path_in_repo}); nothing "
                "to resume. Use a new repo to train again."
            )
        if p.config_hash != identity.hash:
            try:
                self.config_changes = judge_config_change(
                    self._stored_run_config(p), p.config_hash, identity, self.allow_changes, f"{where} (step {p.step})"
                )
            except ValueError as e:
                raise ResumeRefused(str(e)) from None
        if p.step > horizon_step:
            raise ResumeRefused(
                f"{where} is at step {p.step}, past this run's horizon step {horizon_step}; refusing to "
                "resume backwards. Use the original --tokens or a new repo."
            )
        prev = p.previous
        if prev is not None and prev["step"] > p.step and not p.backward:
            if not self.ck.allow_rollback:
                raise ResumeRefused(
                    f"{where} moved backwards: it is at step {p.step} ({p.path_in_repo}) but the pointer it "
                    f"replaced was at step {prev['step']} ({prev['path_in_repo']}, revision "
                    f"{prev.get('revision') or '?'}): resuming would silently drop steps {p.step + 1}..{prev['step']}. "
                    "Find out who moved it; pass --allow-pointer-rollback to resume from the older step on purpose."
                )
            self._say(
                f"auto-resume: {POINTER_PATH} moved back from step {prev['step']} to {p.step}; resuming "
                "from it as --allow-pointer-rollback asks"
            )
        m = CKPT_DIR.match(p.path_in_repo + "/")
        if m and int(m.group(1)) != p.step:
            raise ResumeRefused(
                f"{where} says step {p.step} but points at {p.path_in_repo}; refusing to guess "
                f"which is right. Repair the pointer by hand, or {self._way_out(listing, skip=[p.path_in_repo])}"
            )
        missing_req = [n for n in CHECKPOINT_FILES if n not in p.files]
        if missing_req:
            raise ResumeRefused(
                f"{where} points at {p.path_in_repo} but lists no {', '.join(missing_req)}; a resume needs "
                f"all of {', '.join(CHECKPOINT_FILES)}. Repair the pointer by hand, or "
                f"{self._way_out(listing, skip=[p.path_in_repo])}"
            )
        unlisted = [f"{p.path_in_repo}/{n}" for n in sorted(p.files) if f"{p.path_in_repo}/{n}" not in listing]
        if unlisted:
            tries = 1 + (0 if isinstance(self.store, LocalStore) else len(self.relist_delays_s))
            raise ResumeRefused(
                f"{POINTER_PATH} points at {p.path_in_repo} but the listing of {self.url} does not show "
                f"{', '.join(unlisted)} (listed {tries} time(s); a Hub listing can lag behind the commit that "
                "added a file). Refusing to start fresh over a repo with history. If the files are there, run "
                f"again later and the resume goes on. If they are gone, {self._way_out(listing, skip=[p.path_in_repo])}"
            )
        for name, want in sorted(p.files.items()):
            path = f"{p.path_in_repo}/{name}"
            info = listing[path]
            # The backend's recorded hash where it has one (cheap); otherwise read the bytes back.
            got = info.sha256 if info.sha256 else self.store.sha256(path)
            if got != want:
                raise ResumeRefused(
                    f"{POINTER_PATH} points at {p.path_in_repo} but {path} in {self.url} has sha256 {got}, the "
                    f"pointer says {want}: the checkpoint changed after it was verified; "
                    f"{self._way_out(listing, skip=[p.path_in_repo])}"
                )
        self._check_against_state(p, where, listing)

    def _check_against_state(self, p: Pointer, where: str, listing: dict[str, FileInfo]) -> None:
        """The pointer and its checkpoint's own record must agree: a resume starts from what trainer_state.json
        says, so a pointer naming another step, token count or configuration would silently change the run."""
        raw = self.store.read_bytes(f"{p.path_in_repo}/{STATE_FILE}")
        try:
            state = load_doc(raw, f"{p.path_in_repo}/{STATE_FILE} in {self.url}", max_bytes=STATE_MAX_BYTES)
        except ValueError as e:
            raise ResumeRefused(f"{e}; the checkpoint's record is unreadable") from None
        if "manifest_sha256" in state:
            try:
                state = unseal_trainer_state(raw, f"{p.path_in_repo}/{STATE_FILE}")
            except ValueError as e:
                raise ResumeRefused(f"{e}; {self._way_out(listing, skip=[p.path_in_repo])}") from None
        differ = [
            f"{what}: pointer {mine!r}, {STATE_FILE} {theirs!r}"
            for what, mine, theirs in (
                ("step", p.step, state.get("step")),
                ("tokens", p.tokens, state.get("tokens_consumed")),
                ("config_hash", p.config_hash, state.get("config_hash")),
            )
            if mine != theirs
        ]
        recorded = state.get("files") if isinstance(state.get("files"), dict) else {}
        differ += [
            f"{n}: pointer {p.files.get(n)}, {STATE_FILE} {h!r:.80}"
            for n, h in sorted(recorded.items())
            if p.files.get(n) != h
        ]
        if differ:
            raise ResumeRefused(
                f"{where} and {p.path_in_repo}/{STATE_FILE} disagree ({'; '.join(differ)}); refusing to guess "
                f"which one describes the run. Repair the pointer by hand, or "
                f"{self._way_out(listing, skip=[p.path_in_repo])}"
            )

    def _listing_showing(self, paths: list[str], listing: dict[str, FileInfo]) -> dict[str, FileInfo]:
        """``listing``, or a newer one, so that it shows every one of ``paths`` if the store has them: a Hub
        listing can lag behind the commit that added a file, so it is listed again after each of
        ``relist_delays_s``. A local store's listing is its manifest: it never lags."""
        missing = [p for p in paths if p not in listing]
        if not missing or isinstance(self.store, LocalStore):
            return listing
        for wait in self.relist_delays_s:
            self._say(
                f"auto-resume: the listing of {self.url} does not show {', '.join(missing)}; a listing can lag "
                f"behind a commit: listing again in {wait:g}s"
            )
            self._sleep(wait)
            listing = self.store.list_files()
            missing = [p for p in paths if p not in listing]
            if not missing:
                break
        return listing

    def _way_out(self, listing: dict[str, FileInfo], skip: Sequence[str] = ()) -> str:
        """What to do instead of this resume, with nothing deleted: resume from a checkpoint of one's choosing
        (the newest one not in ``skip`` whose files are all listed is named), or start the run over in a new repo."""
        folders = sorted(
            {p.rsplit("/", 1)[0] for p in listing if p.startswith(("ckpt/", "final/"))} - set(skip),
            key=lambda d: (d != "final", -int(m.group(1)) if (m := CKPT_DIR.match(d + "/")) else 0),
        )
        whole = [d for d in folders if all(f"{d}/{n}" in listing for n in CHECKPOINT_FILES)]
        example = whole[0] if whole else "ckpt/checkpoint-<step>"
        listed = f" ({example} lists all its files)" if whole else ""
        return (
            f"resume from a checkpoint you choose{listed}: {resume_from_hint(self.store.url, example)} (with "
            f"--allow-pointer-rollback if it is older than {POINTER_PATH}'s step), or start the run over in a new "
            f"repo. Nothing in {self.url} was changed."
        )

    def _stored_run_config(self, p: Pointer) -> dict | None:
        """The run config in the pointer's trainer_state.json; None where that file cannot be read."""
        try:
            raw = self.store.read_bytes(f"{p.path_in_repo}/{STATE_FILE}")
            state = load_doc(raw, STATE_FILE, max_bytes=STATE_MAX_BYTES)
        except (StoreError, ValueError):
            return None
        stored = state.get("run_config")
        return stored if isinstance(stored, dict) else None


def resume_from_hint(store_url: str, path: str) -> str:
    """How to resume from the checkpoint folder ``path`` of this store on purpose: ``--resume PATH`` takes a
    local checkpoint folder; a local store's folder is one already, a Hub repo's is downloaded first."""
    try:
        url = parse_store_url(store_url)
    except ValueError:
        return f"fetch {path}/ from {redact_url(store_url)} into a folder DIR, then run with --resume DIR"
    if url.kind == "file":
        assert url.root is not None
        return f"run with --resume {url.root / url.repo_id / path}"
    return (
        f"`hf download {url.repo_id} --repo-type {url.repo_type} --include '{path}/*' --local-dir DIR`, then run "
        f"with --resume DIR/{path}"
    )


def fetch(store: Store, pointer: Pointer, dest: Path) -> Path:
    """Download the pointer's files into ``dest``; each must match the pointer's sha256 (one retry)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, want in sorted(pointer.files.items()):
        path = f"{pointer.path_in_repo}/{name}"
        got = ""
        for _attempt in (0, 1):
            try:
                got = sha256_file(store.download(path, dest / name))
            except (EntryMissing, RepoMissing):
                raise
            except StoreError as e:  # a backend that checks its own download reports the mismatch
                got = f"<download failed: {e}>"
            if got == want:
                break
        else:
            (dest / name).unlink(missing_ok=True)
            raise StoreError(
                f"fetch step={pointer.step}: {path} from {redact_url(store.url)} has sha256 {got} after two "
                f"downloads, {POINTER_PATH} says {want}"
            )
    return dest
