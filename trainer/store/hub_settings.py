"""The Hub client's knobs: how often a failed call is tried again, how long it waits between tries, and how long
one HTTP request may wait to connect and for each answer. Standard library only, so a process that never talks to
the Hub (a local store, the engine loading the collector) pays nothing for reading them.

Each knob has one environment variable, read once: ``python -m trainer.train`` builds :meth:`HubSettings.from_env`
in main (a value out of range stops the run before any work, exit 2, naming the variable), prints
:meth:`HubSettings.line` for a Hub store and hands the settings to the store it opens; other callers
(``trainer.collector``, ``trainer.mix``) get the same reading from :class:`trainer.store.hub.HubStore`'s default.

==================================  =========  =========================================================
variable                            default    what it bounds
==================================  =========  =========================================================
``SPECPROBE_HUB_RETRIES``           6          tries of one Hub operation, the first included (1..100)
``SPECPROBE_HUB_BACKOFF_S``         1          the first wait between tries; each next one doubles, up to
                                               32 times this (at most 30 s by default)
``SPECPROBE_HUB_CONNECT_TIMEOUT_S`` 30         seconds to open a connection (and, on ``requests``, to send
                                               each block of a request body)
``SPECPROBE_HUB_READ_TIMEOUT_S``    300        seconds to wait for each part of an answer: a commit's answer
                                               after its body was sent, the storage's answer after an LFS part
==================================  =========  =========================================================

Why 300 s: an answer that never comes is only known as lost when the read times out, and the commit is then
settled by reading the history back (trainer/store/hub.py); until then nothing moves. The Hub answers a commit
once it has checked every LFS object the commit names, and storage answers a part upload once it has the whole
part (multi-part uploads send parts of tens to hundreds of MB), which can take minutes for a large checkpoint on
a busy Hub, never hours.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

__all__ = ["HubSettings", "RetryPolicy", "Timeouts", "ENV"]

ENV = {
    "retries": "SPECPROBE_HUB_RETRIES",
    "backoff": "SPECPROBE_HUB_BACKOFF_S",
    "connect": "SPECPROBE_HUB_CONNECT_TIMEOUT_S",
    "read": "SPECPROBE_HUB_READ_TIMEOUT_S",
}
_MAX_SECONDS = 86_400.0  # a day: anything longer is a typo, and float('inf') would wait forever


@dataclass
class RetryPolicy:
    """Bounded exponential backoff with jitter. ``sleep`` is injectable so tests can record the delays."""

    attempts: int = 6  # tries per operation, the first included
    base_s: float = 1.0
    max_s: float = 30.0
    jitter: float = 0.25  # each delay is scaled by a factor in [1 - jitter, 1]
    max_retry_after_s: float = 300.0  # a Retry-After beyond this is capped (never waits forever)
    verify_attempts: int = 3  # downloads whose bytes do not match the recorded hash
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    # Its own generator: the global `random` is training state (saved in rng.pt), which a retry must not move.
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "RetryPolicy":
        """The policy ``SPECPROBE_HUB_RETRIES`` / ``SPECPROBE_HUB_BACKOFF_S`` set (ValueError naming a bad one)."""
        return HubSettings.from_env(environ).retry

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed try number ``attempt`` (1-based)."""
        d = min(self.max_s, self.base_s * (2 ** (attempt - 1)))
        d *= 1.0 - self.rng.uniform(0.0, max(0.0, min(1.0, self.jitter)))
        if retry_after is not None:
            d = max(d, min(float(retry_after), self.max_retry_after_s))
        return d


@dataclass(frozen=True)
class Timeouts:
    """Seconds one HTTP request may wait: to connect, and for each read of its answer. Never None: a request
    without a bound waits forever for an answer that was lost."""

    connect_s: float = 30.0
    read_s: float = 300.0


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


@dataclass(frozen=True)
class HubSettings:
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)

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
        timeouts = Timeouts(
            connect_s=_seconds(env, "connect", Timeouts.connect_s, zero_ok=False),
            read_s=_seconds(env, "read", Timeouts.read_s, zero_ok=False),
        )
        return cls(retry=retry, timeouts=timeouts)

    def line(self) -> str:
        """The trainer's ``hub client:`` log line."""
        r, t = self.retry, self.timeouts
        return (
            f"hub client: {r.attempts} tries, backoff {r.base_s:g}s doubling up to {r.max_s:g}s, "
            f"timeouts connect {t.connect_s:g}s read {t.read_s:g}s "
            f"({', '.join(ENV.values())})"
        )
