"""What the command line decides before any work: the run plan (step arithmetic, which steps push), the
precision, compile, CUDA-graph and snapshot policies with the model options and the Hub client's settings
(`Runtime`), and the run's identity that a resume must match (`run_identity`). Pure functions, except
choose_runtime(), which asks torch about the machine."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from trainer.model import ModelOptions
from trainer.runconfig import CHANGEABLE_FIELDS, CONFIG_HASH_FIELDS, RunIdentity
from trainer.store.hub_settings import HubSettings

# The model options a resume may change one by one (--allow-config-change numerics.NAME).
NUMERICS_OPTIONS = tuple(f.name for f in dataclasses.fields(ModelOptions) if f.metadata["numerics"])


class UsageError(Exception):
    """A command-line combination that cannot work; raised before any work is done."""


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


def run_identity(args: argparse.Namespace, plan: RunPlan, runtime: Runtime, *, mix: str) -> RunIdentity:
    """What defines the run (trainer.runconfig.RunIdentity), from the flags, the plan, the machine and the data
    (``mix``: the mix's hash, trainer/data/shards.py mix_hash). Every field is recorded in each checkpoint's
    trainer_state.json; a resume compares all but the two derived step counts (tokens_per_step, total_steps:
    functions of the others) through the identity's hash. `numerics` holds the model options that change what
    is computed (trainer/model/options.py)."""
    return RunIdentity(
        {
            "mix": mix,
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
    )
