"""Tiny training scripts for the shipped probes: each trains a small model on synthetic data in seconds on the CPU,
prints the probe's per-step lines the way a user's script does (``import probes.auto``, or ``probes.emit.step`` in a
plain loop), and resumes the right way by default and each known wrong way with ``--mode broken_*``.

- ``python -m probes.drivers.hf_trainer``: transformers.Trainer (``broken_max_steps_stop``,
  ``broken_no_optimizer_state``).
- ``python -m probes.drivers.lightning_loop``: Lightning (``broken_unseeded_epoch``; ``broken_mid_epoch`` is the
  default driver stopped mid-epoch).
- ``python -m probes.drivers.accelerate_loop``: accelerate save_state/load_state (``broken_unseeded_sampler``,
  ``broken_checkpoint_naming``).
- ``torchrun --nproc-per-node 2 -m probes.drivers.dcp_loop``: a plain loop with torch.distributed.checkpoint
  (``broken_pointer_before_save``).

docs/probes.md lists each mode, the fault it reproduces and what the probe sees.
"""
