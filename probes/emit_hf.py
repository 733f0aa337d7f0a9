"""The transformers.Trainer flavour of :mod:`probes.emit` (imports transformers; ``probes.emit.hf_callback()`` and
``import probes.auto`` load it when asked).

Where each fact comes from, so that it is the one the Trainer itself used:

- ``loss``: the Trainer's own logged training loss (transformers 4 rounds it to 4 decimals; the session line then
  says ``loss_rounded_to_decimals: 4``). The callback asks for a log every step (``control.should_log``),
  so it is that step's loss (averaged over ranks by the Trainer), and turns off ``logging_nan_inf_filter``, which
  otherwise logs a NaN loss as the running mean. Both change what is logged, not what is trained; the session line
  says so.
- ``lr``: the first parameter group's LR just before ``optimizer.step()`` (a resumed session whose schedule ended
  shows the 0.0 it really trains at, not the scheduler's next value).
- ``batches``: a digest of each micro-batch's tensors, from a forward pre-hook on the model in training mode.
- ``epoch``: the Trainer's fractional ``state.epoch``.

The stop: at ``SPECPROBE_STOP_AT_STEP`` the callback sets ``should_save`` and ``should_training_stop``; the Trainer
saves ``checkpoint-N/`` with its optimizer, scheduler, RNG and trainer state, exactly as at any save step, which is
what ``trainer.train(resume_from_checkpoint=True)`` resumes from.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import transformers
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from probes.emit import Emitter, batch_digest, claim, release


def _inputs(args: tuple, kwargs: dict) -> dict[str, Any]:
    """The batch a forward call trained on: its tensors of rank >= 1 and nested containers. A 0-d tensor or an
    int is a count the Trainer adds (``num_items_in_batch``), not data."""

    def data(v: Any) -> bool:
        return (hasattr(v, "dim") and v.dim() > 0) or isinstance(v, (dict, list, tuple))

    picked = {f"arg{i}": v for i, v in enumerate(args) if data(v)}
    picked.update({k: v for k, v in kwargs.items() if data(v)})
    return picked


class ProbeCallback(TrainerCallback):
    """Prints SPECPROBE_SESSION/STEP/STOP (main process) and ends the session at ``SPECPROBE_STOP_AT_STEP``."""

    def __init__(self) -> None:
        self.emitter: Emitter | None = None
        self._state: Any = None
        self._lr: float | None = None
        self._batches: list[str] = []
        self._hook: Any = None
        self._stop_reported = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if not claim(state, self):
            return  # another probe callback of this Trainer speaks for it
        self._state = state
        self.emitter = Emitter.from_env("transformers", main=lambda: bool(state.is_world_process_zero))
        self._batches, self._lr, self._stop_reported = [], None, False
        changed = ["logging every step"]
        if getattr(args, "logging_nan_inf_filter", False):
            args.logging_nan_inf_filter = False
            changed.append("logging_nan_inf_filter off")
        if model is not None:
            self._hook = model.register_forward_pre_hook(self._see_batch, with_kwargs=True)
        rounded = {}
        if int(transformers.__version__.split(".")[0]) < 5:
            # transformers 4 logs round(loss, 4): said in the line and on stderr, never a silently coarse series
            rounded = {"loss_rounded_to_decimals": 4}
            if state.is_world_process_zero:
                print(
                    f"probes: transformers {transformers.__version__} rounds each logged loss to 4 decimals",
                    file=sys.stderr,
                )
        self.emitter.session(
            state.global_step,
            version=transformers.__version__,
            max_steps=state.max_steps,
            num_train_epochs=state.num_train_epochs,
            world_size=args.world_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            output_dir=args.output_dir,
            changed=changed,
            **rounded,
        )

    def _see_batch(self, module: Any, args: tuple, kwargs: dict) -> None:
        if module.training:
            self._batches.append(batch_digest(_inputs(args, kwargs)))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        if self.emitter is not None and optimizer is not None:
            self._lr = optimizer.param_groups[0]["lr"]

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.emitter is None:
            return
        control.should_log = True
        if self.emitter.should_stop(state.global_step):
            control.should_save = True
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if self.emitter is None or not logs or "loss" not in logs:
            return  # an evaluation's or the final summary's log
        if self.emitter.last_step is not None and state.global_step <= self.emitter.last_step:
            return
        lr = self._lr if self._lr is not None else logs.get("learning_rate")
        extra = {"grad_norm": logs["grad_norm"]} if logs.get("grad_norm") is not None else {}
        self.emitter.step(state.global_step, logs["loss"], lr=lr, epoch=state.epoch, batches=self._batches, **extra)
        self._batches, self._lr = [], None

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        emitter = self.emitter
        if emitter is None or emitter.stop_step is None or state.global_step != emitter.stop_step:
            return
        path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        emitter.stopped(state.global_step, path, os.path.isdir(path))
        self._stop_reported = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        emitter = self.emitter
        if emitter is None:
            return
        if emitter.stop_step is not None and not self._stop_reported:
            # The Trainer left without the save the callback asked for: said, never a silent stop.
            emitter.stopped(emitter.stop_step, None, False, error="the Trainer did not save at the stop step")
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        release(self._state, self)
        self.emitter = None
