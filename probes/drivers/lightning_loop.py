"""Lightning driver: a tiny regressor fitted by a Lightning Trainer, 8 steps an epoch, 24 steps by default.

    python -m probes.drivers.lightning_loop --output-dir OUT                            # uninterrupted
    SPECPROBE_STOP_AT_STEP=8 python -m probes.drivers.lightning_loop --output-dir OUT   # session 1, an epoch end
    python -m probes.drivers.lightning_loop --output-dir OUT --resume                   # fit(ckpt_path="last")

Checkpoints: ``OUT/checkpoints/last.ckpt`` (a ModelCheckpoint with ``save_last=True``, also where the probe's stop
saves). ``--mode``:

- ``default``: a sampler seeded per epoch (Lightning calls its ``set_epoch``); stopped at an epoch end, the resume is
  exact. Stopped mid-epoch (``SPECPROBE_STOP_AT_STEP=12``) it reproduces the ``broken_mid_epoch`` fault: Lightning
  warns that the dataloader is not resumable, re-trains the epoch's first batches, and never sees the rest.
- ``broken_unseeded_epoch``: ``DataLoader(shuffle=True)`` after ``seed_everything``; stopped at an epoch end, the
  resumed session's next epoch replays the order of the first session's first epoch, without a warning.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import probes.auto  # noqa: F401  (the one line: every Trainer below prints the probe's lines)
from probes.drivers.common import Regressor, Samples, quiet_cpu

MODES = ("default", "broken_unseeded_epoch")
BATCH = 8


class EpochSeededSampler(torch.utils.data.Sampler):
    """A fresh permutation each epoch, a pure function of (seed, epoch): Lightning's ``set_epoch`` picks it."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


class LitRegressor(L.LightningModule):
    def __init__(self, steps: int) -> None:
        super().__init__()
        self.model = Regressor(dropout=0.0)  # Lightning checkpoints hold no RNG state: no dropout to restore
        self.steps = steps

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self.model(batch["x"], batch["labels"])["loss"]

    def configure_optimizers(self) -> dict:
        opt = torch.optim.AdamW(self.parameters(), lr=0.02, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3) * max(0.0, 1 - s / self.steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m probes.drivers.lightning_loop", description=__doc__.split("\n")[0])
    p.add_argument("--output-dir", required=True)
    p.add_argument("--mode", choices=MODES, default="default")
    p.add_argument("--steps", type=int, default=24, help="the run's horizon (max_steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help='fit(ckpt_path="last")')
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    quiet_cpu()
    L.seed_everything(args.seed, verbose=False)
    data = Samples()
    if args.mode == "broken_unseeded_epoch":
        loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)
    else:
        loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=EpochSeededSampler(len(data), args.seed))
    checkpoints = ModelCheckpoint(dirpath=os.path.join(args.output_dir, "checkpoints"), save_last=True, save_top_k=0)
    trainer = L.Trainer(
        max_steps=args.steps,
        max_epochs=-1,
        accelerator="cpu",
        devices=1,
        default_root_dir=args.output_dir,
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(LitRegressor(args.steps), loader, ckpt_path="last" if args.resume else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
