"""specprobe's probe library: what a training script needs so that the engine can check its stop and resume.

- :mod:`probes.emit` prints the per-step facts the engine harvests and stops the session at the step the probe
  chooses (``SPECPROBE_STOP_AT_STEP``); standard library only.
- :mod:`probes.auto` is the one line a transformers.Trainer or Lightning script adds (``import probes.auto``).
- :mod:`probes.ckpt` compares two checkpoints tensor by tensor (the ``ckpt_compare`` collector and
  ``python -m probes.ckpt A B``).
- :mod:`probes.drivers` holds tiny training scripts for transformers, Lightning, accelerate and a plain
  torch.distributed.checkpoint loop, each able to resume the right way and each known wrong way.

docs/probes.md is the user's page. Nothing here imports the engine or the trainer, and the engine never imports this.
"""
