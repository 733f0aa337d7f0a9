"""The learning-rate schedule: linear warm-up to the peak, then cosine or linear decay to the floor, reached
exactly at the horizon; `lr_factor` is the same curve as torch's LambdaLR asks for it."""

from __future__ import annotations

import math


def lr_at(step: int, *, total: int, warmup: int, lr: float, min_lr: float, schedule: str) -> float:
    """Learning rate of 1-based `step`: linear warmup to lr, then cosine or linear decay to min_lr."""
    if not 1 <= step <= total:
        raise ValueError(f"step {step} outside 1..{total}")
    if step <= warmup:
        return lr * step / warmup
    decay_steps = total - warmup
    frac = (step - warmup) / decay_steps  # in (0, 1]; reaches min_lr exactly at the horizon
    if schedule == "cosine":
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * frac))
    if schedule == "linear":
        return lr + (min_lr - lr) * frac
    raise ValueError(f"unknown schedule {schedule!r}")


def lr_factor(done: int, *, total: int, warmup: int, lr: float, min_lr: float, schedule: str) -> float:
    # LambdaLR counts completed steps from 0; our steps are 1-based. A module-level function (not a
    # lambda) keeps the scheduler picklable.
    return lr_at(min(done + 1, total), total=total, warmup=warmup, lr=lr, min_lr=min_lr, schedule=schedule) / lr
