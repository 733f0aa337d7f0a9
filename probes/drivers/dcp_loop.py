"""A plain 2-rank training loop that checkpoints with torch.distributed.checkpoint (DCP), as a hand-written
trainer does: a DDP model, AdamW, a LambdaLR schedule, every rank's RNG state, a ``latest`` pointer file naming the last checkpoint.

    torchrun --nproc-per-node 2 -m probes.drivers.dcp_loop --output-dir OUT                # uninterrupted, 20 steps
    SPECPROBE_STOP_AT_STEP=10 torchrun --nproc-per-node 2 -m probes.drivers.dcp_loop ...    # session 1 stops at 10
    torchrun --nproc-per-node 2 -m probes.drivers.dcp_loop --output-dir OUT --resume       # session 2

Checkpoints: ``OUT/ckpt/step-N/`` (``.metadata`` and one ``.distcp`` file per rank) every ``--save-every`` steps, at
the stop and at the horizon; ``OUT/ckpt/latest`` names the last one. Each batch is a pure function of (seed, step,
rank), so a resume needs only the model, the optimizer, the schedule and the step.

A kill during a save: rank 0 prints ``DCP_SAVE_FINISH step=N`` after every rank has written its data and before the
``.metadata`` that completes the checkpoint; ``--hold-in-save N`` then waits ``--hold-s`` seconds there, so a signal
rule on that line lands inside the save of step N every time. ``--mode``:

- ``default``: the pointer moves after the save has returned on every rank; killed during a save, the next session
  resumes from the previous checkpoint and retrains the steps since.
- ``broken_pointer_before_save``: the pointer moves before the save; killed during it, the next session is pointed
  at a checkpoint without ``.metadata`` and cannot load it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

import probes.emit
from probes.drivers.common import Regressor, quiet_cpu, synthetic

MODES = ("default", "broken_pointer_before_save")
BATCH = 4
FINISH_LINE = "DCP_SAVE_FINISH step={step}"


class Writer(dcp.FileSystemWriter):
    """DCP's file writer, saying when the data are written and the metadata not yet (and holding there if asked)."""

    def __init__(self, path: str, step: int, hold_s: float) -> None:
        super().__init__(path)
        self.step, self.hold_s = step, hold_s

    def finish(self, metadata: Any, results: Any) -> None:  # rank 0 only, after every rank wrote its data
        print(FINISH_LINE.format(step=self.step), flush=True)
        if self.hold_s > 0:
            time.sleep(self.hold_s)
        super().finish(metadata, results)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun ... -m probes.drivers.dcp_loop", description=__doc__.split("\n")[0])
    p.add_argument("--output-dir", required=True)
    p.add_argument("--mode", choices=MODES, default="default")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="load the checkpoint that OUT/ckpt/latest names")
    p.add_argument("--hold-in-save", type=int, default=None, metavar="N", help="hold the save of step N (see above)")
    p.add_argument("--hold-s", type=float, default=60.0)
    return p.parse_args(argv)


def _write_pointer(root: str, step: int) -> None:
    tmp = os.path.join(root, "latest.tmp")
    with open(tmp, "w") as f:
        f.write(f"step-{step}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(root, "latest"))  # a reader sees the old pointer or the new one


class Loop:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.root = os.path.join(args.output_dir, "ckpt")
        torch.manual_seed(args.seed)  # the same initial weights on every rank
        self.model = DistributedDataParallel(Regressor(dropout=0.0))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.02, weight_decay=0.0)
        steps = args.steps
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / 3) * max(0.0, 1 - s / steps)
        )
        self.x, self.y = synthetic()
        self.step = 0

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds; every rank's torch RNG state is gathered so each rank saves all of them (DCP
        keeps one copy of a replicated tensor) and a resume restores its own."""
        model, optim = get_state_dict(self.model, self.opt)
        rng = [torch.empty_like(torch.get_rng_state()) for _ in range(self.world)]
        dist.all_gather(rng, torch.get_rng_state())
        return {
            "model": model,
            "optim": optim,
            "scheduler": self.sched.state_dict(),
            "rng": {f"rank{r}": t for r, t in enumerate(rng)},
            "loop": {"step": self.step},
        }

    def save(self) -> None:
        path = os.path.join(self.root, f"step-{self.step}")
        hold = self.args.hold_s if self.args.hold_in_save == self.step else 0.0
        before = self.args.mode == "broken_pointer_before_save"
        if before and self.rank == 0:
            os.makedirs(self.root, exist_ok=True)
            _write_pointer(self.root, self.step)
        dcp.save(self.state(), storage_writer=Writer(path, self.step, hold))
        dist.barrier()
        if not before and self.rank == 0:
            _write_pointer(self.root, self.step)

    def resume(self) -> None:
        with open(os.path.join(self.root, "latest")) as f:
            name = f.read().strip()
        state = self.state()
        dcp.load(state, checkpoint_id=os.path.join(self.root, name))
        set_state_dict(self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"][f"rank{self.rank}"])
        self.step = int(state["loop"]["step"])

    def batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.args.seed * 1_000_003 + self.step * self.world + self.rank)
        idx = torch.randint(0, len(self.x), (BATCH,), generator=g)
        return idx, self.x[idx], self.y[idx]

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        idx, x, y = self.batch()
        loss = self.model(x, y)["loss"]
        loss.backward()
        lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        seen = [torch.empty_like(idx) for _ in range(self.world)]
        dist.all_gather(seen, idx)
        return mean / self.world, torch.cat(seen), lr

    def run(self) -> None:
        if self.args.resume:
            self.resume()
        while self.step < self.args.steps:
            self.step += 1
            loss, seen, lr = self.train_step()
            stop = probes.emit.step(self.step, loss, lr=lr, samples=seen)
            if stop or self.step % self.args.save_every == 0 or self.step == self.args.steps:
                self.save()
            if stop:
                probes.emit.stopped(os.path.join(self.root, f"step-{self.step}"))
                return


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    quiet_cpu()
    dist.init_process_group("gloo")
    try:
        Loop(args).run()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
