"""The trainer's command line: `build_parser()`, its flags in the order --help lists them. What the flags
decide (the run plan, the machine's policies, the run's identity) is trainer/plan.py's."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = "Resumable Llama-style trainer with store-backed checkpoints (the system specprobe checks)."
MODEL_CHOICES = ("ounce100m-22l", "tiny")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer.train",
        description=DESCRIPTION,
        # The exit codes are trainer.train.Exit's, written out: train imports this module, so this one cannot
        # import them (tests/test_trainer/test_train_cli.py holds the two alike).
        epilog="Model options: SPECPROBE_* environment variables (trainer/model/options.py). "
        "Exit codes: 0 done, 1 error, 2 usage, 3 refused, 4 push failed.",
    )
    for add in (_add_data_and_store, _add_model_and_batch, _add_optimizer, _add_session, _add_machine):
        add(p)  # in this order: --help lists the flags as they are added
    return p


def _add_data_and_store(p: argparse.ArgumentParser) -> None:
    """Where the data comes from and where checkpoints go."""
    p.add_argument("--root", type=Path, required=True, help="data mix root (manifest.json + shards)")
    p.add_argument("--out", type=Path, required=True, help="local run directory (checkpoint staging)")
    p.add_argument("--hub-repo", required=True, help="checkpoint store URL")
    p.add_argument(
        "--prune",
        action="store_true",
        help="prune superseded optimizer states in the store and old checkpoint dirs locally",
    )


def _add_model_and_batch(p: argparse.ArgumentParser) -> None:
    """The model, the shape of a step and the horizon."""
    p.add_argument(
        "--model",
        choices=MODEL_CHOICES,
        default="ounce100m-22l",
        help="geometry: the frozen 106,194,240-parameter model, or tiny for CPU tests",
    )
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sample")
    p.add_argument("--attn", choices=("eager", "sdpa"), default="sdpa", help="attention kernel")
    # Two independent flags instead of BooleanOptionalAction: giving both must be an error, not
    # argparse's silent last-one-wins.
    p.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing on")
    p.add_argument("--no-grad-ckpt", action="store_true", help="gradient checkpointing off (default)")
    p.add_argument("--micro-batch", type=int, default=4, help="samples per rank per micro-step")
    p.add_argument("--accum", type=int, default=1, help="gradient-accumulation micro-steps per step")
    p.add_argument("--tokens", type=int, required=True, help="total training tokens (the horizon)")


def _add_optimizer(p: argparse.ArgumentParser) -> None:
    """AdamW and its learning-rate schedule."""
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (AdamW)")
    p.add_argument("--min-lr", type=float, default=None, help="final lr (default lr/10)")
    p.add_argument("--warmup-steps", type=int, default=None, help="default: min(100, horizon//10)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay of the matrices")
    p.add_argument("--grad-clip", type=float, default=1.0, help="0 disables clipping")
    p.add_argument("--schedule", choices=("cosine", "linear"), default="cosine", help="decay after warm-up")


def _add_session(p: argparse.ArgumentParser) -> None:
    """This session: checkpoints, validation, logging, where it resumes from and stops; the seed."""
    p.add_argument(
        "--push-every-steps",
        type=int,
        default=100,
        help="push a checkpoint at every multiple (and at the stop step and the horizon)",
    )
    p.add_argument(
        "--keep-optimizer-states",
        type=int,
        default=1,
        help="newest checkpoints that keep optimizer + RNG state after pruning",
    )
    p.add_argument("--val-tokens", type=int, default=0, help="0 skips validation")
    p.add_argument("--log-every", type=int, default=10, help="progress line every N steps")
    p.add_argument(
        "--resume",
        default="auto",
        help="auto (the store's pointer; a missing or empty repo starts fresh) | must (the same, but a missing or "
        "empty repo is refused: every session after the first) | never | PATH of a local checkpoint dir",
    )
    p.add_argument(
        "--allow-config-change",
        action="append",
        default=[],
        metavar="FIELD[,FIELD...]",
        help="let a resume change these run-config fields on purpose (mix, lr, min_lr, warmup_steps, "
        "weight_decay, grad_clip, schedule, precision, tokens, numerics or numerics.OPTION); "
        "each change is logged and recorded in RUN_JSON config_changes",
    )
    p.add_argument(
        "--allow-pointer-rollback",
        action="store_true",
        help="resume from (or push over) a latest.json that moved back to an earlier step",
    )
    p.add_argument("--stop-after-steps", type=int, default=0, help="absolute stop step; 0 = horizon")
    p.add_argument("--seed", type=int, default=1337, help="model init and data order")


def _add_machine(p: argparse.ArgumentParser) -> None:
    """The device and what runs on it: precision, compile, CUDA graphs."""
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto = cuda when available")
    p.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp16", "fp32"),
        default="auto",
        help="auto = bf16 on cuda capability >= 8.0, fp16 + GradScaler below, fp32 on cpu",
    )
    p.add_argument(
        "--compile", action="store_true", help="compile, at --compile-scope; default: auto, see --no-compile"
    )
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="no compile; default auto = compile on cuda capability >= 8.0, off on CPU and below 8.0",
    )
    p.add_argument(
        "--compile-scope",
        choices=("auto", "model", "blocks"),
        default="auto",
        help="model = the whole model in one graph with Inductor's kernel tuning (fastest; minutes "
        "of warm-up in a fresh process); blocks = each block, one shared graph (seconds); "
        "auto = model on cuda, blocks on cpu",
    )
    p.add_argument(
        "--cuda-graphs",
        choices=("auto", "on", "off"),
        default="auto",
        help="replay the compiled model's forward and backward as CUDA graphs (needs cuda and "
        "--compile-scope model); auto = on exactly then",
    )
