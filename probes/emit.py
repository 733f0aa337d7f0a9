"""Per-step facts for the engine, and a stop at the step the probe chooses. Standard library only.

A training script says what each optimizer step did; the engine harvests it from the output (``marker``,
``pick: all``) and compares it with the run that never stopped. Three lines, printed on the main process only,
each a marker and one strict-JSON object:

    SPECPROBE_SESSION {"framework": "transformers", "start_step": 0, "stop_at": 10, ...}
    SPECPROBE_STEP {"step": 1, "loss": 2.31, "lr": 0.001, "epoch": 0.06, "batches": ["9f2c..."], ...}
    SPECPROBE_STOP {"step": 10, "checkpoint": "out/checkpoint-10", "saved": true}

``step`` counts optimizer steps from 1 across sessions. ``batches`` is one digest per micro-batch of the inputs the
step trained on (:func:`batch_digest`), ``samples`` the sample ids where the script knows them. A non-finite number is
written as the evidence file writes it, ``{"$nonfinite": "NaN"}`` (JSON has no NaN), so the line stays strict JSON.

``SPECPROBE_STOP_AT_STEP=N`` ends the session after step N the way a clean preemption ends it for that trainer, so the
probe, not ``max_steps``, decides where a session stops (a shorter ``max_steps`` changes the LR schedule):

- transformers.Trainer (:func:`hf_callback`): the checkpoint of step N is saved as the Trainer saves every checkpoint
  (``checkpoint-N/``, what ``resume_from_checkpoint=True`` picks up) and ``control.should_training_stop`` is set.
- Lightning (:func:`lightning_callback`): the last checkpoint saved through the ModelCheckpoint that keeps one, as
  its ``every_n_train_steps`` saves are (what ``fit(ckpt_path="last")`` picks up), then ``trainer.should_stop``.
- A plain loop (:func:`step`): it returns True at step N; the loop saves as it saves at a preemption and leaves.

The one line of a transformers or Lightning script is ``import probes.auto`` (:mod:`probes.auto`); a plain loop
calls ``probes.emit.step(...)`` once per optimizer step. Importing this module needs neither library: the callback
classes are built when asked for.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, TextIO

SESSION_MARKER = "SPECPROBE_SESSION "
STEP_MARKER = "SPECPROBE_STEP "
STOP_MARKER = "SPECPROBE_STOP "
STOP_ENV = "SPECPROBE_STOP_AT_STEP"
# The evidence file's form of a non-finite number (engine/run/evidence.py), so a harvested NaN reads as one.
NONFINITE_KEY = "$nonfinite"
_DIGEST_BYTES = 8  # 64 bits: two different batches of one run never share a digest in practice


# Sessions started in this process (any rank), for probes.auto's warning when its one line reached no trainer.
sessions_started = 0
# Which probe callback speaks for a trainer: the first to start. A script that has both the one line and an
# explicit callback must not print every step twice or save the stop checkpoint twice.
_owners: dict[int, object] = {}


def claim(key: object, owner: object) -> bool:
    """Make ``owner`` the one callback of trainer ``key`` unless another already is; True when ``owner`` is."""
    return _owners.setdefault(id(key), owner) is owner


def release(key: object, owner: object) -> None:
    if _owners.get(id(key)) is owner:
        del _owners[id(key)]


class ProbeConfigError(ValueError):
    """The probe's own setting is unusable (a stop step that is not a positive integer); the message names it."""


def stop_at_step(environ: Mapping[str, str] | None = None) -> int | None:
    """The step ``SPECPROBE_STOP_AT_STEP`` names, None when unset or empty; ProbeConfigError for anything but a
    positive integer (a typo must not let the session run to the horizon as if no stop was asked)."""
    raw = (os.environ if environ is None else environ).get(STOP_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw, 10)
    except ValueError:
        value = 0
    if value < 1:
        raise ProbeConfigError(f"{STOP_ENV}={raw!r}: expected a positive integer step")
    return value


def strict(value: Any) -> Any:
    """``value`` with every non-finite float in the evidence file's ``{"$nonfinite": ...}`` form."""
    if isinstance(value, float) and not math.isfinite(value):
        return {NONFINITE_KEY: "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")}
    if isinstance(value, Mapping):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def line(marker: str, doc: Mapping[str, Any]) -> str:
    """One marker line: the marker, then ``doc`` as strict JSON on one line."""
    return marker + json.dumps(strict(doc), allow_nan=False, default=str)


def number(value: Any) -> float | int | None:
    """A loss or LR as a plain number: a 1-element tensor or numpy scalar read with float(), ints kept."""
    if value is None or isinstance(value, bool):
        return None if value is None else int(value)
    if isinstance(value, int):
        return value
    if hasattr(value, "detach"):  # a tensor that still carries its graph
        value = value.detach()
    return float(value)


def batch_digest(batch: Any) -> str:
    """A short hex digest of what a batch holds: every tensor's dtype, shape and bytes, dict keys in sorted order,
    numbers and strings by value. Two runs that train on the same inputs give the same digests."""
    h = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    _feed(h, batch, 0)
    return h.hexdigest()


def _feed(h: Any, obj: Any, depth: int) -> None:
    if depth > 32:  # a self-referencing structure: its shape is digest enough
        h.update(b"<deep>")
    elif hasattr(obj, "detach") and hasattr(obj, "dtype") and hasattr(obj, "shape"):  # a torch tensor
        t = obj.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)}".encode())
        torch = sys.modules["torch"]  # a tensor exists, so torch is imported
        h.update(t.view(torch.uint8).numpy().tobytes())  # every dtype (bf16 too) as its raw bytes
    elif hasattr(obj, "tobytes") and hasattr(obj, "dtype"):  # a numpy array
        h.update(f"A{obj.dtype}{getattr(obj, 'shape', ())}".encode())
        h.update(obj.tobytes())
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for key in sorted(obj, key=str):
            h.update(repr(key).encode())
            _feed(h, obj[key], depth + 1)
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for item in obj:
            _feed(h, item, depth + 1)
        h.update(b"]")
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(repr(obj).encode())
    else:  # an object the digest cannot see into (a BatchEncoding is a Mapping and is seen)
        h.update(f"<{type(obj).__name__}>".encode())


def is_main_process() -> bool:
    """Rank 0 by the launcher's ``RANK``, else by an initialised torch.distributed, else True (one process)."""
    rank = os.environ.get("RANK", "").strip()
    if rank:
        return rank == "0"
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return True


class Emitter:
    """One session's lines (SESSION once, STEP per step, STOP when the probe ends it) and its stop decision.

    ``main`` says whether this process prints; every process decides the stop alike, so a collective save is
    reached by all ranks. ``stream`` defaults to the stdout of the moment of each write."""

    def __init__(
        self,
        framework: str,
        *,
        stop_at: int | None = None,
        main: Callable[[], bool] = is_main_process,
        stream: TextIO | None = None,
    ) -> None:
        self.framework = framework
        self.stop_at = stop_at
        self.main = main
        self.stream = stream
        self.start_step: int | None = None
        self.last_step: int | None = None
        self.stop_step: int | None = None  # the step at which this session was told to stop

    @classmethod
    def from_env(cls, framework: str, **kwargs: Any) -> Emitter:
        return cls(framework, stop_at=stop_at_step(), **kwargs)

    def write(self, marker: str, doc: Mapping[str, Any]) -> None:
        if self.main():
            print(line(marker, doc), file=self.stream or sys.stdout, flush=True)

    def session(self, start_step: int, **facts: Any) -> None:
        """The session's first line: where it starts, where the probe will stop it, and what the trainer says of
        itself (``facts``). A stop step the session starts at or past is said, not silently ignored."""
        global sessions_started
        sessions_started += 1
        self.start_step = int(start_step)
        doc: dict[str, Any] = {"framework": self.framework, "start_step": self.start_step, "stop_at": self.stop_at}
        if self.stop_at is not None and self.start_step >= self.stop_at:
            doc["warning"] = (
                f"{STOP_ENV}={self.stop_at} but the session starts after step {self.start_step}: it will not stop there"
            )
        doc.update(facts)
        self.write(SESSION_MARKER, doc)

    def step(
        self,
        step: int,
        loss: Any,
        *,
        lr: Any = None,
        epoch: Any = None,
        samples: Any = None,
        batches: list[str] | None = None,
        **extra: Any,
    ) -> bool:
        """Print the step's line; True when the probe wants the session to end after this step."""
        step = int(step)
        if self.start_step is None:
            self.session(step - 1)
        doc: dict[str, Any] = {"step": step, "loss": number(loss), "lr": number(lr), "epoch": number(epoch)}
        if samples is not None:
            doc["samples"] = samples.tolist() if hasattr(samples, "tolist") else list(samples)
        if batches is not None:
            doc["batches"] = list(batches)
        doc.update({k: number(v) if _numeric(v) else v for k, v in extra.items()})
        self.write(STEP_MARKER, doc)
        self.last_step = step
        return self.should_stop(step)

    def should_stop(self, step: int) -> bool:
        """At or past the stop step, in a session that started before it."""
        stop = (
            self.stop_at is not None
            and step >= self.stop_at
            and (self.start_step is None or self.start_step < self.stop_at)
        )
        if stop and self.stop_step is None:
            self.stop_step = step
        return stop

    def stopped(self, step: int, checkpoint: str | None, saved: bool, **facts: Any) -> None:
        """The session ended at ``step`` because the probe said so; ``checkpoint`` is what the next one resumes."""
        self.write(STOP_MARKER, {"step": int(step), "checkpoint": checkpoint, "saved": saved, **facts})


def _numeric(value: Any) -> bool:
    return not isinstance(value, (str, bytes, list, tuple, dict)) and (
        isinstance(value, (int, float)) or hasattr(value, "item")
    )


_loop: Emitter | None = None


def step(
    step: int,
    loss: Any,
    *,
    lr: Any = None,
    epoch: Any = None,
    samples: Any = None,
    batch: Any = None,
    **extra: Any,
) -> bool:
    """The plain loop's helper: print step ``step``'s facts (on the main process) and return True when the probe
    wants the session to end after it (``SPECPROBE_STOP_AT_STEP``). Then save as the loop saves at a preemption and
    leave the loop; :func:`stopped` may say where the checkpoint went.

    ``loss`` and ``lr`` are numbers or 1-element tensors; ``batch`` (any tensors, dicts, lists) is digested into
    ``batches``; ``samples`` are the sample ids the step trained on, where the loop knows them."""
    global _loop
    if _loop is None:
        _loop = Emitter.from_env("loop")
    batches = [batch_digest(batch)] if batch is not None else None
    return _loop.step(step, loss, lr=lr, epoch=epoch, samples=samples, batches=batches, **extra)


def new_session() -> None:
    """Forget the plain loop's session: the next :func:`step` starts a new one (a second run in one process)."""
    global _loop
    _loop = None


def stopped(checkpoint: str | None = None, saved: bool = True) -> None:
    """After :func:`step` returned True and the loop saved: the STOP line naming the checkpoint."""
    if _loop is None or _loop.stop_step is None:
        raise RuntimeError("probes.emit.stopped() before probes.emit.step() asked for a stop")
    _loop.stopped(_loop.stop_step, checkpoint, saved)


def hf_callback() -> Any:
    """A transformers ``TrainerCallback`` that prints each step and stops at ``SPECPROBE_STOP_AT_STEP``."""
    from probes.emit_hf import ProbeCallback

    return ProbeCallback()


def lightning_callback() -> Any:
    """A Lightning ``Callback`` (``lightning.pytorch``, or ``pytorch_lightning`` where only that is imported) that
    prints each step and stops at ``SPECPROBE_STOP_AT_STEP``."""
    from probes.emit_lightning import callback

    return callback()
