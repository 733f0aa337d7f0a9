"""The trainer's garbage-collector handling (trainer/heap.py): freezing what lives after the compile,
then counting and timing the full collections that still stop the training thread."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from trainer.heap import FullCollections, freeze_heap


class Node:
    pass


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the suite as it was


def test_freeze_heap_collects_garbage_first_then_freezes_what_lives():
    cycle = Node()
    cycle.me = cycle  # garbage only a collection can free (a reference cycle)
    dead = weakref.ref(cycle)
    del cycle
    alive = [Node() for _ in range(1000)]
    frozen, seconds = freeze_heap()
    assert dead() is None  # collected before the freeze, not frozen
    assert frozen >= len(alive) and seconds >= 0
    # Frozen objects leave the collector's generations. (Not frozen == get_freeze_count(): a frozen
    # object freed by refcount, on another thread of the suite, shrinks that count in between.)
    mine = {id(n) for n in alive}
    assert sum(id(o) in mine for o in gc.get_objects()) == 0
    fresh = Node()
    assert any(o is fresh for o in gc.get_objects())  # what lives after the freeze is collected again


def test_full_collections_counts_only_generation_2_and_only_while_watching():
    gc.collect(2)  # before: not counted
    with FullCollections() as watch:
        gc.collect(0)
        gc.collect(1)  # young generations: not the stall it tracks
        assert watch.count == 0 and watch.max_s == 0.0
        gc.collect(2)
        gc.collect()  # 2 is the default generation
    gc.collect(2)  # after: not counted, the hook is gone
    assert watch.count == 2
    assert 0 < watch.max_s <= watch.total_s
    assert watch._hook not in gc.callbacks
    summary = watch.summary()
    assert summary["gc_full_collections"] == 2
    assert summary["gc_full_s_max"] == round(watch.max_s, 4) <= summary["gc_full_s_total"]


def fastest_full_collection(times: int = 3) -> float:
    seconds = []
    for _ in range(times):  # the fastest: a busy core slows only some
        with FullCollections() as watch:
            gc.collect()
        assert watch.count == 1
        seconds.append(watch.max_s)
    return min(seconds)


def test_after_freezing_a_full_collection_no_longer_walks_the_frozen_heap():
    # The stall freeze_heap removes, as the watch times it: ~600k tracked objects, as after a compile,
    # against the same heap frozen; a full collection costs ~100x less then, the bound asks for 10x.
    heap = [[Node()] for _ in range(300_000)]
    unfrozen = fastest_full_collection()
    freeze_heap()
    frozen = fastest_full_collection()
    assert frozen * 10 < unfrozen, (frozen, unfrozen)
    del heap


def test_start_and_stop_are_idempotent():
    watch = FullCollections()
    watch.start()
    watch.start()
    assert gc.callbacks.count(watch._hook) == 1  # one hook: each collection counted once
    gc.collect()
    watch.stop()
    watch.stop()
    assert watch.count == 1 and watch._hook not in gc.callbacks


# Loaded by every Python process that has this directory on PYTHONPATH: in rank 1 of the trainer only, a
# thread runs a full collection every 0.1 s, as a rank whose heap keeps growing would.
COLLECTING_RANK = """
import gc, os, threading, time
if os.environ.get("RANK") == "1":
    def _collect():
        while True:
            time.sleep(0.1)
            gc.collect()
    threading.Thread(target=_collect, daemon=True).start()
"""


@pytest.mark.slow
def test_trainer_reports_the_full_collections_of_its_worst_rank(tmp_path, tmp_path_factory):
    from trainer_helpers import explain, run_trainer, store_url, tiny_mix, torchrun_cmd, trainer_args

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(COLLECTING_RANK)
    r = run_trainer(
        torchrun_cmd(
            trainer_args(
                root=tiny_mix(tmp_path_factory),
                out=tmp_path / "out",
                repo=store_url(tmp_path / "store"),
                steps=6,
                push_every=3,
            )
        ),
        env={"PYTHONPATH": str(site)},
    )
    assert r.rc == 0 and r.run_json is not None, explain(r)
    rj = r.run_json  # rank 0's report; only rank 1 collected
    assert rj["gc_full_collections"] >= 1 and rj["gc_full_s_max"] > 0, rj
    assert rj["gc_full_s_max"] <= rj["gc_full_s_total"]
    (line,) = [ln for ln in r.starting("gc: ") if "full collections after the freeze" in ln]
    assert line.startswith(f"gc: {rj['gc_full_collections']} full collections after the freeze, ")
    assert line.endswith("(worst rank)"), line
