"""The Hub client's knobs: how often a failed call is tried again and how long it waits between tries, how long one
HTTP request may wait to connect and for each answer, how slowly a transfer may go, and how long an outage is
waited out. Standard library only, so a process that never talks to the Hub (a local store, the engine loading
the collector) pays nothing for reading them.

Each knob has one environment variable, read once: ``python -m trainer.train`` builds :meth:`HubSettings.from_env`
in main (a value out of range stops the run before any work, exit 2, naming the variable), prints
:meth:`HubSettings.line` for a Hub store and hands the settings to the store it opens; other callers
(``trainer.collector``, ``trainer.data.mix``) get the same reading from :class:`trainer.store.hub.HubStore`'s default.

===================================  ========  ==========================================================
variable                             default   what it bounds
===================================  ========  ==========================================================
``SPECPROBE_HUB_RETRIES``            6         tries of one Hub operation, the first included (1..100)
``SPECPROBE_HUB_BACKOFF_S``          1         the first wait between tries; each next one doubles, up to
                                               32 times this (at most 30 s by default)
``SPECPROBE_HUB_CONNECT_TIMEOUT_S``  30        seconds to open a connection (and, on ``requests``, to send
                                               each block of a request body)
``SPECPROBE_HUB_READ_TIMEOUT_S``     300       seconds to wait for each part of an answer: a commit's answer
                                               after its body was sent, the storage's answer after an LFS part
``SPECPROBE_HUB_MIN_RATE_KB_S``      128       the slowest a transfer may go on average: one of N bytes must end
                                               within the read timeout plus N at this rate (a download counts
                                               the client's own resumed requests in it)
``SPECPROBE_HUB_PROGRESS_S``         30        a transfer still running says how far it got this often
``SPECPROBE_HUB_MAX_WAIT_S``         300       the longest any one wait lasts: a ``Retry-After`` (in seconds or
                                               an HTTP date) or a ``RateLimit`` reset is cut to it, the client's
                                               own waits included
``SPECPROBE_HUB_OUTAGE_S``           900       once an operation's tries are spent and every one failed
                                               transiently (no answer, 5xx, 429), it keeps trying, at the
                                               longest backoff, until this long after its first try; 0: never
``SPECPROBE_HUB_DEADLINE_S``         (none)    seconds after the process started by which every retry has ended:
                                               no wait is begun that would end past it (give a leg its timeout
                                               minus a margin for what follows the last push)
===================================  ========  ==========================================================

Why 300 s for a read: an answer that never comes is only known as lost when the read times out, and the commit is
then settled by reading the history back (trainer/store/hub.py); until then nothing moves. The Hub answers a
commit once it has checked every LFS object the commit names, and storage answers a part upload once it has the
whole part (multi-part uploads send parts of tens to hundreds of MB), which can take minutes for a large
checkpoint on a busy Hub, never hours. Why 900 s for an outage: the lease's default TTL (trainer/store/lease.py):
a session that waits out a longer outage could find its lease expired, and a push that fails loses the session's
work, so waiting is the better bet until then. The trainer's ranks wait for rank 0's push in a collective that
times out after 60 minutes (trainer/dist.py): an outage window past that is cut to 45 minutes.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

__all__ = ["HubSettings", "RetryPolicy", "Timeouts", "ENV", "DEFAULT_OUTAGE_S", "process_age_s"]

ENV = {
    "retries": "SPECPROBE_HUB_RETRIES",
    "backoff": "SPECPROBE_HUB_BACKOFF_S",
    "connect": "SPECPROBE_HUB_CONNECT_TIMEOUT_S",
    "read": "SPECPROBE_HUB_READ_TIMEOUT_S",
    "min_rate": "SPECPROBE_HUB_MIN_RATE_KB_S",
    "progress": "SPECPROBE_HUB_PROGRESS_S",
    "max_wait": "SPECPROBE_HUB_MAX_WAIT_S",
    "outage": "SPECPROBE_HUB_OUTAGE_S",
    "deadline": "SPECPROBE_HUB_DEADLINE_S",
}
_MAX_SECONDS = 86_400.0  # a day: anything longer is a typo, and float('inf') would wait forever
DEFAULT_OUTAGE_S = 900.0
_OUTAGE_MAX_S = 45 * 60.0  # under the ranks' 60-minute collective timeout (trainer/dist.py)


@dataclass
class RetryPolicy:
    """Bounded exponential backoff with jitter. ``sleep`` and ``clock`` are injectable so tests can record the
    delays and move time with them."""

    attempts: int = 6  # tries per operation, the first included
    base_s: float = 1.0
    max_s: float = 30.0
    jitter: float = 0.25  # each delay is scaled by a factor in [1 - jitter, 1]
    max_retry_after_s: float = 300.0  # the longest one wait lasts: a Retry-After beyond this is cut to it
    verify_attempts: int = 3  # downloads whose bytes do not match the recorded hash
    # Waiting out an outage after the tries are spent: off unless configured (HubSettings.from_env gives the
    # documented default), so a policy built by hand stops after its tries.
    outage_s: float = 0.0
    deadline: float | None = None  # a time on ``clock`` no wait may end past (None: none known)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    # Its own generator: the global `random` is training state (saved in rng.pt), which a retry must not move.
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "RetryPolicy":
        """The policy the ``SPECPROBE_HUB_*`` variables set (ValueError naming a bad one)."""
        return HubSettings.from_env(environ).retry

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed try number ``attempt`` (1-based)."""
        d = min(self.max_s, self.base_s * (2 ** (attempt - 1)))
        d *= 1.0 - self.rng.uniform(0.0, max(0.0, min(1.0, self.jitter)))
        if retry_after is not None:
            d = max(d, min(float(retry_after), self.max_retry_after_s))
        return d

    def outage_delay(self, retry_after: float | None = None) -> float:
        """The wait between two tries once the tries are spent: the longest backoff (or the server's capped
        Retry-After, when longer)."""
        d = self.max_s
        if retry_after is not None:
            d = max(d, min(float(retry_after), self.max_retry_after_s))
        return d

    def fits(self, wait: float) -> bool:
        """Whether a wait of ``wait`` seconds begun now ends by the deadline."""
        return self.deadline is None or self.clock() + wait <= self.deadline


@dataclass(frozen=True)
class Timeouts:
    """What one HTTP request may take: seconds to connect and for each read of its answer (never None: a request
    without a bound waits forever for an answer that was lost), and for its body the slowest average rate
    (``min_rate_kb_s``: a transfer of N bytes ends within ``read_s`` plus N at that rate) and how often a
    running transfer says how far it got."""

    connect_s: float = 30.0
    read_s: float = 300.0
    min_rate_kb_s: float = 128.0
    progress_s: float = 30.0

    def transfer_s(self, nbytes: int) -> float:
        """The longest a transfer of ``nbytes`` may take."""
        return self.read_s + nbytes / (self.min_rate_kb_s * 1024.0)


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0 where it cannot be read)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def _seconds(environ: Mapping[str, str], key: str, default: float, *, zero_ok: bool) -> float:
    name, raw = ENV[key], environ.get(ENV[key], "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (value >= 0 if zero_ok else value > 0) and value <= _MAX_SECONDS):
        kind = ">= 0" if zero_ok else "> 0"
        raise ValueError(f"{name}={raw!r}: must be a number of seconds {kind} and at most {_MAX_SECONDS:.0f}")
    return value


def _rate(environ: Mapping[str, str]) -> float:
    name, raw = ENV["min_rate"], environ.get(ENV["min_rate"], "").strip()
    if not raw:
        return Timeouts.min_rate_kb_s
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0.001 <= value <= 10_000_000):
        raise ValueError(f"{name}={raw!r}: must be a rate in KB/s from 0.001 to 10000000")
    return value


@dataclass(frozen=True)
class HubSettings:
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    deadline_s: float | None = None  # SPECPROBE_HUB_DEADLINE_S as given (seconds after the process started)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "HubSettings":
        """The settings the environment gives (module docstring); an unset or empty variable keeps the default.
        ValueError naming the variable for a value out of range (a typo, ``inf``, a negative time)."""
        env = os.environ if environ is None else environ
        retry = RetryPolicy()
        raw = env.get(ENV["retries"], "").strip()
        if raw:
            if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 100):
                raise ValueError(f"{ENV['retries']}={raw!r}: must be a whole number of tries from 1 to 100")
            retry.attempts = int(raw)
        if env.get(ENV["backoff"], "").strip():
            retry.base_s = _seconds(env, "backoff", retry.base_s, zero_ok=True)
            retry.max_s = max(retry.base_s, min(retry.max_s, retry.base_s * 32))
        retry.max_retry_after_s = _seconds(env, "max_wait", retry.max_retry_after_s, zero_ok=True)
        retry.outage_s = min(_OUTAGE_MAX_S, _seconds(env, "outage", DEFAULT_OUTAGE_S, zero_ok=True))
        deadline_s = _seconds(env, "deadline", 0.0, zero_ok=False) or None
        if deadline_s is not None:  # a time on the policy's clock: the process's start plus the knob
            retry.deadline = retry.clock() - process_age_s() + deadline_s
        timeouts = Timeouts(
            connect_s=_seconds(env, "connect", Timeouts.connect_s, zero_ok=False),
            read_s=_seconds(env, "read", Timeouts.read_s, zero_ok=False),
            min_rate_kb_s=_rate(env),
            progress_s=_seconds(env, "progress", Timeouts.progress_s, zero_ok=False),
        )
        return cls(retry=retry, timeouts=timeouts, deadline_s=deadline_s)

    def line(self) -> str:
        """The trainer's ``hub client:`` log line."""
        r, t = self.retry, self.timeouts
        deadline = f"deadline {self.deadline_s:g}s after the start" if self.deadline_s else "no deadline"
        return (
            f"hub client: {r.attempts} tries, backoff {r.base_s:g}s doubling up to {r.max_s:g}s, "
            f"timeouts connect {t.connect_s:g}s read {t.read_s:g}s, transfers at least {t.min_rate_kb_s:g} KB/s "
            f"(progress every {t.progress_s:g}s), waits at most {r.max_retry_after_s:g}s, outages waited out "
            f"for {r.outage_s:g}s, {deadline} ({', '.join(ENV.values())})"
        )
