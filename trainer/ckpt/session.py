"""One training session's checkpoints, as the training loop sees them: ``due(step)``, ``save(step)``,
``wait()`` and ``close()``; the session decides what a save is and runs it.

Pushes happen at every multiple of --push-every-steps, at the stop step, and at the horizon, which is
pushed twice: ``ckpt/checkpoint-H`` (a pointer like any push) and then ``final/`` (the terminal pointer).
A session resumed at the horizon only completes the final push.

A save, on the training thread: the previous push waited for (every rank learns whether it failed), the
RNG gather started (every rank), and on rank 0 a snapshot to host memory (trainer/ckpt/snapshot.py). Then, on
one background thread, the checkpoint folder written from the snapshot and pushed through the checkpoint
protocol (trainer/ckpt/checkpointer.py: push -> verify -> pointer -> prune). The next optimizer step waits for an
async snapshot's copies on the device (``Snapshotter.before_optimizer_step``), not for the push.

A failed push surfaces at the next save or wait, on every rank, as :class:`PushFailed` (exit code 4).
"""

from __future__ import annotations

import datetime
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

from trainer.ckpt.checkpointer import CHECKPOINT_FILES, Checkpointer, prune_local, write_checkpoint_dir
from trainer.ckpt.rng import rng_state
from trainer.ckpt.snapshot import Snapshot, Snapshotter, tensor_bytes
from trainer.dist import Dist
from trainer.log import emit
from trainer.model import ModelConfig
from trainer.plan import RunPlan, checkpoint_steps
from trainer.runconfig import RunIdentity

__all__ = ["PushFailed", "CheckpointSession"]


class PushFailed(Exception):
    """A background checkpoint push failed (exit code 4)."""


class CheckpointSession:
    """The checkpoints of one session from its start step on (module docstring). ``checkpointer`` is rank
    0's, over the store the pushes go to (None on the other ranks); the session closes it."""

    def __init__(
        self,
        dist: Dist,
        checkpointer: Checkpointer | None,
        snapshots: Snapshotter,
        *,
        start: int,
        plan: RunPlan,
        push_every: int,
        out: Path,
        cfg: ModelConfig,
        prune: bool,
        identity: RunIdentity,
        model_options: dict[str, Any],
        hub_url: str,
    ) -> None:
        self.dist, self.checkpointer, self.snapshots = dist, checkpointer, snapshots
        self.start, self.plan, self.out, self.cfg, self.prune = start, plan, Path(out), cfg, prune
        self.identity, self.model_options = identity, model_options
        self.hub_url = hub_url
        self.push_at = set(checkpoint_steps(start, plan.stop_step, push_every))
        self.push_steps: list[int] = []  # the steps this session pushed to ckpt/ (RUN_JSON push_steps)
        self.wait_s_max = 0.0  # longest wait of the training loop for the previous push (rank 0)
        # What save() snapshots: the model, the optimizer, the scheduler and the grad scaler (see track()).
        self._state: tuple[torch.nn.Module, torch.optim.Optimizer, Any, Any] | None = None
        self._pusher: ThreadPoolExecutor | None = None
        self._pending: tuple[int, Future] | None = None  # rank 0's running push: (step, future)

    def track(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, scaler: Any) -> None:
        """The training state save() snapshots. With async snapshots rank 0 also allocates its host buffers
        here, before the first step (allocation is not a training pause), when this session saves at all."""
        self._state = (model, optimizer, scheduler, scaler)
        will_save = bool(self.push_at) or self.start == self.plan.total_steps
        if self.dist.master and self.snapshots.mode == "async" and will_save:
            self.snapshots.prepare(model, optimizer)

    def due(self, step: int) -> bool:
        """Whether the loop saves after ``step`` (it settles its pending losses first)."""
        return step in self.push_at

    def save(self, step: int) -> None:
        """Snapshot the state after ``step`` on the training thread (every rank: the RNG gather), then write
        and push in the background: ``ckpt/`` when ``step`` is due, then ``final/`` at the horizon."""
        assert self._state is not None, "track() the training state before the first save"
        push_ckpt, final = step in self.push_at, step == self.plan.total_steps
        t_wait = time.perf_counter()
        self._wait(announce_step=step)
        t0 = time.perf_counter()  # from here to the submit is the snapshot's pause
        # A push still running when the next checkpoint comes (pushes more often than a push lasts) stalls
        # the loop too; reported on its own as ckpt_wait_s_max.
        self.wait_s_max = max(self.wait_s_max, t0 - t_wait)
        rngs = self.dist.gather_later(rng_state(self.dist.device.type))  # read by the push thread
        t_rng = time.perf_counter()
        if push_ckpt:
            self.push_steps.append(step)
        if not self.dist.master:
            return
        snap = self.snapshots.take(*self._state, step=step, t0=t0, t_rng=t_rng)
        trainer_state = {
            "step": step,
            "tokens_consumed": step * self.plan.tokens_per_step,
            "run_config": self.identity.config,
            "config_hash": self.identity.hash,
            "model_options": self.model_options,
            "world_size": self.dist.world_size,
            "final": final,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        }
        if self._pusher is None:
            self._pusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-push")
        self._pending = (step, self._pusher.submit(self._write_and_push, snap, trainer_state, rngs, push_ckpt, final))

    def wait(self) -> None:
        """Every rank: the running push finished (rank 0 waits for it); PushFailed on every rank if it failed."""
        self._wait(announce_step=None)

    def close(self, *, abandon_push: bool = False) -> None:
        """The session's end, on every path and once: a running push finishes, then rank 0 releases the
        store's lease (a killed session's expires). ``abandon_push`` (a SIGTERM): the push is not waited for;
        the release waits for its commit in flight, and its next write finds the lease released and stops,
        leaving the store as a kill between two commits would (the pointer names the last verified step)."""
        if self._pusher is not None:
            self._pusher.shutdown(wait=not abandon_push, cancel_futures=abandon_push)
            self._pusher = None
        checkpointer, self.checkpointer = self.checkpointer, None
        if checkpointer is not None:
            checkpointer.close()

    def _wait(self, *, announce_step: int | None) -> None:
        """Rank 0 waits for the running push (saying so when a save at ``announce_step`` finds it running);
        every rank learns whether it failed."""
        self.dist.wait_gathers()  # the last checkpoint's RNG gather, before any other collective
        err = None
        if self.dist.master and self._pending is not None:
            prev_step, fut = self._pending
            if not fut.done() and announce_step is not None:
                emit(f"CKPT wait step={announce_step}: push of step={prev_step} still running")
            try:
                fut.result()
            except Exception as e:  # any failure of the push fails the run, with its cause
                err = f"push of step={prev_step} to {self.hub_url} failed: {type(e).__name__}: {e}"
            self._pending = None
        if err := self.dist.from_master(err):
            raise PushFailed(err)

    def _write_and_push(
        self, snap: Snapshot, trainer_state: dict, rngs_wait: Callable[[], list], push_ckpt: bool, final: bool
    ) -> None:
        """Push thread: the checkpoint dir written from the snapshot, then push -> verify -> pointer -> prune."""
        assert self.checkpointer is not None
        out_dir = self.out / "ckpt" / f"checkpoint-{snap.step}"
        rngs = rngs_wait()
        nbytes = snap.nbytes + tensor_bytes(rngs)
        shadow, pause, wait = self.snapshots.land(snap)
        emit(
            f"CKPT save step={snap.step} files={len(CHECKPOINT_FILES)} bytes={nbytes} snapshot_s={pause:.3f}"
            f"{wait}{snap.parts}"
        )
        files = write_checkpoint_dir(
            out_dir,
            model=shadow,
            cfg=self.cfg,
            trainer_state=trainer_state,
            optimizer_state=snap.opt_state,
            rng_states=rngs,
            expect_bytes=nbytes,
        )
        for to_final in ([False] if push_ckpt else []) + ([True] if final else []):
            self.checkpointer.push(
                snap.step,
                out_dir,
                files,
                tokens=trainer_state["tokens_consumed"],
                config_hash=self.identity.hash,
                final=to_final,
            )
        if self.prune:
            prune_local(self.out / "ckpt", keep=out_dir)
