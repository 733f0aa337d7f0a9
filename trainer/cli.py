"""The trainer's command line and what is decided before any work: the run plan (step arithmetic), the
precision, compile, CUDA-graph and snapshot policies, the model options, and the run configuration that a
resume must match. Pure functions, except choose_runtime(), which asks torch about the machine."""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from trainer.options import ModelOptions
from trainer.runconfig import CHANGEABLE_FIELDS, CONFIG_HASH_FIELDS
from trainer.store.hub_settings import HubSettings

# The model options a resume may change one by one (--allow-config-change numerics.NAME).
NUMERICS_OPTIONS = tuple(f.name for f in dataclasses.fields(ModelOptions) if f.metadata["numerics"])

DESCRIPTION = "Resumable Llama-style trainer with store-backed checkpoints (the system specprobe checks)."
MODEL_CHOICES = ("ounce100m-22l", "tiny")


class UsageError(Exception):
    """A command-line combination that cannot work; raised before any work is done."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer.train",
        description=DESCRIPTION,
        epilog="Model options: SPECPROBE_* environment variables (trainer/options.py). "
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
        help="let a resume change these run-config fields on purpose (lr, min_lr, warmup_steps, "
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


@dataclass(frozen=True)
class RunPlan:
    """Everything derived from the command line and the world size, checked before any work."""

    world_size: int
    tokens_per_step: int
    total_steps: int
    stop_step: int  # the step this session ends at (== total_steps on the horizon leg)
    warmup_steps: int
    min_lr: float
    grad_ckpt: bool
    resume_mode: str  # "auto" | "must" | "never" | "path"
    resume_path: Path | None
    allowed_changes: frozenset[str] = frozenset()  # --allow-config-change

    @property
    def horizon_leg(self) -> bool:
        return self.stop_step == self.total_steps


def validate_args(args: argparse.Namespace, *, world_size: int, model_max_seq_len: int) -> RunPlan:
    """Checks every flag combination and derives the run plan; raises UsageError naming the flag. Pure except
    for a path check."""
    _check_flags(args, world_size=world_size, model_max_seq_len=model_max_seq_len)
    tps = world_size * args.micro_batch * args.accum * args.seq_len
    if args.tokens % tps:
        raise UsageError(
            f"--tokens {args.tokens} is not a multiple of tokens_per_step {tps} (world_size {world_size}"
            f" x --micro-batch {args.micro_batch} x --accum {args.accum} x --seq-len {args.seq_len});"
            f" nearest: {args.tokens // tps * tps} or {(args.tokens // tps + 1) * tps}"
        )
    total = args.tokens // tps
    if args.stop_after_steps > total:
        raise UsageError(
            f"--stop-after-steps {args.stop_after_steps} is beyond the horizon of {total} "
            f"steps (--tokens {args.tokens} / tokens_per_step {tps})"
        )
    warmup = args.warmup_steps if args.warmup_steps is not None else min(100, total // 10)
    if not 0 <= warmup <= total:
        raise UsageError(f"--warmup-steps must be within [0, {total}], got {warmup}")
    allowed = _allowed_changes(args.allow_config_change)
    mode, path = _resume_source(args.resume)
    return RunPlan(
        world_size=world_size,
        tokens_per_step=tps,
        total_steps=total,
        stop_step=args.stop_after_steps or total,
        warmup_steps=warmup,
        min_lr=args.min_lr if args.min_lr is not None else args.lr / 10,
        grad_ckpt=bool(args.grad_ckpt),
        resume_mode=mode,
        resume_path=path,
        allowed_changes=allowed,
    )


def _check_flags(args: argparse.Namespace, *, world_size: int, model_max_seq_len: int) -> None:
    """Each flag's range, and the pairs of flags that contradict each other."""
    for flag in ("seq_len", "micro_batch", "accum", "tokens", "push_every_steps", "log_every", "keep_optimizer_states"):
        if getattr(args, flag) <= 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    for flag in ("val_tokens", "stop_after_steps", "weight_decay", "grad_clip"):
        if getattr(args, flag) < 0:
            raise UsageError(f"--{flag.replace('_', '-')} must not be negative, got {getattr(args, flag)}")
    if not args.lr > 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    if args.min_lr is not None and not 0 <= args.min_lr <= args.lr:
        raise UsageError(f"--min-lr must be within [0, --lr {args.lr}], got {args.min_lr}")
    if world_size <= 0:
        raise UsageError(f"WORLD_SIZE must be positive, got {world_size}")
    if args.grad_ckpt and args.no_grad_ckpt:
        raise UsageError("--grad-ckpt and --no-grad-ckpt both given: ambiguous, pass exactly one")
    if args.compile and args.no_compile:
        raise UsageError("--compile and --no-compile both given: ambiguous, pass at most one")
    if args.no_compile and args.compile_scope != "auto":
        raise UsageError(f"--compile-scope {args.compile_scope} with --no-compile: ambiguous, pass at most one")
    if args.seq_len > model_max_seq_len:
        raise UsageError(f"--seq-len {args.seq_len} exceeds --model {args.model}'s max_seq_len {model_max_seq_len}")


def _allowed_changes(flags: list[str]) -> frozenset[str]:
    """The run-config fields --allow-config-change names (each flag a comma-separated list); UsageError for
    a field a resume cannot change."""
    allowed = frozenset(n.strip() for item in flags for n in item.split(",") if n.strip())
    for name in sorted(allowed):
        if name.split(".")[0] not in CHANGEABLE_FIELDS or (
            name.startswith("numerics.") and name.split(".", 1)[1] not in NUMERICS_OPTIONS
        ):
            fixed = name in CONFIG_HASH_FIELDS
            raise UsageError(
                f"--allow-config-change {name}: "
                + (
                    "this field cannot change across a resume (it decides the step's shape, the samples each "
                    "rank reads or the data order)"
                    if fixed
                    else "not a run-config field"
                )
                + f"; changeable: {', '.join(CHANGEABLE_FIELDS)} (numerics.OPTION for one of "
                f"{', '.join(NUMERICS_OPTIONS)})"
            )
    return allowed


def _resume_source(resume: str) -> tuple[str, Path | None]:
    """(mode, path) of --resume: auto, must, never, or a local checkpoint directory that must exist."""
    if resume in ("auto", "must", "never"):
        mode, path = resume, None
    else:
        path = Path(resume)
        if not path.is_dir():
            raise UsageError(
                f"--resume {resume}: no such checkpoint directory (use auto, must, never or an existing local "
                "checkpoint dir)"
            )
        mode = "path"
    return mode, path


def checkpoint_steps(start_step: int, stop_step: int, push_every: int) -> list[int]:
    """Steps in (start_step, stop_step] that push: every multiple of push_every, plus the stop step."""
    steps = [s for s in range(start_step + 1, stop_step + 1) if s % push_every == 0]
    if stop_step > start_step and (not steps or steps[-1] != stop_step):
        steps.append(stop_step)
    return steps


@dataclass(frozen=True)
class Precision:
    name: str  # "bf16" | "fp16" | "fp32"
    reason: str  # why, for the `precision:` line
    use_scaler: bool  # fp16 needs a GradScaler; bf16 and fp32 do not

    def line(self) -> str:
        return f"precision: {self.name} ({self.reason})"


def choose_precision(requested: str, device_type: str, capability: tuple[int, int] | None = None) -> Precision:
    """auto: bf16 on cuda capability >= 8.0, fp16 + GradScaler below (T4 is 7.5), fp32 on CPU."""
    if device_type == "cpu":
        if requested in ("auto", "fp32"):
            return Precision("fp32", "cpu" if requested == "auto" else "requested", False)
        raise UsageError(f"--precision {requested} needs --device cuda; the CPU path trains in fp32")
    cap = capability or (0, 0)
    cap_s = f"cuda capability {cap[0]}.{cap[1]}"
    if requested == "auto":
        if cap >= (8, 0):
            return Precision("bf16", f"auto: {cap_s}", False)
        return Precision("fp16", f"auto: {cap_s} has no bf16, GradScaler on", True)
    if requested == "bf16" and cap < (8, 0):
        raise UsageError(f"--precision bf16 needs cuda capability >= 8.0, this GPU has {cap_s}")
    return Precision(requested, f"requested, {cap_s}", requested == "fp16")


def choose_compile(
    compile_flag: bool,
    no_compile_flag: bool,
    device_type: str,
    capability: tuple[int, int] | None = None,
    scope: str = "auto",
) -> tuple[str, str]:
    """(mode, reason), mode "model" | "blocks" | "off". Auto: compile on cuda capability >= 8.0, off on
    CPU (tests) and below 8.0 (T4: Inductor/Triton on sm_75 not measured here); --compile / --no-compile
    force it either way. Scope auto: the whole model on cuda (trainer.compile.compile_model, with kernel
    tuning: the fastest, docs/performance.md), blocks on cpu (seconds to build)."""
    if compile_flag and no_compile_flag:
        raise UsageError("--compile and --no-compile both given: ambiguous, pass at most one")
    cap = capability or (0, 0)
    cap_s = f"cuda capability {cap[0]}.{cap[1]}"
    if no_compile_flag:
        return "off", "requested"
    if compile_flag:
        why = "requested"
    elif device_type != "cuda":
        return "off", "auto: cpu"
    elif cap >= (8, 0):
        why = f"auto: {cap_s}"
    else:
        return "off", f"auto: {cap_s} < 8.0, not measured"
    if scope != "auto":
        return scope, f"{why}, scope requested"
    return ("model" if device_type == "cuda" else "blocks"), why


def choose_cuda_graphs(flag: str, compile_mode: str, device_type: str) -> tuple[bool, str]:
    """(on, reason) for --cuda-graphs. CUDA graphs replay the whole-model graph's ~1,450 kernel launches a
    micro-step as one, so they need cuda and the whole-model compile; auto turns them on exactly then.
    "on" where they cannot run is a usage error, not a silent fallback."""
    if flag not in ("auto", "on", "off"):
        raise UsageError(f"--cuda-graphs {flag!r}: use auto, on or off")
    if flag == "off":
        return False, "requested"
    missing = [
        what
        for what, ok in (("cuda", device_type == "cuda"), ("the whole-model compile", compile_mode == "model"))
        if not ok
    ]
    if missing:
        need = f"needs {' and '.join(missing)} (device {device_type}, compile {compile_mode})"
        if flag == "on":
            raise UsageError(f"--cuda-graphs on {need}")
        return False, f"auto: {need}"
    return True, "requested" if flag == "on" else "auto: whole-model compile on cuda"


def snapshot_mode(device_type: str, environ: Mapping[str, str]) -> tuple[str, float | None]:
    """(path, check) of checkpoint snapshots. path "async" (cuda default): copies into pinned host buffers
    on a side stream, waited for on the device by the next optimizer step; "sync" (cpu default): copies
    on the training thread. SPECPROBE_SNAPSHOT=async|sync forces one (the tests run async on cpu).
    SPECPROBE_SNAPSHOT_CHECK=SECONDS (async only, a diagnostic): also take a blocking copy and compare it
    bitwise with the async one; on cuda the side stream first sleeps SECONDS, so the next optimizer step
    reaches its wait before the copies ran (a torn-copy trap that also exercises the device-wait timing)."""
    mode = environ.get("SPECPROBE_SNAPSHOT") or ("async" if device_type == "cuda" else "sync")
    if mode not in ("async", "sync"):
        raise UsageError(f"SPECPROBE_SNAPSHOT={mode!r}: use async or sync")
    raw = environ.get("SPECPROBE_SNAPSHOT_CHECK")
    try:
        check = float(raw) if raw else None
    except ValueError:
        check = -1.0
    if check is not None and (check < 0 or mode != "async"):
        raise UsageError(f"SPECPROBE_SNAPSHOT_CHECK={raw!r}: seconds >= 0, with the async snapshot")
    return mode, check


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


def run_config(args: argparse.Namespace, plan: RunPlan, runtime: "Runtime") -> dict[str, Any]:
    """What defines the run, recorded in every checkpoint's trainer_state.json. A resume compares every
    field but the two derived step counts (tokens_per_step, total_steps: functions of the others) through
    config_hash (trainer.runconfig.CONFIG_HASH_FIELDS); `numerics` holds the model options that change
    what is computed (trainer/options.py). A change refuses the resume unless --allow-config-change names
    it (and only the recipe fields may be named: trainer.runconfig.CHANGEABLE_FIELDS)."""
    return {
        "model": args.model,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "accum": args.accum,
        "world_size": plan.world_size,
        "tokens": args.tokens,
        "tokens_per_step": plan.tokens_per_step,
        "total_steps": plan.total_steps,
        "lr": args.lr,
        "min_lr": plan.min_lr,
        "warmup_steps": plan.warmup_steps,
        "weight_decay": args.weight_decay,
        "grad_clip": args.grad_clip,
        "schedule": args.schedule,
        "seed": args.seed,
        "precision": runtime.precision.name,
        "numerics": runtime.options.numerics(),
    }


@dataclass(frozen=True)
class Runtime:
    """What the machine and the environment decide before any work, each with its reason for the log."""

    device_type: str  # "cuda" | "cpu"
    precision: Precision
    compile_mode: str  # "model" | "blocks" | "off"
    compile_why: str
    cuda_graphs: bool
    cuda_graphs_why: str
    snapshot: str  # "async" | "sync" (snapshot_mode)
    snapshot_check: float | None
    options: ModelOptions  # resolved for this device
    hub: HubSettings  # the Hub client's retries and timeouts (SPECPROBE_HUB_*), for a Hub store


def choose_runtime(args: argparse.Namespace, environ: Mapping[str, str]) -> Runtime:
    """The Runtime for these flags on this machine; UsageError naming the flag or variable."""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: CUDA is not available on this machine")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device_type = "cuda" if cuda else "cpu"
    capability = torch.cuda.get_device_capability() if cuda else None
    precision = choose_precision(args.precision, device_type, capability)
    compile_mode, compile_why = choose_compile(
        args.compile, args.no_compile, device_type, capability, args.compile_scope
    )
    graphs, graphs_why = choose_cuda_graphs(args.cuda_graphs, compile_mode, device_type)
    snapshot, check = snapshot_mode(device_type, environ)
    try:
        options = ModelOptions.from_env(environ).resolved(device_type, capability)
        hub = HubSettings.from_env(environ)
    except ValueError as e:  # an OptionError, or a SPECPROBE_HUB_* value out of range
        raise UsageError(str(e)) from None
    return Runtime(device_type, precision, compile_mode, compile_why, graphs, graphs_why, snapshot, check, options, hub)
