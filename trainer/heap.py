"""Python's garbage collector during training: freeze what the compile leaves, then watch what is left.

A compile (Dynamo + Inductor) leaves ~1M tracked objects that live for the whole session. Python's next
full (generation-2) collection walks them all, up to a second after compiling the frozen model
(docs/performance.md), at a step nobody chose, and under DDP on every rank's clock, since the other ranks
wait in the all-reduce. ``freeze_heap`` moves them out of the collector's reach once,
at a chosen point; ``FullCollections`` counts the full collections that still happen and times them, so a
run's report says whether the collector cost it anything.
"""

from __future__ import annotations

import gc
import time
from typing import Any


def freeze_heap() -> tuple[int, float]:
    """One full collection (cycles die now, not frozen forever), then every object alive so far moved to
    the permanent generation; returns (objects frozen, seconds). Later collections skip them: ~0 ms."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count(), time.perf_counter() - t0


class FullCollections:
    """While entered: how many full collections Python ran, their total and longest seconds.

    A ``gc.callbacks`` hook (CPython calls it at the start and the stop of each collection). A collection
    holds the GIL, so one triggered by any thread (the push thread's too) stops the training thread: all
    are counted. Generations 0 and 1 are left out: they walk only young objects, in microseconds. An
    explicit ``gc.collect()`` counts as well: it stops the thread all the same."""

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.max_s = 0.0
        self._t0: float | None = None

    def _hook(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            seconds = time.perf_counter() - self._t0
            self._t0 = None
            self.count += 1
            self.total_s += seconds
            self.max_s = max(self.max_s, seconds)

    def start(self) -> None:
        if self._hook not in gc.callbacks:
            gc.callbacks.append(self._hook)

    def stop(self) -> None:
        if self._hook in gc.callbacks:
            gc.callbacks.remove(self._hook)

    def __enter__(self) -> FullCollections:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> dict[str, float | int]:
        return {
            "gc_full_collections": self.count,
            "gc_full_s_total": round(self.total_s, 4),
            "gc_full_s_max": round(self.max_s, 4),
        }
