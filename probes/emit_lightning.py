"""The Lightning flavour of :mod:`probes.emit`. Importing this module imports no Lightning: the callback class is
built for ``lightning.pytorch`` or ``pytorch_lightning`` when first asked for, since Lightning loads the entry
points below in every Trainer, whichever of the two packages the script uses.

Where each fact comes from:

- ``loss``: the mean over the step's micro-batches of the loss ``training_step`` returned (``outputs`` of
  ``on_train_batch_end``; null when ``training_step`` returns none, as in manual optimisation).
- ``lr``: the first parameter group's LR in ``on_before_optimizer_step``, the one the step trains at.
- ``batches``: a digest of each micro-batch (``on_train_batch_start``); ``epoch``: ``trainer.current_epoch``.

The stop: after step ``SPECPROBE_STOP_AT_STEP`` the callback saves on every rank (a save is a collective) the last
checkpoint that ``trainer.fit(..., ckpt_path="last")`` picks up (:func:`save_at_stop`), then sets
``trainer.should_stop``. It saves where and as Lightning's own ``every_n_train_steps`` checkpoints are saved, so
what a resume from it does is Lightning's.

``lightning_factory``/``pytorch_lightning_factory`` are the ``*.callbacks_factory`` entry points: they add the
callback to every Trainer of a process that ran ``import probes.auto``, and nothing otherwise.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from probes.emit import Emitter, batch_digest, claim, release

_classes: dict[str, type] = {}


def _flavour() -> str:
    """``lightning.pytorch`` unless the script imported only ``pytorch_lightning``."""
    if "pytorch_lightning" in sys.modules and "lightning.pytorch" not in sys.modules:
        return "pytorch_lightning"
    return "lightning.pytorch"


def callback(flavour: str | None = None) -> Any:
    """A new probe callback subclassing ``flavour``'s ``Callback`` (default: the Lightning the script imported)."""
    flavour = flavour or _flavour()
    cls = _classes.get(flavour)
    if cls is None:
        cls = _classes[flavour] = _build(flavour)
    return cls()


def lightning_factory() -> list[Any]:
    return [callback("lightning.pytorch")] if "probes.auto" in sys.modules else []


def pytorch_lightning_factory() -> list[Any]:
    return [callback("pytorch_lightning")] if "probes.auto" in sys.modules else []


def _loss_of(outputs: Any) -> float | None:
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    if outputs is None:
        return None
    return float(outputs.detach()) if hasattr(outputs, "detach") else float(outputs)


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def save_at_stop(trainer: Any) -> tuple[str, dict[str, Any]]:
    """Save the stop's checkpoint where ``fit(ckpt_path="last")`` finds it; (its path, facts for the STOP line).

    With a ModelCheckpoint that keeps a last checkpoint, it saves through that callback's own last-checkpoint save,
    the one its ``every_n_train_steps`` saves make: the callback then knows a last checkpoint of this step exists
    and does not write another at the end of training (that one, written after the epoch loop has moved on, is
    not what a preempted session leaves). Otherwise ``trainer.save_checkpoint`` into ``default_root_dir``."""
    for cb in getattr(trainer, "checkpoint_callbacks", ()):
        save_last = getattr(cb, "_save_last_checkpoint", None)
        candidates = getattr(cb, "_monitor_candidates", None)
        if getattr(cb, "save_last", False) and callable(save_last) and callable(candidates):
            save_last(trainer, candidates(trainer))
            return cb.last_model_path, {"via": f"{type(cb).__name__} last checkpoint"}
    path = os.path.join(trainer.default_root_dir, "last.ckpt")
    trainer.save_checkpoint(path)
    return path, {"via": "trainer.save_checkpoint", "note": "no ModelCheckpoint(save_last=True): resume from this path"}


def _build(flavour: str) -> type:
    pl = importlib.import_module(flavour)
    version = getattr(pl, "__version__", None)

    class ProbeCallback(pl.Callback):
        """Prints SPECPROBE_SESSION/STEP/STOP (global rank 0) and ends the session at ``SPECPROBE_STOP_AT_STEP``."""

        def __init__(self) -> None:
            self.emitter: Emitter | None = None
            self._reset()

        def _reset(self) -> None:
            self._losses: list[float | None] = []
            self._batches: list[str] = []
            self._lr: float | None = None

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if not claim(trainer, self):
                return
            self.emitter = Emitter.from_env(flavour, main=lambda: bool(trainer.is_global_zero))
            self._reset()
            self._last = trainer.global_step
            self.emitter.session(
                trainer.global_step,
                version=version,
                epoch=trainer.current_epoch,
                max_steps=trainer.max_steps,
                max_epochs=trainer.max_epochs,
                batches_per_epoch=_count(trainer.num_training_batches),
                accumulate_grad_batches=trainer.accumulate_grad_batches,
                world_size=trainer.world_size,
            )

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if self.emitter is not None:
                self._batches.append(batch_digest(batch))

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            if self.emitter is not None:
                self._lr = optimizer.param_groups[0]["lr"]

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            emitter = self.emitter
            if emitter is None:
                return
            self._losses.append(_loss_of(outputs))
            step = trainer.global_step
            if step <= self._last:
                return  # a micro-batch of a step still accumulating
            self._last = step
            stop = emitter.step(
                step,
                _mean(self._losses),
                lr=self._lr,
                epoch=trainer.current_epoch,
                batches=self._batches,
                batch_idx=batch_idx,
            )
            self._reset()
            if stop:
                path, facts = save_at_stop(trainer)
                emitter.stopped(step, path, os.path.isfile(path), **facts)
                trainer.should_stop = True

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            release(trainer, self)
            self.emitter = None

    ProbeCallback.__qualname__ = ProbeCallback.__name__ = "ProbeCallback"
    ProbeCallback.__module__ = __name__
    return ProbeCallback


def _count(n: Any) -> int | None:
    try:
        return int(n)
    except (TypeError, ValueError, OverflowError):  # inf for an iterable dataset of unknown length
        return None
