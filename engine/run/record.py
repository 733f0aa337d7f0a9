"""The record of a run: the one way out of it. Everything a run writes passes through its Record,
built once from the plan, and leaves masked by the plan's secret filter (engine/spec/plan.py
`masking`): console lines (`say`), evidence.json (`save`, atomic), the leg logs (`leg_log`), the
re-check records beside the evidence (`write`), and, after each step and at the end, the files the
legs wrote into the run dir themselves and their names (`after_step`, `finish`: what could not be
checked makes the verdict ERROR). A new output path goes through one of these, so the secret filter
holds by construction, not by its author remembering it. `prepare_run_dir` takes the run dir for
one engine (a lock) before anything in it is touched.

A write that fails (a full disk) raises RecordError naming the file; the run stops there and its
verdict is ERROR. `engine check` and `engine replay` open a Record on the saved run, masked with the
environment they run in, and write their `check-`/`replay-<stamp>.json` through it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

from engine import limits
from engine.run import evidence
from engine.run.reaper import Reaper
from engine.secrets import Mask, PlanSecrets, Scrubber, TreeScrubber, mask_file
from engine.spec.plan import masking, run_stamp
from engine.text import utc_second

LOG_TAIL_SEGMENTS = 4


class RecordError(Exception):
    """The run's record (evidence.json, a step's log) could not be written: a full disk (ENOSPC), a
    file-size limit (EFBIG), a quota (EDQUOT), or any other write error. The run stops and its
    verdict is ERROR; `result` is the leg's, when one was running."""

    def __init__(self, path: str | os.PathLike[str], error: OSError, result: Any = None) -> None:
        self.path, self.error, self.result = Path(path), error, result
        what = error.strerror or str(error)
        name = errno.errorcode.get(error.errno or 0)
        super().__init__(f"could not write {self.path}: {what}" + (f" ({name})" if name else ""))


class RunDirError(Exception):
    """The run directory cannot be used (a file, not writable, held by another engine, or holding
    another run)."""


# The file whose lock holds a run dir for one engine; it says who holds it (pid, host, start).
LOCK_NAME = ".engine.lock"


class RunDirLock:
    """A run dir held by this engine: an exclusive lock (flock) on LOCK_NAME in it, which the
    kernel lets go when the engine ends, however it ends, so a lock left by a killed engine is
    taken over at once. `took_over` names the gone engine whose lock file was there, if one was."""

    def __init__(self, path: Path, fd: int, took_over: str | None) -> None:
        self.path, self._fd, self.took_over = path, fd, took_over

    def release(self) -> None:
        """Let the run dir go: the lock file removed (while still ours), then unlocked."""
        if self._fd < 0:
            return
        try:
            if os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(self._fd).st_ino:
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = -1


def _holder(fd: int) -> str:
    """Who a lock file says holds it: `pid 4242 on host gpu-7, since 2026-12-02T07:01:02Z`."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        doc = json.loads(os.read(fd, 4096) or b"null")
        return f"pid {int(doc['pid'])} on host {doc['host']}, since {doc['started_at']}"
    except (OSError, ValueError, TypeError, KeyError):
        return "it has not said who it is yet"


def _take_lock(run_dir: Path) -> RunDirLock:
    """The run dir's lock, or RunDirError naming the engine that holds it."""
    path = run_dir / LOCK_NAME
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise RunDirError(
                f"--run-dir {run_dir}: cannot create its lock {LOCK_NAME}: {exc.strerror or exc}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise RunDirError(
                f"--run-dir {run_dir}: another engine is running in it ({holder}); wait for it to end, "
                f"or choose another run dir"
            ) from None
        try:  # its holder may have removed it between our open and our lock: lock the file there now
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        left = _holder(fd)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": utc_second(evidence.now_iso())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        took_over = None if left.startswith("it has not") else left
        return RunDirLock(path, fd, took_over)


def prepare_run_dir(run_dir: Path, force: bool = False, resuming: bool = False) -> RunDirLock:
    """Take the run directory for this engine before anything in it is touched (RunDirLock: a
    second engine is refused, naming the first), creating it; refuse one that holds files already
    unless `force` (a run would silently mix its evidence with theirs), and prove it writable.
    `resuming` (`engine run --from`): it must exist, and what it holds is the caller's to judge."""
    if run_dir.exists() or run_dir.is_symlink():
        if not run_dir.is_dir():
            raise RunDirError(f"--run-dir {run_dir}: exists and is not a directory")
    elif resuming:
        raise RunDirError(f"--run-dir {run_dir}: no such directory, so it holds no run to resume")
    else:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"--run-dir {run_dir}: cannot create it: {exc.strerror or exc}") from None
    lock = _take_lock(run_dir)
    if resuming:
        return lock
    try:
        _refuse_a_used_dir(run_dir, force)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".writable.", dir=run_dir)
        os.close(fd)
        os.unlink(probe)
    except (OSError, ValueError) as exc:
        lock.release()
        raise RunDirError(f"--run-dir {run_dir}: cannot write there: {getattr(exc, 'strerror', None) or exc}") from None
    except RunDirError:
        lock.release()
        raise
    return lock


def _refuse_a_used_dir(run_dir: Path, force: bool) -> None:
    try:
        entries = sorted(e for e in os.listdir(run_dir) if e != LOCK_NAME)
    except OSError as exc:
        raise RunDirError(f"--run-dir {run_dir}: cannot list it: {exc.strerror or exc}") from None
    if entries and not force:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise RunDirError(
            f"--run-dir {run_dir}: exists and is not empty ({shown}); choose "
            f"another, empty it, or pass --force to run into it (the run's "
            f"evidence.json and logs replace theirs, other files stay)"
        )


def _new_file(path: Path) -> BinaryIO:
    """A new, empty file at `path`, created, never opened through what is there: an earlier leg
    may have left a symlink at a later step's log name, which `open(path, "wb")` would follow
    and truncate."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o666), "wb")


class CappedLog:
    """A leg's raw log on disk, bounded: its first `head` bytes, then, once those are written, its
    most recent output in rotating segment files beside it (`<log>.tail-NNNN`, at most `tail`
    bytes together), appended to the log with a marker line saying what was dropped when the log
    is closed. A killed engine leaves the head and the segments, each complete up to its last read.
    `on_close(path, sha256)` hears of the file as closed, whole."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        head: int = limits.LOG_HEAD_BYTES,
        tail: int = limits.LOG_TAIL_BYTES,
        on_close: Callable[[Path, bytes], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh: BinaryIO = _new_file(self.path)
        self.head, self.tail = head, tail
        self.segment_max = max(tail // LOG_TAIL_SEGMENTS, 1)
        self.size = 0
        self.segments: deque[list[Any]] = deque()  # [path, file, bytes, lines]
        self.serial = 0
        self.dropped_bytes = self.dropped_lines = 0
        self.error: OSError | None = None  # the first write that failed (a full disk): nothing after it
        self.digest, self.on_close = hashlib.sha256(), on_close

    def _put(self, data: bytes) -> None:
        self.fh.write(data)
        if self.on_close is not None:
            self.digest.update(data)

    def write(self, data: bytes) -> None:
        """Append whole lines."""
        if not self.segments:
            if self.size + len(data) <= self.head:
                self._put(data)
                self.fh.flush()
                self.size += len(data)
                return
            cut = data.rfind(b"\n", 0, self.head - self.size) + 1  # whole lines only
            self._put(data[:cut])
            self.fh.flush()
            self.size += cut
            data = data[cut:]
            self._new_segment()
        while data:
            # At most one segment's worth, in whole lines (a longer line goes alone).
            piece = data[: self.segment_max]
            if len(piece) < len(data):
                end = piece.rfind(b"\n") + 1 or data.find(b"\n", len(piece)) + 1 or len(data)
                piece = data[:end]
            data = data[len(piece) :]
            segment = self.segments[-1]
            if segment[2] and segment[2] + len(piece) > self.segment_max:
                segment = self._new_segment()
            segment[1].write(piece)
            segment[2] += len(piece)
            segment[3] += piece.count(b"\n")
        self.segments[-1][1].flush()

    def _new_segment(self) -> list[Any]:
        if len(self.segments) == LOG_TAIL_SEGMENTS:
            path, fh, size, lines = self.segments.popleft()
            fh.close()
            path.unlink(missing_ok=True)
            self.dropped_bytes += size
            self.dropped_lines += lines
        self.serial += 1
        path = self.path.with_name(f"{self.path.name}.tail-{self.serial:04d}")
        self.segments.append([path, _new_file(path), 0, 0])
        return self.segments[-1]

    def close(self) -> None:
        """Append the tail to the head and close; a write that fails is kept in `error` (the
        segments then stay beside the log, each complete up to its last write)."""
        try:
            self._close()
        except OSError as exc:
            self.error = self.error or exc
            for fh in [self.fh] + [segment[1] for segment in self.segments]:
                try:
                    fh.close()
                except OSError:
                    pass

    def _close(self) -> None:
        if self.dropped_bytes:
            self._put(
                f"[specprobe: {self.dropped_lines:,} lines ({self.dropped_bytes:,} bytes) of this "
                f"log dropped here; a log keeps its first {self.head:,} bytes and its last "
                f"{self.tail:,} at most]\n".encode()
            )
        for path, fh, _, _ in self.segments:
            fh.close()
            with open(path, "rb") as src:
                while chunk := src.read(1 << 20):
                    self._put(chunk)
            path.unlink(missing_ok=True)
        self.segments.clear()
        self.fh.close()
        if self.on_close is not None:
            self.on_close(self.path, self.digest.digest())

    def write_text(self, text: str) -> None:
        """Append whole lines; after a write that failed (a full disk, a file-size limit) the log
        takes nothing more, and `error` says why."""
        if self.error is not None:
            return
        try:
            self.write(text.encode("utf-8", errors="replace"))
        except OSError as exc:
            self.error = exc


class LegLog:
    """The file a leg's output streams into (engine/run/process.py writes through it), masked on
    the way in: each chunk of whole lines (`lines`), and the head of a line cut at the line limit
    (`cut`), whose end may hold the first part of a secret. What they return is what was kept, and
    the only text of the leg anyone else sees (the harvest, the console, the signal rules).
    `path` None keeps nothing; `mask` None masks nothing (a command run outside any run)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        mask: Mask | None = None,
        log_limits: tuple[int, int] = (limits.LOG_HEAD_BYTES, limits.LOG_TAIL_BYTES),
        on_close: Callable[[Path, bytes], None] | None = None,
    ) -> None:
        self.mask = mask
        self.file: CappedLog | None = None
        if path is not None:
            try:
                self.file = CappedLog(path, *log_limits, on_close=on_close)
            except OSError as exc:
                raise RecordError(path, exc) from None

    @property
    def path(self) -> Path | None:
        return self.file.path if self.file is not None else None

    def failure(self, result: Any = None) -> RecordError | None:
        """Why the log could not be kept (its first write that failed: a full disk), as the run's
        error carrying the leg's `result`; None while it is kept. The log takes nothing after it."""
        if self.file is None or self.file.error is None:
            return None
        return RecordError(self.file.path, self.file.error, result)

    def lines(self, text: str) -> str:
        """Whole lines, each ending in a newline: masked, appended; what was kept."""
        return self._keep(self.mask.scrub(text) if self.mask is not None else text)

    def cut(self, head: str) -> str:
        """The head of a line over the line limit: masked (a secret straddling the cut is redacted
        whole, however short its piece), marked as cut, appended as one line; what was kept."""
        if self.mask is not None:
            head = self.mask.scrub_cut(head)
        return self._keep(head.replace("\n", " ") + limits.CUT_MARKER + "\n")

    def _keep(self, text: str) -> str:
        if self.file is not None:
            self.file.write_text(text)
        return text

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class Record:
    """One run's (or one re-check's) way out: what it says, stores and logs, masked by the plan's
    secret filter. `console` is where a line said goes (the terminal, a re-check's notes)."""

    def __init__(self, run_dir: Path, mask: Scrubber, console: Callable[[str], None]) -> None:
        self.run_dir, self.console = run_dir, console
        self._mask = mask
        self._reaper_told = False
        self.stored = False  # whether an evidence.json of this run was ever written

    @classmethod
    def open(
        cls,
        run_dir: str | os.PathLike[str],
        plan: PlanSecrets,
        environ: Mapping[str, str],
        console: Callable[[str], None],
    ) -> Record:
        """The record of a run of `plan` in `run_dir`, masked with the secrets of the plan and of
        `environ` (the environment the legs inherit, or a re-check runs in). Nothing is written yet."""
        return cls(Path(run_dir), masking(plan, environ), console)

    @cached_property
    def _files(self) -> TreeScrubber:
        # Legs write into the run dir too (torchrun's per-rank logs hold the environment and the
        # exception message): every file there is masked after every step.
        return TreeScrubber(self.run_dir, self._mask.secrets)

    def mask(self, obj: Any) -> Any:
        """`obj` (text, or a JSON-like document) as the record lets it out. For what the caller must
        cut or render after masking: a diagnostics tail line is masked before it is cut (cut first,
        a secret across the cut would leave a piece), a re-check's document before it is shown."""
        return self._mask.scrub_obj(obj)

    def say(self, text: str) -> None:
        """A console line."""
        self.console(self.mask(text))

    def save(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """evidence.json, rewritten atomically; what was stored. RecordError when it cannot be
        written: the file keeps its last complete version."""
        stored = self.mask(doc)
        try:
            evidence.write(self.run_dir, stored)
        except OSError as exc:
            raise RecordError(evidence.path_of(self.run_dir), exc) from None
        self.stored = True
        return stored

    def failed(self, doc: dict[str, Any], exc: RecordError, step: str | None) -> None:
        """A write failed (a full disk): the run stops here, and `doc` says so, naming the file, the
        step and whether an evidence.json was ever stored; a judge then makes its verdict ERROR.
        evidence.json keeps its last complete version."""
        doc["record_error"] = {"path": str(exc.path), "error": str(exc), "step": step, "stored": self.stored}
        self.say(f"ERROR: {exc}; the run stops{f' at {step}' if step else ''}, later steps not run")

    def write(self, kind: str, doc: Mapping[str, Any]) -> Path:
        """A re-check's record as `<kind>-<stamp>.json` beside the evidence (never in it): `-2`,
        `-3`, ... when one exists, so two re-checks in one second both stay. RecordError when it
        cannot be written."""
        stamp = run_stamp()
        path, n = self.run_dir / f"{kind}-{stamp}.json", 1
        while path.exists():
            n += 1
            path = self.run_dir / f"{kind}-{stamp}-{n}.json"
        try:
            return evidence.write_document(path, evidence.dumps(self.mask(doc)) + "\n")
        except OSError as exc:
            raise RecordError(path, exc) from None

    def leg_log(self, relative: str) -> LegLog:
        """The log a leg's output streams into, at `relative` under the run dir. From the first
        one on, the reaper knows the run dir: should the engine die while a leg writes into it, the
        reaper masks what the legs left there. RecordError when the log cannot be created."""
        if not self._reaper_told:
            self._reaper_told = True
            self._tell_reaper(lambda reaper: reaper.scrub_at_end(self.run_dir, self._mask.secrets))
        # The log is written through the secret filter: the run-dir pass need not search it again
        # while its bytes are what the engine wrote (a leg that rewrites it changes that).
        vouch = self._files.vouch if self._files.finder else None
        return LegLog(self.run_dir / relative, self._mask, on_close=vouch)

    def check_copy(self, path: str | os.PathLike[str]) -> bool:
        """A file the engine copied into the run dir (a snapshot), looked at once by the secret
        filter: clean, it is vouched for (never searched or rewritten again while its bytes stay);
        holding a secret, it is masked like any file here. True when it held one."""
        if not self._files.finder:
            return False
        checked = mask_file(path, self._files.finder)
        if checked.digest is not None:
            self._files.vouch(path, checked.digest)
        return checked.masked > 0

    def mask_files(self, deadline: float | None = None) -> list[str]:
        """Mask every secret in the files under the run dir and in their names, saying which held
        one; their paths, relative to the run dir. What could not be checked (by `deadline`, a
        time.monotonic()) is said too, and named by `unchecked` until a later pass checks it."""
        files = self._files
        found = files.scrub(deadline)
        for path in files.renamed:
            self.say(f"   renamed {path}: its name held a secret")
        for path in found:
            self.say(f"   masked a secret in {path}")
        for path, why in files.problems.items():
            self.say(f"   WARNING: could not check for secrets (it may hold one): {path}: {why}")
        if files.seconds >= limits.SCRUB_SAY_S:
            self.say(
                f"   checked the run dir for secrets in {files.seconds:.1f} s: {files.files_read:,} files "
                f"read ({files.bytes_read / 1e6:,.1f} MB)"
            )
        return found

    @property
    def unchecked(self) -> list[str]:
        """`path: why` of each file under the run dir the last pass could not check for secrets."""
        return [f"{path}: {why}" for path, why in self._files.problems.items()] if "_files" in self.__dict__ else []

    def after_step(self, step: Mapping[str, Any], record: dict[str, Any], started: float) -> None:
        """The run dir masked after a step, within the step's time: a leg's timeout and grace
        (the worst case the budget counts for it), but at least limits.SCRUB_MIN_S from now. The
        step's `record` says what held a secret and what the pass took (`scrub_s`)."""
        run = step.get("run") if isinstance(step.get("run"), Mapping) else {}
        deadline = None
        if run and run.get("timeout_s"):
            allowed = started + float(run["timeout_s"]) + float(run.get("grace_s") or 0)
            deadline = max(allowed, time.monotonic() + limits.SCRUB_MIN_S)
        found = self.mask_files(deadline)
        if found:
            record["secrets_masked_in"] = found
        if self._files.renamed:
            record["names_masked"] = list(self._files.renamed)
        record["scrub_s"] = round(self._files.seconds, 3)

    def finish(self, doc: dict[str, Any]) -> None:
        """The end of the run, before it is judged: the files the legs left, masked (within
        limits.SCRUB_MIN_S); those that could not be checked are named in `doc` (`unscrubbed`),
        and the verdict is then ERROR: a run dir that may hold a secret is never a pass."""
        self.mask_files(time.monotonic() + limits.SCRUB_MIN_S)
        unchecked = self.unchecked
        if unchecked:
            doc["unscrubbed"] = unchecked
        else:
            doc.pop("unscrubbed", None)

    def close(self) -> None:
        """The run is over: the reaper told it need not mask the run dir (`finish` did)."""
        if self._reaper_told:
            self._tell_reaper(lambda reaper: reaper.scrubbed(self.run_dir))

    def _tell_reaper(self, message: Callable[[Reaper], None]) -> None:
        try:
            message(Reaper.get())
        except (RuntimeError, OSError) as exc:
            # The run itself is not at stake, only the cleanup after a killed engine: say so.
            self.say(
                f"WARNING: {exc}; should the engine be killed, the run dir's files keep "
                f"what secrets the legs wrote into them"
            )
