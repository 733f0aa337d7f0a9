"""One writer per store: a lease (``lease.json`` in the repo) claimed, renewed and released by compare-and-swap.

Two trainers writing one store (an orphaned leg still running, a second notebook) would interleave their
pushes and move the pointer backwards. So every write of the checkpoint protocol goes through a
:class:`Lease`:

- ``acquire()`` reads the head revision and ``lease.json``; when nobody holds it, or the holder's lease is
  stale, it commits its own ``lease.json`` with ``expect_revision`` = that head (the store's compare-and-swap:
  the Hub's ``parent_commit``, the local store's revision check under its lock). Of two writers racing, one
  commit lands and the other gets ``Conflict``, re-reads, and finds the lease held: :class:`LeaseHeld`, naming
  the holder (writer id, host, pid, expiry).
- ``commit()`` is every protocol write: the same compare-and-swap, after checking that the lease is still this
  writer's (:class:`LeaseLost` otherwise, so a writer whose lease expired and was taken over stops before it
  moves the pointer). When the lease is due for renewal the renewed ``lease.json`` rides in the same commit.
- A heartbeat thread renews the lease between pushes (when less than half its time is left), so a
  long stretch of training without a push does not let it expire. The TTL must outlast the longest push.
- ``release()`` deletes ``lease.json`` (a finished or failed session); a killed one leaves it behind. The store
  retries the release like any write (an outage waited out: trainer/store/hub_settings.py); one that still fails
  says until when ``lease.json`` names this writer, and who can take over then.

A lease is stale when it expired (``expires`` is the holder's wall clock plus its TTL; clocks of different
machines are trusted to within the TTL) or, at once, when its holder provably ran where this process can see
its processes and that process is gone: the same host name, kernel boot id and PID namespace (containers on
one host share the first two and number their processes apart), and this process's ``/proc`` showing its own
namespace. A killed leg resumed on the same machine does not wait for expiry; a holder in another container,
or one whose lease predates the namespace field, is taken over only after expiry.

A malformed ``lease.json`` is refused, never taken over: deleting it is a human's call. Malformed includes
every field of the wrong type or out of range (times outside 1970..9999, a TTL outside (0, 7 days], an expiry
further than its TTL past its renewal, a pid past the kernel's limit, a name with a control character).

The TTL is ``SPECPROBE_LEASE_TTL_S`` (default 900 s, at most 7 days). The writer id is per process: two Lease
objects in one process are the same writer. ``release()`` ends the lease for good: a write after it raises
:class:`LeaseLost` instead of claiming the lease again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, ContextManager, Mapping, Sequence

from trainer.store.fields import TIME_MAX, FieldError, Fields, load_doc
from trainer.store.protocol import Conflict, EntryMissing, Store, StoreError, file_of_bytes, redact_url

__all__ = [
    "LEASE_PATH",
    "LEASE_FORMAT",
    "DEFAULT_TTL_S",
    "LeaseHeld",
    "LeaseLost",
    "Writer",
    "LeaseDoc",
    "Lease",
    "parse_lease",
]

LEASE_PATH = "lease.json"
LEASE_FORMAT = "specprobe-lease/1"
DEFAULT_TTL_S = 900.0
MAX_TTL_S = 7 * 24 * 3600.0  # a lease nobody renews for a week is stale by any measure
_PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT
_LEASE_MAX_BYTES = 64 << 10
_PID_NS = re.compile(r"^(pid:\[\d{1,20}\])?$")
_DIGITS = re.compile(r"^\d{0,20}$")
_CAS_TRIES = 8  # compare-and-swap rounds before giving up (each lost round means another commit landed)
CLOCK_SKEW_S = 60.0  # two clocks kept by NTP agree far closer; a lease renewed further in the future is news


class LeaseHeld(StoreError):
    """Another live writer holds the store's lease."""


class LeaseLost(StoreError):
    """This writer's lease is gone (expired and taken over, or deleted): it must not write any more."""


@dataclass(frozen=True)
class Writer:
    id: str
    host: str
    boot_id: str  # the kernel's boot id: with the host name, "the same machine, the same boot"
    pid: int
    pid_start: str  # the process's start time in clock ticks (/proc/<pid>/stat): a reused pid differs
    pid_ns: str = ""  # its PID namespace ("pid:[4026531836]"): containers on one host number pids apart

    @property
    def here(self) -> bool:
        """Whether this process can see the writer's process in /proc: the same machine and boot, the same
        PID namespace, and a /proc that shows this namespace (not one mounted from another)."""
        me = this_writer()
        same = (self.host, self.boot_id, self.pid_ns) == (me.host, me.boot_id, me.pid_ns)
        return bool(self.boot_id) and bool(self.pid_ns) and same and _proc_shows_own_namespace()


_WRITER: dict[int, Writer] = {}


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3, the state, first); None if absent."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _pid_namespace() -> str:
    """This process's PID namespace as the kernel names it (``pid:[inode]``); "" where it cannot be read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _proc_shows_own_namespace() -> bool:
    """/proc is mounted for this process's PID namespace: /proc/self names this process by its own pid (after
    ``unshare --pid`` without a new /proc it names the pid the parent namespace sees)."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def this_writer() -> Writer:
    """This process as a writer (one id per process; a forked child gets its own)."""
    pid = os.getpid()
    if pid not in _WRITER:
        try:
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            boot = ""
        stat = _proc_stat(pid)
        host = socket.gethostname()
        _WRITER[pid] = Writer(
            id=f"{host}:{pid}:{uuid.uuid4().hex[:8]}",
            host=host,
            boot_id=boot,
            pid=pid,
            pid_start=stat[19] if stat else "",
            pid_ns=_pid_namespace(),
        )
    return _WRITER[pid]


def _gone(w: Writer) -> bool:
    """The holder ran on this machine and its process no longer exists (or is a zombie, or the pid was reused)."""
    if not w.here:
        return False
    stat = _proc_stat(w.pid)
    return stat is None or stat[0] in ("Z", "X") or bool(w.pid_start) and stat[19] != w.pid_start


@dataclass(frozen=True)
class LeaseDoc:
    writer: Writer
    acquired: float  # unix seconds, the holder's clock
    renewed: float
    expires: float
    ttl_s: float

    def to_json(self) -> dict:
        return {"format": LEASE_FORMAT, **asdict(self), "expires_utc": _iso(self.expires)}


def parse_lease(raw: bytes, where: str) -> LeaseDoc:
    """Parse lease.json, every field typed and bounded; ValueError naming ``where`` and the field."""
    try:
        doc = load_doc(raw, where, max_bytes=_LEASE_MAX_BYTES)
        if doc.get("format") != LEASE_FORMAT:
            raise FieldError(f"format {doc.get('format')!r:.80}, expected {LEASE_FORMAT}")
        f = Fields(doc, where)
        w = f.obj("writer")
        writer = Writer(
            id=w.str("id", max_len=256),
            host=w.str("host", max_len=256),
            boot_id=w.str("boot_id", max_len=64),
            pid=w.int("pid", 1, _PID_MAX),
            pid_start=w.str("pid_start", _DIGITS),
            pid_ns=w.str("pid_ns", _PID_NS, default=""),
        )
        lease = LeaseDoc(
            writer=writer,
            acquired=f.number("acquired", 0, TIME_MAX),
            renewed=f.number("renewed", 0, TIME_MAX),
            expires=f.number("expires", 0, TIME_MAX),
            ttl_s=f.number("ttl_s", 0, MAX_TTL_S),
        )
        if not lease.ttl_s > 0:
            raise f.fail("ttl_s", f"{lease.ttl_s!r} is out of range (0, {MAX_TTL_S:.0f}]")
        if lease.expires > lease.renewed + lease.ttl_s + 1:  # a writer renews to now + its TTL, never further
            raise f.fail(
                "expires", f"{lease.expires:.0f} is more than ttl_s {lease.ttl_s:g} past renewed {lease.renewed:.0f}"
            )
        return lease
    except FieldError as e:
        raise ValueError(f"{where} is not a valid lease ({str(e).removeprefix(where).lstrip(': ')})") from None


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _clock_ahead(doc: LeaseDoc, now: float) -> str:
    """What to say when a lease was renewed later than this machine's clock reads now: the holder's clock is
    ahead (or this one behind), and the expiry, written by the holder's clock, lies that much further out than
    its TTL. "" when the two clocks agree to within CLOCK_SKEW_S."""
    ahead = doc.renewed - now
    if ahead <= CLOCK_SKEW_S:
        return ""
    return (
        f". The holder's clock is ahead of this machine's: it renewed the lease at {_iso(doc.renewed)} by its "
        f"clock, {ahead:.0f}s after now by this machine's ({_iso(now)}); by its own clock the lease expires "
        f"{doc.expires - doc.renewed:.0f}s after that renewal, by this one's in {doc.expires - now:.0f}s. Set "
        f"the clock of host {doc.writer.host} right (or this machine's, if it is the one behind). If that "
        f"trainer is gone, delete {LEASE_PATH} from the repo to take the store over now"
    )


def checked_ttl(ttl: float, what: str, shown: str | None = None) -> float:
    """``ttl`` when it is a number of seconds in (0, MAX_TTL_S] (not NaN, not inf); ValueError naming ``what``
    and the value (``shown``: as written) otherwise."""
    if not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or not 0 < ttl <= MAX_TTL_S:
        raise ValueError(f"{what} must be a number of seconds in (0, {MAX_TTL_S:.0f}], got {shown or repr(ttl)}")
    return float(ttl)


def ttl_from_env(environ: Mapping[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    raw = env.get("SPECPROBE_LEASE_TTL_S")
    if not raw:
        return DEFAULT_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = -1.0
    return checked_ttl(ttl, "SPECPROBE_LEASE_TTL_S", repr(raw))


class Lease:
    """This process's lease on one store (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        ttl_s: float | None = None,
        log: Callable[[str], None] = print,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.ttl_s = checked_ttl(ttl_s, "the lease TTL") if ttl_s is not None else ttl_from_env()
        self.me = this_writer()
        self._log = log
        self._clock = clock
        self._doc: LeaseDoc | None = None  # ours, as last committed
        self._lock = threading.RLock()  # one protocol write or renewal at a time
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._lost: LeaseLost | None = None  # what the heartbeat found, raised by the next write
        self._released = False  # release() ran: the session is over, nothing claims the lease again

    @property
    def url(self) -> str:
        return redact_url(self.store.url)

    @property
    def held(self) -> bool:
        return self._doc is not None

    # -- reading ------------------------------------------------------------------------------------
    def _read(self) -> tuple[str, LeaseDoc | None]:
        """(head revision, lease there). The revision is read first: if a commit lands between the two reads,
        the compare-and-swap on that revision fails and the caller reads again."""
        rev = self.store.revision()
        try:
            raw = self.store.read_bytes(LEASE_PATH)
        except EntryMissing:
            return rev, None
        try:
            return rev, parse_lease(raw, f"{LEASE_PATH} in {self.url}")
        except ValueError as e:
            raise StoreError(
                f"{e}; refusing to guess whether another trainer writes this store. If none does, "
                f"delete {LEASE_PATH} from the repo."
            ) from None

    def _stale(self, doc: LeaseDoc) -> str | None:
        now = self._clock()
        if doc.expires <= now:
            return f"it expired {now - doc.expires:.0f}s ago ({_iso(doc.expires)})"
        if _gone(doc.writer):
            return f"its process {doc.writer.pid} on this machine is gone"
        return None

    def describe(self, doc: LeaseDoc) -> str:
        w = doc.writer
        now = self._clock()
        return (
            f"writer {w.id} (host {w.host}, pid {w.pid}), acquired {_iso(doc.acquired)}, renewed "
            f"{_iso(doc.renewed)}, expires {_iso(doc.expires)} (in {doc.expires - now:.0f}s)"
        ) + _clock_ahead(doc, now)

    # -- writing ------------------------------------------------------------------------------------
    @staticmethod
    def _file(doc: LeaseDoc) -> ContextManager[Path]:
        """``doc`` as a lease.json file to commit, gone with the process however it ends (file_of_bytes)."""
        return file_of_bytes(LEASE_PATH, (json.dumps(doc.to_json(), indent=1, sort_keys=True) + "\n").encode())

    def _cas_write(self, doc: LeaseDoc, rev: str, message: str) -> bool:
        """Commit ``doc`` as lease.json on revision ``rev`` only (compare-and-swap); False when another
        commit came first and nothing was committed."""
        try:
            with self._file(doc) as path:
                self.store.commit({LEASE_PATH: path}, expect_revision=rev, message=message)
        except Conflict:
            return False
        return True

    def _new_doc(self) -> LeaseDoc:
        now = self._clock()
        acquired = self._doc.acquired if self._doc is not None else now
        return LeaseDoc(writer=self.me, acquired=acquired, renewed=now, expires=now + self.ttl_s, ttl_s=self.ttl_s)

    def acquire(self) -> None:
        """Claim the lease (or confirm it is ours). LeaseHeld when another live writer holds it."""
        with self._lock:
            self._refuse_after_release()
            for _ in range(_CAS_TRIES):
                rev, doc = self._read()
                taken = ""
                if doc is not None and doc.writer.id == self.me.id and doc.expires - self._clock() >= self.ttl_s / 2:
                    self._doc, self._lost = doc, None  # this process holds it already (another Lease object)
                    self._start_heartbeat()
                    return
                if doc is not None and doc.writer.id != self.me.id:
                    stale = self._stale(doc)
                    if stale is None:
                        raise LeaseHeld(
                            f"{self.url} is being written by another trainer: {LEASE_PATH} names "
                            f"{self.describe(doc)}. Two writers would fork the run (the pointer could move "
                            "backwards). Stop that trainer, or wait until its lease expires; a holder that died "
                            "on this machine is detected at once."
                        )
                    taken = f" (took over from {doc.writer.id}: {stale})"
                mine = self._new_doc()
                if not self._cas_write(mine, rev, f"lease acquired\nwriter: {self.me.id}{taken}"):
                    continue
                self._doc, self._lost = mine, None
                self._log(
                    f"lease: {self.me.id} holds {self.url} until {_iso(mine.expires)} (ttl {self.ttl_s:.0f}s){taken}"
                )
                self._start_heartbeat()
                return
            raise StoreError(
                f"{self.url}: could not claim {LEASE_PATH} in {_CAS_TRIES} compare-and-swap rounds: "
                "the repo kept changing under it (another writer?)"
            )

    def _due(self, share: float) -> bool:
        """Less than ``share`` of the TTL left. Writes renew from 2/3 on (a long upload must not outlast the
        lease), the heartbeat from 1/2; so the TTL must be longer than the longest push takes."""
        return self._doc is None or self._doc.expires - self._clock() < self.ttl_s * share

    def commit(self, add: Mapping[str, Path], delete: Sequence[str] = (), message: str = "") -> str:
        """One protocol write, landed only while the lease is this writer's (renewing it when due)."""
        with self._lock:
            self._refuse_after_release()
            if self._lost is not None:
                raise self._lost
            if self._doc is None:
                self.acquire()
            for _ in range(_CAS_TRIES):
                rev, doc = self._read()
                self._check_mine(doc)
                files = dict(add)
                renewed = self._new_doc() if self._due(2 / 3) else None
                with contextlib.ExitStack() as lease_file:
                    if renewed is not None:
                        files[LEASE_PATH] = lease_file.enter_context(self._file(renewed))
                    try:
                        out = self.store.commit(files, delete, message=message, expect_revision=rev)
                    except Conflict:
                        continue
                if renewed is not None:
                    self._doc = renewed
                return out
            raise StoreError(
                f"{self.url}: a write lost {_CAS_TRIES} compare-and-swap rounds in a row: the repo "
                "kept changing under it (another writer?); nothing of it was committed"
            )

    def _refuse_after_release(self) -> None:
        if self._released:
            raise LeaseLost(f"{self.url}: this trainer ({self.me.id}) released its lease; it writes no more")

    def _check_mine(self, doc: LeaseDoc | None) -> None:
        if doc is None or doc.writer.id != self.me.id:
            now = "nobody holds it now" if doc is None else f"it is held by {self.describe(doc)}"
            self._doc = None
            self._lost = LeaseLost(
                f"{self.url}: this trainer ({self.me.id}) lost its lease: {now}. Another "
                "writer may be using the store; this one stops writing."
            )
            raise self._lost

    def renew(self) -> None:
        """Push the expiry out by a TTL (the heartbeat calls this; LeaseLost when it is no longer ours). After
        release() it does nothing: a heartbeat that woke as the session ended has nothing left to keep."""
        with self._lock:
            if self._released:
                return
            if self._lost is not None:
                raise self._lost
            for _ in range(_CAS_TRIES):
                rev, doc = self._read()
                self._check_mine(doc)
                renewed = self._new_doc()
                if not self._cas_write(renewed, rev, f"lease renewed\nwriter: {self.me.id}"):
                    continue
                self._doc = renewed
                return
            raise StoreError(f"{self.url}: renewing the lease lost {_CAS_TRIES} compare-and-swap rounds in a row")

    def release(self) -> None:
        """Delete lease.json if it is still ours (a no-op when this writer never held it). From then on this
        Lease writes nothing: no write claims it again, not even a push thread still running."""
        self._released = True
        self._stop.set()
        if self._beat is not None and self._beat.is_alive():  # not started: an interrupt landed in its start
            self._beat.join(timeout=60)
        with self._lock:
            if self._doc is None:
                return
            try:
                self._release_once()
            except LeaseLost:
                raise
            except StoreError as e:  # the store kept failing (its retries, an outage waited out, included)
                doc = self._doc
                raise StoreError(
                    f"{e}; {LEASE_PATH} still names this trainer ({self.me.id}) until {_iso(doc.expires)} (in "
                    f"{doc.expires - self._clock():.0f}s): another writer can take the store over then, or at once "
                    "on this machine once this process has ended"
                ) from e

    def _release_once(self) -> None:
        """The release's compare-and-swap rounds (the caller holds the lock and a lease)."""
        for _ in range(_CAS_TRIES):
            rev, doc = self._read()
            if doc is None or doc.writer.id != self.me.id:
                self._doc = None
                self._log(f"lease: not released, {LEASE_PATH} in {self.url} is no longer {self.me.id}'s")
                return
            try:
                self.store.commit(
                    {}, delete=[LEASE_PATH], expect_revision=rev, message=f"lease released\nwriter: {self.me.id}"
                )
            except Conflict:
                continue
            self._doc = None
            self._log(f"lease: {self.me.id} released {self.url}")
            return
        raise StoreError(f"{self.url}: releasing the lease lost {_CAS_TRIES} compare-and-swap rounds in a row")

    # -- heartbeat ----------------------------------------------------------------------------------
    def _start_heartbeat(self) -> None:
        if self._beat is not None and self._beat.is_alive():
            return
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="lease-heartbeat", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl_s / 6):
            if not self._due(1 / 2):
                continue
            try:
                self.renew()
            except LeaseLost as e:
                self._log(f"lease: LOST: {e}")
                return
            except (StoreError, OSError) as e:  # a network hiccup: the next beat (or push) tries again
                self._log(f"lease: renewal failed, will retry: {type(e).__name__}: {e}")
