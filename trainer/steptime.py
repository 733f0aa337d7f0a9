"""How long each training step takes, as the device runs it, without adding a sync to the loop.

The loop only syncs where it reads losses back (a log flush). On CUDA a timing event is recorded on the
current stream at the start of every step, and the events are read after such a flush, so a step's time is
what the GPU spent between two step starts (the bench's `step_ms_*` measure the same). The host's own clock
would say how fast Python queued the work, which under CUDA graphs runs far ahead of the device. On CPU the
host clock is the step's time. The session's first step (compile, warm-up) is left out of the figures.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class StepTimer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.ms: list[float] = []  # one per finished step, in order; the first is the session's first step
        self._marks: list[Any] = []  # CUDA events or perf_counter() stamps not yet turned into step times

    def mark(self) -> None:
        """At the start of every step, and once after the last."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def read(self) -> None:
        """Turn the marks so far into step times. Call it only where the device has caught up (after a
        flush): reading an event the GPU has not reached would block the loop."""
        if len(self._marks) < 2:
            return
        pairs = zip(self._marks, self._marks[1:])
        if self.cuda:
            self.ms += [a.elapsed_time(b) for a, b in pairs]
        else:
            self.ms += [1000.0 * (b - a) for a, b in pairs]
        self._marks = self._marks[-1:]

    def summary(self, tokens_per_step: int) -> dict[str, float | None]:
        """RUN_JSON's step figures over every step but the first (the only one when it is alone)."""
        timed = sorted(self.ms[1:] or self.ms)
        if not timed:
            return dict.fromkeys(("step_ms_min", "step_ms_p50", "step_ms_p90", "step_ms_max", "tok_s_median"))
        q = lambda f: timed[min(len(timed) - 1, int(f * len(timed)))]  # noqa: E731 - the bench's quantile
        return {
            "step_ms_min": round(timed[0], 2),
            "step_ms_p50": round(q(0.5), 2),
            "step_ms_p90": round(q(0.9), 2),
            "step_ms_max": round(timed[-1], 2),
            "tok_s_median": round(tokens_per_step / (q(0.5) / 1000.0), 1),
        }
