"""accelerate driver: a plain training loop under an ``Accelerator``, saved and resumed with ``save_state`` and
``load_state`` and automatic checkpoint naming, as accelerate's documentation shows. 16 steps an epoch, 24 in all.

    python -m probes.drivers.accelerate_loop --output-dir OUT                            # uninterrupted
    SPECPROBE_STOP_AT_STEP=10 python -m probes.drivers.accelerate_loop --output-dir OUT  # session 1, mid-epoch
    python -m probes.drivers.accelerate_loop --output-dir OUT --resume                   # session 2

Checkpoints: ``OUT/checkpoints/checkpoint_K/`` (K counts saves), every ``--save-every`` steps, at the stop and at the
horizon. The loop's step is a registered object (``custom_checkpoint_0.pkl``); the resumed epoch's first batches are
skipped with ``skip_first_batches``. ``--mode``:

- ``default``: ``use_seedable_sampler=True``, ``set_epoch`` every epoch, and the save counter set past the loaded
  checkpoint after ``load_state``; the resume is exact.
- ``broken_unseeded_sampler``: no seedable sampler: the shuffled loader draws its order from the RNG at the start of
  the epoch, so ``skip_first_batches`` after a mid-epoch resume skips batches of another order.
- ``broken_checkpoint_naming``: the save counter left as ``load_state`` leaves it (0): the resumed session's first
  ``save_state`` raises "checkpoint_0 ... already exists".
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed

import probes.emit
from probes.drivers.common import Regressor, Samples, quiet_cpu

MODES = ("default", "broken_unseeded_sampler", "broken_checkpoint_naming")
BATCH = 4


class Progress:
    """The loop's own state, registered for checkpointing (accelerate pickles it as custom_checkpoint_0.pkl)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m probes.drivers.accelerate_loop", description=__doc__.split("\n")[0])
    p.add_argument("--output-dir", required=True, help="the Accelerator's project_dir")
    p.add_argument("--mode", choices=MODES, default="default")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="load_state() the latest checkpoint")
    return p.parse_args(argv)


def _latest_index(project_dir: str) -> int:
    names = os.listdir(os.path.join(project_dir, "checkpoints"))
    return max(int(m.group(1)) for n in names if (m := re.fullmatch(r"checkpoint_(\d+)", n)))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    quiet_cpu()
    set_seed(args.seed)
    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=args.output_dir, automatic_checkpoint_naming=True),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=args.mode != "broken_unseeded_sampler"),
    )
    # No dropout: a resumed session creates its epoch's iterator after load_state() restored the RNG, and creating a
    # DataLoader iterator draws its base seed from that RNG, so dropout masks would differ for a reason other than the
    # ones this driver reproduces (docs/probes.md).
    model = Regressor(dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3) * max(0.0, 1 - s / args.steps))
    loader = torch.utils.data.DataLoader(Samples(), batch_size=BATCH, shuffle=True)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if args.resume:
        accelerator.load_state()
        if args.mode != "broken_checkpoint_naming":
            accelerator.project_configuration.iteration = _latest_index(args.output_dir) + 1
    per_epoch = len(loader)
    step = progress.step
    while step < args.steps:
        epoch, skip = divmod(step, per_epoch)
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        for batch in batches:
            model.train()
            out = model(batch["x"], batch["labels"])
            accelerator.backward(out["loss"])
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            opt.zero_grad()
            step = progress.step = step + 1
            stop = probes.emit.step(step, out["loss"], lr=lr, epoch=epoch, samples=accelerator.gather(batch["idx"]))
            if stop or step % args.save_every == 0 or step == args.steps:
                accelerator.save_state()
            if stop:
                probes.emit.stopped(
                    os.path.join(args.output_dir, "checkpoints", f"checkpoint_{_latest_index(args.output_dir)}")
                )
                return 0
            if step == args.steps:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
