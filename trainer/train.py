"""Resumable Llama-style trainer with store-backed checkpoints (the system specprobe checks).

Manual
------
One process (CPU or one GPU)::

    python -m trainer.train --root MIX_ROOT --out RUN_DIR --hub-repo file:///abs/store/owner/name \\
        --model tiny --seq-len 32 --micro-batch 2 --accum 2 --tokens 1024 --lr 6e-4 \\
        --push-every-steps 4 --val-tokens 256 --log-every 1 --resume auto --stop-after-steps 0

Several processes on one host (DDP: NCCL on cuda, gloo on cpu)::

    torchrun --nproc_per_node=2 -m trainer.train --root MIX_ROOT --out RUN_DIR --hub-repo owner/name \\
        --prune --seq-len 1024 --attn eager --no-grad-ckpt --micro-batch 4 --accum 32 \\
        --tokens 5242880 --lr 6e-4 --push-every-steps 10 --val-tokens 200000 --log-every 5 \\
        --resume auto --stop-after-steps 10

Step arithmetic: tokens_per_step = world_size * micro_batch * accum * seq_len and the horizon is
tokens / tokens_per_step steps (steps are 1-based). ``--stop-after-steps N`` is an ABSOLUTE step: the
session ends at step N (0 = run to the horizon). The learning-rate schedule always spans the horizon,
so a segmented run follows the same curve as an uninterrupted one.

Checkpoints (store URL forms: ``file:///ROOT/owner/name``, ``hf://owner/name``, bare ``owner/name``;
HF_TOKEN is read from the environment and never printed) are pushed at every multiple of
``--push-every-steps``, at the ``--stop-after-steps`` step EVEN WHEN it is not such a multiple (a segment
always ends on a verified checkpoint, so the next session resumes exactly there), and at the horizon,
which is pushed twice: as ``ckpt/checkpoint-H`` like every push step, then as ``final/`` with a
terminal pointer (the Hub stores identical blobs once, so the second upload costs little). A session that
died between those two pushes resumes from the non-terminal pointer at the horizon and only completes the
final push. Rank 0 snapshots the state to host memory, then writes the checkpoint dir and runs
push -> verify -> move ``latest.json`` -> prune on one background thread; the next checkpoint first waits
for the previous push. A segment stops only after its last push was verified and the pointer moved.
The snapshot on CPU is a blocking copy on the training thread. On CUDA it is asynchronous: pinned host
buffers for the weights and the optimizer state are allocated once before the first step; a checkpoint
only enqueues their copies on a side stream (which first waits for the step that produced the state; the
~800 tensors gathered on the device into a small staging buffer by a copy plan built once, after the
session's first step, ~40 calls in all: ``CKPT snapshot plan:``) and records an event;
the next optimizer step waits for that event on the device (it would overwrite what is being copied) and
the push thread waits for it before reading the buffers. The ranks' RNG states are gathered
asynchronously (gloo) and read by the push thread. ``snapshot_s=`` on the ``CKPT save`` line and RUN_JSON
``ckpt_pause_s_max`` count the training thread's time in the snapshot plus the time the training stream
waited for the copies (``device_wait_s=``); ``snapshot_parts_s=`` splits the thread's time into the RNG
part, the two state_dict() calls and enqueuing the copies, and ``copy_plan=built|replayed`` says whether
this snapshot paid for the plan. H200, frozen model, micro 4 x accum 32: 812 ms blocking vs 17-26 ms
asynchronous with one copy a tensor and a blocking RNG gather (bench/RESULTS.md runs 3, 16, 20), 4.2-4.3 %
of a step once CUDA graphs made it 4x shorter (runs 27, 29); with the copy plan built after the first step
and replayed by every push, 7-9 ms, at most 1.31 % (run 31; run 30 built it in its first push: 15.6 ms).

Compile and defaults per GPU class (measured on H200, bench/RESULTS.md; ``--compile`` / ``--no-compile``
override, the default is auto, ``--compile-scope`` picks what is compiled, and the choice is printed as
``compile: model|blocks|off (why)``):
    cuda capability >= 8.0 (A100, H100/H200): bf16 autocast, compile ON, scope ``model``
        (``Llama.compile_model()``: the whole model in one Inductor graph, in place, with Inductor's
        coordinate-descent kernel tuning: +3.8 % tok/s over ``blocks`` at micro 32, run 9, and +19 % on
        2 ranks at micro 4 x accum 32, 3.56 GiB a rank, run 11; with the projections' weight gradients
        written in fp32 by their GEMMs (trainer/model.py FP32_WGRAD): 1.35-1.36x transformers+
        torch.compile at micro 32, run 19; about 1-2 minutes of warm-up in a fresh process (61-78 s
        at micro 8 and 32, run 19; 120 s on 2 ranks at micro 4, run 20), seconds once Inductor's
        on-disk cache holds the kernels. Inductor's combo kernels are opt-in (SPECPROBE_COMBO_KERNELS=1):
        +1.0 % at micro 32 and +22 % at micro 4 x accum 32 (runs 16, 20), but with the tuning their
        compile ran past 7.5 minutes at micro 8 (runs 13-18, 22); instead of the tuning
        (TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=0 as well) they compile in 60-73 s, equal at micro 32
        and +19 % at micro 4 (run 25), but their 50-step loss check fell outside the bf16 floor once (run
        26). The log's ``compile kernels:`` line says which were on. With the whole-model compile, CUDA
        graphs (``--cuda-graphs`` auto = on; ``compile_model(graphs=True)``) replay each micro-step's
        ~1,450 launches as one: 3.9x tok/s on 2 ranks at micro 4 x accum 32 (2.85 GiB a rank), nothing
        at micro 32 (runs 26-28); the gradients stay allocated and are zeroed in place (see
        trainer.model.keep_grads_allocated), and the log's ``cuda graphs:`` line says whether they ran.
        ``--compile-scope blocks``, for short runs: ``Llama.compile_blocks()``, one graph shared by
        every block, 1-18 s). Regional compile alone: 1.7x tok/s at micro 4 and 1.9x at micro 32 vs
        eager.
        Residual stream in bf16 and sdpa ``enable_gqa`` (trainer/model.py BF16_RESIDUAL, sdpa_gqa()),
        the one-pass loss gradient: 1.30x transformers+torch.compile at micro 32 with blocks (runs 5-7)
    cuda capability < 8.0 (T4): fp16 + GradScaler, compile OFF by default (Inductor/Triton on sm_75 not
        measured here; ``--compile`` to try it); fp32 residual stream, K/V expanded for the
        memory-efficient attention kernel
    cpu: fp32, compile off (the tests; bitwise-exact resume)
The fused chunked cross-entropy is on everywhere (its Triton softmax pass only on CUDA). Compile is not
part of config_hash: a run may resume with it on or off. Under DDP the gradients are views into the
all-reduce buckets and are zeroed in place after each step: no second copy of them (2 x H200, micro 4 x
accum 32: 3.58 GiB a rank, was 4.65); DDP does not re-broadcast the RoPE tables at each forward
(``wrap_ddp``). After the session's first step (the compile) the heap is frozen (``trainer.heap``, logged
as ``gc: N objects frozen``): Python's next full collection would otherwise walk the ~1M objects a compile
leaves, 0.5-1.0 s, at a random step and, under DDP, on every rank's clock. The full collections that still
run after it are counted and timed, worst rank (``gc_full_*`` in RUN_JSON and a closing ``gc:`` line).

Resume: ``--resume auto`` resumes from the store's pointer (fresh start when the repo or pointer is
missing; refused on a terminal or stale pointer, a config change, missing files or a hash mismatch);
``--resume never`` refuses when the store already has a pointer; ``--resume PATH`` loads a local
checkpoint directory. Weights, optimizer, scheduler, grad scaler and every rank's RNG are restored, and
batches are a pure function of (seed, step, rank, micro), so a resumed run is bitwise identical on CPU.

Exit codes (the same on every rank, so torchrun never leaves a rank waiting in a collective):
    0  done (segment boundary or horizon)
    1  unexpected error (traceback)
    2  bad command line, detected before any work (the message names the flag)
    3  refused precondition: resume refused, bad data mix, store unusable at start
    4  a checkpoint push failed (the pointer was not moved past the last verified checkpoint)
Under torchrun the launcher itself exits 1 when a worker fails and lists each worker's exit code.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import random
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_REFUSED, EXIT_PUSH_FAILED = 0, 1, 2, 3, 4
MODEL_CHOICES = ("ounce100m-22l", "tiny")
CKPT_FILES = 5  # model.safetensors, config.json, trainer_state.json, optimizer.pt, rng.pt


class UsageError(Exception):
    """A command-line combination that cannot work; raised before any work is done."""


class Refused(Exception):
    """A precondition the run refuses to proceed without (exit code 3)."""


class PushFailed(Exception):
    """A background checkpoint push failed (exit code 4)."""


# ----------------------------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, required=True, help="data mix root (manifest.json + shards)")
    p.add_argument("--out", type=Path, required=True, help="local run directory (checkpoint staging)")
    p.add_argument("--hub-repo", required=True, help="checkpoint store URL")
    p.add_argument("--prune", action="store_true",
                   help="prune superseded optimizer states in the store and old checkpoint dirs locally")
    p.add_argument("--model", choices=MODEL_CHOICES, default="ounce100m-22l")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--attn", choices=("eager", "sdpa"), default="sdpa")
    # Two independent flags instead of BooleanOptionalAction: giving both must be an error, not
    # argparse's silent last-one-wins.
    p.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing on")
    p.add_argument("--no-grad-ckpt", action="store_true", help="gradient checkpointing off (default)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--tokens", type=int, required=True, help="total training tokens (the horizon)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--min-lr", type=float, default=None, help="final lr (default lr/10)")
    p.add_argument("--warmup-steps", type=int, default=None, help="default: min(100, horizon//10)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="0 disables clipping")
    p.add_argument("--schedule", choices=("cosine", "linear"), default="cosine")
    p.add_argument("--push-every-steps", type=int, default=100)
    p.add_argument("--keep-optimizer-states", type=int, default=1)
    p.add_argument("--val-tokens", type=int, default=0, help="0 skips validation")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--resume", default="auto", help="auto | never | PATH of a local checkpoint dir")
    p.add_argument("--stop-after-steps", type=int, default=0, help="absolute stop step; 0 = horizon")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--precision", choices=("auto", "bf16", "fp16", "fp32"), default="auto")
    p.add_argument("--compile", action="store_true",
                   help="compile, at --compile-scope; default: auto, see --no-compile")
    p.add_argument("--no-compile", action="store_true",
                   help="no compile; default auto = compile on cuda capability >= 8.0, off on CPU and below 8.0")
    p.add_argument("--compile-scope", choices=("auto", "model", "blocks"), default="auto",
                   help="model = the whole model in one graph with Inductor's kernel tuning (fastest; minutes "
                        "of warm-up in a fresh process); blocks = each block, one shared graph (seconds); "
                        "auto = model on cuda, blocks on cpu")
    p.add_argument("--cuda-graphs", choices=("auto", "on", "off"), default="auto",
                   help="replay the compiled model's forward and backward as CUDA graphs (needs cuda and "
                        "--compile-scope model); auto = on exactly then")
    return p


@dataclass(frozen=True)
class RunPlan:
    """Everything derived from the command line and the world size, checked before any work."""
    world_size: int
    tokens_per_step: int
    total_steps: int
    stop_step: int          # the step this session ends at (== total_steps on the horizon leg)
    warmup_steps: int
    min_lr: float
    grad_ckpt: bool
    resume_mode: str        # "auto" | "never" | "path"
    resume_path: Path | None

    @property
    def horizon_leg(self) -> bool:
        return self.stop_step == self.total_steps


def validate_args(args: argparse.Namespace, *, world_size: int, model_max_seq_len: int) -> RunPlan:
    """Checks every flag combination; raises UsageError naming the flag. Pure except for a path check."""
    for flag in ("seq_len", "micro_batch", "accum", "tokens", "push_every_steps", "log_every",
                 "keep_optimizer_states"):
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
        raise UsageError(f"--seq-len {args.seq_len} exceeds --model {args.model}'s max_seq_len "
                         f"{model_max_seq_len}")
    tps = world_size * args.micro_batch * args.accum * args.seq_len
    if args.tokens % tps:
        raise UsageError(
            f"--tokens {args.tokens} is not a multiple of tokens_per_step {tps} (world_size {world_size}"
            f" x --micro-batch {args.micro_batch} x --accum {args.accum} x --seq-len {args.seq_len});"
            f" nearest: {args.tokens // tps * tps} or {(args.tokens // tps + 1) * tps}")
    total = args.tokens // tps
    if args.stop_after_steps > total:
        raise UsageError(f"--stop-after-steps {args.stop_after_steps} is beyond the horizon of {total} "
                         f"steps (--tokens {args.tokens} / tokens_per_step {tps})")
    warmup = args.warmup_steps if args.warmup_steps is not None else min(100, total // 10)
    if not 0 <= warmup <= total:
        raise UsageError(f"--warmup-steps must be within [0, {total}], got {warmup}")
    if args.resume in ("auto", "never"):
        mode, path = args.resume, None
    else:
        path = Path(args.resume)
        if not path.is_dir():
            raise UsageError(f"--resume {args.resume}: no such checkpoint directory (use auto, never or "
                             "an existing local checkpoint dir)")
        mode = "path"
    return RunPlan(world_size=world_size, tokens_per_step=tps, total_steps=total,
                   stop_step=args.stop_after_steps or total, warmup_steps=warmup,
                   min_lr=args.min_lr if args.min_lr is not None else args.lr / 10,
                   grad_ckpt=bool(args.grad_ckpt), resume_mode=mode, resume_path=path)


def checkpoint_steps(start_step: int, stop_step: int, push_every: int) -> list[int]:
    """Steps in (start_step, stop_step] that push: every multiple of push_every, plus the stop step."""
    steps = [s for s in range(start_step + 1, stop_step + 1) if s % push_every == 0]
    if stop_step > start_step and (not steps or steps[-1] != stop_step):
        steps.append(stop_step)
    return steps


# ------------------------------------------------------------------------------ precision, schedule


@dataclass(frozen=True)
class Precision:
    name: str               # "bf16" | "fp16" | "fp32"
    reason: str             # why, for the `precision:` line
    use_scaler: bool        # fp16 needs a GradScaler; bf16 and fp32 do not

    def line(self) -> str:
        return f"precision: {self.name} ({self.reason})"


def choose_precision(requested: str, device_type: str,
                     capability: tuple[int, int] | None = None) -> Precision:
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


def choose_compile(compile_flag: bool, no_compile_flag: bool, device_type: str,
                   capability: tuple[int, int] | None = None, scope: str = "auto") -> tuple[str, str]:
    """(mode, reason), mode "model" | "blocks" | "off". Auto: compile on cuda capability >= 8.0, off on
    CPU (tests) and below 8.0 (T4: Inductor/Triton on sm_75 not measured here); --compile / --no-compile
    force it either way. Scope auto: the whole model on cuda (Llama.compile_model with kernel tuning:
    H200, micro 32, +3.8 % over blocks, bench/RESULTS.md run 9), blocks on cpu (seconds to build)."""
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
    missing = [what for what, ok in (("cuda", device_type == "cuda"),
                                     ("the whole-model compile", compile_mode == "model")) if not ok]
    if missing:
        need = f"needs {' and '.join(missing)} (device {device_type}, compile {compile_mode})"
        if flag == "on":
            raise UsageError(f"--cuda-graphs on {need}")
        return False, f"auto: {need}"
    return True, "requested" if flag == "on" else "auto: whole-model compile on cuda"


def snapshot_mode(device_type: str, environ: Any) -> tuple[str, float | None]:
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


def session_tok_per_s(step_seconds: Sequence[float], tokens_per_step: int) -> float | None:
    """Tokens per second of a session, leaving out its first step (compile, cuBLAS/NCCL and allocator
    warm-up); over that step alone when it is the only one; None when the session trained no step."""
    if not step_seconds:
        return None
    timed = list(step_seconds[1:]) or list(step_seconds)
    return round(len(timed) * tokens_per_step / max(sum(timed), 1e-9), 1)


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


def _lr_factor(done: int, *, total: int, warmup: int, lr: float, min_lr: float, schedule: str) -> float:
    # LambdaLR counts completed steps from 0; our steps are 1-based. A module-level function (not a
    # lambda) keeps the scheduler picklable.
    return lr_at(min(done + 1, total), total=total, warmup=warmup, lr=lr, min_lr=min_lr,
                 schedule=schedule) / lr


def run_config(args: argparse.Namespace, plan: RunPlan, precision: Precision) -> dict[str, Any]:
    """What defines the run; a change in any of these refuses a resume (config_hash)."""
    return {"model": args.model, "seq_len": args.seq_len, "micro_batch": args.micro_batch,
            "accum": args.accum, "world_size": plan.world_size, "tokens": args.tokens,
            "tokens_per_step": plan.tokens_per_step, "total_steps": plan.total_steps, "lr": args.lr,
            "min_lr": plan.min_lr, "warmup_steps": plan.warmup_steps, "weight_decay": args.weight_decay,
            "grad_clip": args.grad_clip, "schedule": args.schedule, "seed": args.seed,
            "precision": precision.name}


# ------------------------------------------------------------------------------------ small helpers

_print_lock = threading.Lock()


def _emit(line: str, stream=None) -> None:
    # One write per line, under a lock: the push thread logs while the training thread prints.
    with _print_lock:
        s = stream or sys.stdout
        s.write(line + "\n")
        s.flush()


def to_host(obj: Any) -> Any:
    """Deep copy of a (nested) state dict with every tensor copied to CPU memory."""
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(v) for v in obj)
    return obj


def tensor_bytes(obj: Any) -> int:
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def wrap_ddp(model: Any, *, device_type: str, local_rank: int, sync_buffers: bool = False) -> Any:
    """The trainer's DistributedDataParallel. gradient_as_bucket_view: each .grad is a view into DDP's
    all-reduce buckets instead of a second full copy of the gradients (425 MB for the frozen model); the
    reduced values are the same. Buffers not synced at each forward: the model's only buffers are the RoPE
    tables, computed from the config alike on every rank, and DDP's default re-broadcasts them from rank 0
    at every forward, one collective more at each of the accum micro-steps, for nothing (bench/RESULTS.md
    run 34). torch >= 2.13 names that `forward_sync_buffers` (`broadcast_buffers` is deprecated there)."""
    import inspect
    from torch.nn.parallel import DistributedDataParallel as DDP
    name = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters \
        else "broadcast_buffers"
    return DDP(model, device_ids=[local_rank] if device_type == "cuda" else None,
               gradient_as_bucket_view=True, **{name: sync_buffers})


class PendingCopy:
    """Snapshot copies in flight on a side stream (cuda), or already done (cpu: `event` is None)."""

    def __init__(self, event: Any = None, device: Any = None):
        self.event, self.device = event, device
        self.reached: Any = None  # timing event recorded where the training stream waits for `event`

    def wait_on_current_stream(self) -> None:
        """Training thread, just before the optimizer step: the device waits, this thread does not."""
        if self.event is None:
            return
        import torch
        reached = torch.cuda.Event(enable_timing=True)
        reached.record()
        torch.cuda.current_stream().wait_event(self.event)
        self.reached = reached  # set only once recorded: the push thread may read it at any time

    def finish(self) -> float:
        """Push thread: blocks until the copies are done; returns the seconds the training stream spent
        waiting for them (0 when it had not reached its optimizer step by then)."""
        if self.event is None:
            return 0.0
        import torch
        with torch.cuda.device(self.device):
            self.event.synchronize()
            reached = self.reached
            # `reached` not recorded yet, or not yet reached by the device: the copies are done, so the
            # stream will pass its wait without stopping. Reached: it stopped from then to the copies' end.
            if reached is None or not reached.query():
                return 0.0
            return max(reached.elapsed_time(self.event), 0.0) / 1000


class _Slot(NamedTuple):
    """Where a state tensor lands in HostBuffers' flat buffer of its dtype."""
    dtype: Any
    offset: int
    shape: tuple


def copy_runs(items: Sequence[tuple[Any, int]], limits: dict) -> list[tuple[int, int]]:
    """[(i, j)]: items[i:j] (dtype, numel) copied as one run, consecutive and of one dtype, at most
    limits[dtype] elements together (no limit for a dtype not in limits); an item over its limit alone."""
    runs: list[tuple[int, int]] = []
    start, total = 0, 0
    for k, (dtype, n) in enumerate(items):
        limit = limits.get(dtype)
        if k > start and (dtype != items[start][0] or (limit is not None and total + n > limit)):
            runs.append((start, k))
            start, total = k, 0
        total += n
    if items:
        runs.append((start, len(items)))
    return runs


class HostBuffers:
    """Host buffers for snapshots, allocated once and reused: one flat buffer per dtype (pinned on cuda, so
    copies are async DMA), each state tensor a view of its slice.

    `start` enqueues the copy of every device tensor of the weights and of the optimizer state on a side
    stream that first waits for the training stream (the step that produced the state), and returns
    host-side state dicts that must not be read before `PendingCopy.finish()`. The tensors go in chunks:
    on cuda one torch.cat into a device staging buffer of at most STAGING_BYTES and one device-to-host copy
    a chunk, about 40 calls for the frozen model's ~800 tensors instead of 800 copies, each with its
    record_stream: enqueuing those one by one took the training thread 7-12 ms (bench/RESULTS.md runs 20,
    27), most of a pause that is 4.2-4.3 % of a step once CUDA graphs made it 4x shorter. The plan of runs and
    host views is built once (see prepare): replayed, the copies take 2.3-3.3 ms (runs 30-31)."""

    STAGING_BYTES = 64 * 2 ** 20   # device memory lent to the copies: small next to a 4 GB budget

    def __init__(self, device: Any):
        import torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.flat: dict[Any, Any] = {}      # dtype -> flat host buffer
        self.staging: dict[Any, Any] = {}   # dtype -> flat device buffer (cuda)
        self.plan: _CopyPlan | None = None

    def _ensure(self, need: dict) -> int:
        """Flat host buffers of at least need[dtype] elements; returns the bytes newly allocated."""
        import torch
        added = 0
        for dtype, n in need.items():
            have = self.flat.get(dtype)
            if have is None or have.numel() < n:
                self.flat[dtype] = torch.empty(n, dtype=dtype, pin_memory=self.cuda)
                added += n * self.flat[dtype].element_size()
            if self.cuda and dtype not in self.staging:
                rows = max(1, min(n, self.STAGING_BYTES // self.flat[dtype].element_size()))
                self.staging[dtype] = torch.empty(rows, dtype=dtype, device=self.device)
        return added

    def reserve(self, specs: Sequence[tuple]) -> int:
        """Room for every (shape, dtype) in specs (a multiset); returns the bytes allocated."""
        need: dict = {}
        for shape, dtype in specs:
            need[dtype] = need.get(dtype, 0) + math.prod(shape)
        return self._ensure(need)

    def start(self, weights: dict, opt_sd: dict, *, delay_s: float = 0.0) -> tuple[dict, dict, PendingCopy, int]:
        """weights: the model's state_dict(keep_vars=True) (the live tensors, the same objects every step);
        opt_sd: the optimizer's state_dict() (its state values are the live tensors too)."""
        import contextlib as _cl
        import torch
        added = self.prepare(weights, opt_sd)
        plan = self.plan
        ctx = _cl.nullcontext()
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            ctx = torch.cuda.stream(self.stream)
        with ctx, torch.no_grad():
            if self.cuda and delay_s > 0:  # the torn-copy trap: copies start after the next step's opt
                torch.cuda._sleep(int(delay_s * 2e9))
            for srcs, stage, dst in plan.runs:
                if len(srcs) == 1:      # one tensor, straight into its host slice
                    dst.copy_(srcs[0], non_blocking=self.cuda)
                elif stage is not None:  # gathered on the device (one kernel), then one DMA to pinned memory
                    torch.cat(srcs, out=stage)
                    dst.copy_(stage, non_blocking=True)
                else:
                    torch.cat(srcs, out=dst)
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(self.stream)

        def host(v: Any) -> Any:   # a cached view; any other tensor (a CPU scalar): copied now
            if isinstance(v, _Slot):
                return plan.views[v]
            return v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v
        w = {k: host(v) for k, v in plan.weights.items()}
        state = {k: {n: host(v) for n, v in st.items()} for k, st in plan.state.items()}
        rest = {k: to_host(v) for k, v in opt_sd.items() if k != "state"}
        # What the copies read stays alive in plan.live; a new plan replaces it only in a later start(),
        # after the push thread saw these copies finish (the trainer waits for the push first).
        return w, {"state": state, **rest}, PendingCopy(event, self.device), added

    def prepare(self, weights: dict, opt_sd: dict) -> int:
        """The copy plan for these live tensors, built unless the current one is theirs; returns the bytes
        of host buffers newly allocated. The trainer calls it once the optimizer state exists (after the
        first step), so that no push pays for the build: 9-17 ms on an H200 host (runs 31-32)."""
        live = [*weights.values(), *(v for st in opt_sd["state"].values() for v in st.values())]
        if self.plan is not None and len(live) == len(self.plan.live) and all(
                a is b for a, b in zip(live, self.plan.live)):
            return 0
        return self._build_plan(weights, opt_sd, live)

    def _build_plan(self, weights: dict, opt_sd: dict, live: list) -> int:
        """Where each live tensor lands (its dtype's flat buffer, in walk order), the copy runs and the host
        views, built once: later snapshots of the same tensors only replay the runs (~40 calls). Returns
        the bytes of host buffers newly allocated."""
        import torch
        offsets: dict = {}
        sources: list = []   # (flat device view, dtype, offset)

        def place(t: Any) -> Any:
            if not torch.is_tensor(t):
                return t
            if t.device.type != self.device.type or not t.is_contiguous():
                return t                      # copied at each snapshot (see start); a flat view needs contiguity
            off = offsets.get(t.dtype, 0)
            offsets[t.dtype] = off + t.numel()
            sources.append((t.detach().reshape(-1), t.dtype, off))
            return _Slot(t.dtype, off, tuple(t.shape))

        w = {k: place(v) for k, v in weights.items()}
        state = {k: {n: place(v) for n, v in st.items()} for k, st in opt_sd["state"].items()}
        added = self._ensure(offsets)
        limits = {d: b.numel() for d, b in self.staging.items()}
        runs = []
        for i, j in copy_runs([(dt, t.numel()) for t, dt, _ in sources], limits):
            srcs, dtype, off = [t for t, _, _ in sources[i:j]], sources[i][1], sources[i][2]
            n = sum(t.numel() for t in srcs)
            stage = self.staging[dtype][:n] if self.cuda and len(srcs) > 1 else None
            runs.append((srcs, stage, self.flat[dtype][off:off + n]))
        views = {slot: self.flat[slot.dtype][slot.offset:slot.offset + math.prod(slot.shape)].view(slot.shape)
                 for slot in [*w.values(), *(v for st in state.values() for v in st.values())]
                 if isinstance(slot, _Slot)}
        self.plan = _CopyPlan(live, runs, w, state, views)
        return added


class _CopyPlan(NamedTuple):
    """HostBuffers' copies of one set of live tensors, replayed while start() is given the same objects."""
    live: list          # the tensors, in walk order (the plan's key, compared by identity)
    runs: list          # (flat sources, device staging slice or None, host slice)
    weights: dict       # the state dicts' structure: _Slot where a tensor is copied, else the value
    state: dict
    views: dict         # _Slot -> its host view


def snapshot_diff(got: Any, want: Any, path: str = "") -> str:
    """'ok tensors=N' when every tensor of `got` equals `want` bitwise (same dtype/shape/bytes), else
    'MISMATCH <first differing path>'. For SPECPROBE_SNAPSHOT_CHECK."""
    import torch
    count = 0

    def walk(a: Any, b: Any, p: str) -> str | None:
        nonlocal count
        if torch.is_tensor(a) or torch.is_tensor(b):
            if not (torch.is_tensor(a) and torch.is_tensor(b)) or a.dtype != b.dtype or a.shape != b.shape:
                return p
            count += 1
            same = torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)) \
                if a.numel() else True
            return None if same else p
        if isinstance(a, dict) and isinstance(b, dict):
            if set(a) != set(b):
                return p + "{keys}"
            return next((r for k in a if (r := walk(a[k], b[k], f"{p}/{k}"))), None)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if len(a) != len(b):
                return p + "[len]"
            return next((r for i, (x, y) in enumerate(zip(a, b)) if (r := walk(x, y, f"{p}[{i}]"))), None)
        return None if a == b else p

    bad = walk(got, want, path)
    return f"MISMATCH {bad}" if bad is not None else f"ok tensors={count}"


OBJ_BYTES = 64 * 2 ** 10   # room for one rank's RNG state in a fixed-size gather (it pickles to ~15 KB)


def pack_object(obj: Any, capacity: int = OBJ_BYTES) -> Any:
    """obj pickled (as all_gather_object does; only ever between this run's own ranks) into a uint8 tensor
    of exactly `capacity` bytes, its length first: every rank's fits one fixed-size all_gather, which can
    then run asynchronously (variable sizes would need a blocking size exchange first)."""
    import pickle
    import torch
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) + 8 > capacity:
        raise ValueError(f"object of {len(data)} bytes exceeds the {capacity - 8} bytes of a packed gather")
    buf = bytearray(capacity)
    buf[:8] = len(data).to_bytes(8, "little")
    buf[8:8 + len(data)] = data
    return torch.frombuffer(buf, dtype=torch.uint8)


def unpack_object(t: Any) -> Any:
    """The object pack_object() packed into t."""
    import pickle
    raw = t.numpy().tobytes()
    n = int.from_bytes(raw[:8], "little")
    if not 0 < n <= len(raw) - 8:
        raise ValueError(f"packed object: length {n} does not fit its {len(raw)}-byte buffer")
    return pickle.loads(raw[8:8 + n])


def rng_state(device_type: str) -> dict[str, Any]:
    """This rank's RNG state, as tensors and plain ints so torch.load(weights_only=True) can read it."""
    import numpy as np
    import torch
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if device_type == "cuda" else None,
            "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                      "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
            "python": {"version": py_state[0], "state": list(py_state[1]), "gauss": py_state[2]}}


def set_rng_state(state: dict[str, Any], device_type: str) -> None:
    import numpy as np
    import torch
    torch.set_rng_state(state["torch"])
    if device_type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))


# -------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    env_rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))

    def usage(msg: str) -> int:
        if env_rank == 0:
            _emit(f"python -m trainer.train: error: {msg}", sys.stderr)
        return EXIT_USAGE

    try:
        from trainer.model import GEOMETRIES
        plan = validate_args(args, world_size=world_size,
                             model_max_seq_len=GEOMETRIES[args.model].max_seq_len)
        import torch
        if args.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: CUDA is not available on this machine")
        device_type = "cuda" if args.device == "cuda" or (args.device == "auto"
                                                          and torch.cuda.is_available()) else "cpu"
        capability = torch.cuda.get_device_capability() if device_type == "cuda" else None
        precision = choose_precision(args.precision, device_type, capability)
        compile_mode, compile_why = choose_compile(args.compile, args.no_compile, device_type, capability,
                                                   args.compile_scope)
        graphs, graphs_why = choose_cuda_graphs(args.cuda_graphs, compile_mode, device_type)
        snapshot_mode(device_type, os.environ)  # a bad SPECPROBE_SNAPSHOT* is a usage error, before any work
    except UsageError as e:
        return usage(str(e))
    trainer = Trainer(args, plan, precision, device_type)
    trainer.compile_mode, trainer.compile_why = compile_mode, compile_why
    trainer.cuda_graphs, trainer.cuda_graphs_why = graphs, graphs_why
    _SESSIONS.append(trainer)   # never garbage-collected mid-exit: see __main__
    return trainer.run()


_SESSIONS: list["Trainer"] = []


class Trainer:
    """One training session: setup, resume, the loop, checkpoints, validation, RUN_JSON."""

    def __init__(self, args: argparse.Namespace, plan: RunPlan, precision: Precision, device_type: str):
        self.args, self.plan, self.precision, self.device_type = args, plan, precision, device_type
        self.t_start = time.time()
        self.pusher: ThreadPoolExecutor | None = None
        self.pending: tuple[int, Future] | None = None
        self.push_steps: list[int] = []
        self.shadow = None  # rank 0's host copy of the model, reused by every snapshot
        self.ckpt_pause_s = 0.0  # longest pause of the training loop for a checkpoint snapshot (rank 0)
        self.ckpt_wait_s = 0.0  # longest wait of the training loop for the previous push (rank 0)
        self.compile_mode, self.compile_why = "off", "off"
        self.cuda_graphs, self.cuda_graphs_why = False, "off"
        self.snapshot_mode, self.snapshot_check = snapshot_mode(device_type, os.environ)
        self.host_buffers: HostBuffers | None = None  # rank 0, async path: buffers allocated once
        self.snap_wait: PendingCopy | None = None  # copies the next optimizer step must wait for
        self.obj_group: Any = None  # the process group of object collectives (None: the default group)
        self.gather_pending: Callable[[], list[Any]] | None = None  # this rank's unfinished gather_later()

    # -- distribution ---------------------------------------------------------------------------
    def setup_distributed(self) -> None:
        import torch
        import torch.distributed as dist
        self.ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun?
        if self.ddp:
            self.rank = int(os.environ["RANK"])
            self.local_rank = int(os.environ["LOCAL_RANK"])
            self.world_size = int(os.environ["WORLD_SIZE"])
            if self.device_type == "cuda":
                torch.cuda.set_device(self.local_rank)
                self.device = torch.device("cuda", self.local_rank)
            else:
                self.device = torch.device("cpu")
            # Long timeout: ranks 1.. wait in a collective while rank 0 pushes a checkpoint to the Hub.
            timeout = datetime.timedelta(minutes=60)
            dist.init_process_group(backend="nccl" if self.device_type == "cuda" else "gloo", timeout=timeout)
            # Python objects (RNG states, errors, the resume decision) go over gloo, host to host: over
            # NCCL each one is staged through the GPUs and syncs them.
            if self.device_type == "cuda":
                self.obj_group = dist.new_group(backend="gloo", timeout=timeout)
        else:
            self.rank, self.local_rank, self.world_size = 0, 0, 1
            self.device = torch.device("cuda", 0) if self.device_type == "cuda" else torch.device("cpu")
        self.master = self.rank == 0

    def log(self, msg: str) -> None:
        if self.master:
            _emit(msg)

    def agree(self, err: str | None) -> str | None:
        """Every rank learns the first error any rank hit (None if none), so all exit together."""
        return next((e for e in self.gather(err) if e), None)

    def gather(self, obj: Any) -> list[Any]:
        if not self.ddp:
            return [obj]
        import torch.distributed as dist
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.obj_group)
        return out

    def gather_later(self, obj: Any) -> Callable[[], list[Any]]:
        """Every rank: start gathering obj from all ranks without waiting for it (a fixed-size gloo gather,
        asynchronous); the returned function waits and returns the list, once. For the RNG states of a
        checkpoint: a blocking gather would wait out the ranks' skew inside the training pause (3-5 ms a
        checkpoint on 2 x H200, runs 20 and 27); rank 0 needs them only on its push thread. Every rank
        waits for its gather at the next _wait_push, before any other collective could overtake it."""
        if not self.ddp:
            return lambda: [obj]
        import torch.distributed as dist
        mine = pack_object(obj)
        outs = [mine.new_empty(mine.shape) for _ in range(self.world_size)]
        work = dist.all_gather(outs, mine, group=self.obj_group, async_op=True)
        done: list[list[Any]] = []

        def wait() -> list[Any]:
            if not done:
                work.wait()
                done.append([unpack_object(t) for t in outs])
            return done[0]
        self.gather_pending = wait
        return wait

    def from_master(self, obj: Any) -> Any:
        if not self.ddp:
            return obj
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.obj_group)
        return box[0]

    # -- the session ------------------------------------------------------------------------------
    def run(self) -> int:
        self.setup_distributed()
        code = EXIT_ERROR
        try:
            code = self._session()
        except Refused as e:
            if self.master:
                _emit(f"refused: {e}", sys.stderr)
            code = EXIT_REFUSED
        except PushFailed as e:
            if self.master:
                _emit(f"CKPT FAILED: {e}", sys.stderr)
            code = EXIT_PUSH_FAILED
        finally:
            if self.pusher is not None:
                self.pusher.shutdown(wait=True)
            # No destroy_process_group(): tearing gloo down from Python can deadlock (its worker thread
            # waits for the GIL that the destructor holds while joining it). __main__ exits without
            # running destructors instead; every push has finished and every collective has completed.
        return code

    def _session(self) -> int:
        import torch
        from trainer.checkpoint import Checkpointer, ResumeRefused, config_hash
        from trainer.data import DataError, load_mix
        from trainer.model import GEOMETRIES, Llama, count_params
        from trainer.store import StoreError, open_store, redact_url

        args, plan = self.args, self.plan
        self.log(self.precision.line())
        cfg = GEOMETRIES[args.model]
        self.cfg = cfg
        self.run_cfg = run_config(args, plan, self.precision)
        self.cfg_hash = config_hash(self.run_cfg)

        # Data: every rank loads the manifest, rank 0 verifies shard hashes; all agree on the outcome.
        err, mix = None, None
        try:
            mix = load_mix(args.root, seq_len=args.seq_len, model_vocab=cfg.vocab_size,
                           need_samples=plan.total_steps * args.micro_batch * args.accum * plan.world_size,
                           verify=self.master)
        except DataError as e:
            err = f"data mix {args.root}: {e}"
        if (err := self.agree(err)):
            raise Refused(err)
        self.mix = mix
        n_shards = mix.manifest.get("n_shards", len(mix.manifest.get("shards", [])))
        self.log(f"mix: {args.root} shards={n_shards} total_tokens={mix.total_tokens} "
                 f"vocab={mix.vocab_size}")

        # Model: the same seed on every rank for the init (DDP also broadcasts rank 0's weights).
        torch.manual_seed(args.seed)
        raw_model = Llama(cfg, attn=args.attn, grad_ckpt=plan.grad_ckpt)
        self.raw_model = raw_model
        self.params = count_params(raw_model)
        self.log(f"params: {self.params} model={args.model}")

        # Store + resume decision: rank 0 alone talks to the store; the decision is broadcast.
        token = os.environ.get("HF_TOKEN") or None
        self.hub_url = redact_url(args.hub_repo)
        self.log(f"checkpoint hub target: {self.hub_url}")
        self.checkpointer = None
        decision: dict[str, Any] = {"error": None, "pointer": None}
        if self.master:
            try:
                store = open_store(args.hub_repo, token=token)
                self.checkpointer = Checkpointer(store, log=_emit, prune=args.prune,
                                                 keep_optimizer_states=args.keep_optimizer_states)
                decision["pointer"] = self._resume_decision(store)
            except (ResumeRefused, StoreError, Refused, ValueError, OSError) as e:
                # ValueError: a malformed latest.json or store URL; OSError: an unusable local store.
                decision["error"] = str(e)
        decision = self.from_master(decision)
        if decision["error"]:
            raise Refused(decision["error"])
        pointer = decision["pointer"]

        ckpt_dir: Path | None = plan.resume_path
        if pointer is not None:
            # Each host's local rank 0 downloads and verifies the pointer's files into --out.
            err = None
            if self.local_rank == 0:
                try:
                    ck = self.checkpointer or Checkpointer(open_store(args.hub_repo, token=token), log=_emit)
                    ckpt_dir = ck.fetch(pointer, args.out / "ckpt" / Path(pointer.path_in_repo).name)
                except (StoreError, OSError) as e:
                    err = f"fetching {pointer.path_in_repo} from {self.hub_url}: {e}"
            if (err := self.agree(err)):
                raise Refused(err)
            # Every rank reads the directory its host's local rank 0 fetched into (torchrun numbers
            # the ranks of one host contiguously).
            paths = self.gather(str(ckpt_dir) if self.local_rank == 0 else None)
            ckpt_dir = Path(paths[self.rank - self.local_rank])

        start_step, resumed_from, loaded = 0, None, None
        if ckpt_dir is not None:
            err = None
            try:
                loaded = self._load_checkpoint(Path(ckpt_dir))
            except (Refused, OSError, KeyError, ValueError, RuntimeError) as e:
                err = f"resume from {ckpt_dir}: {e}"
            if (err := self.agree(err)):
                raise Refused(err)
            start_step = resumed_from = loaded["step"]
            where = pointer.path_in_repo if pointer is not None else str(ckpt_dir)
            self.log(f"resume from step {start_step} ({where}) tokens={loaded['tokens']}")
        # A pointer AT the horizon that is not terminal: the session that trained to the horizon died
        # between its ckpt/ push and its final/ push. Resuming finishes that push, with no training.
        finishing = start_step == plan.total_steps == plan.stop_step
        if start_step >= plan.stop_step and not finishing:
            raise Refused(f"nothing to train: resumed at step {start_step} but this session stops at "
                          f"step {plan.stop_step} (--stop-after-steps {args.stop_after_steps}); a stale "
                          f"stop step would overwrite newer checkpoints")

        return self._train(start_step, resumed_from, loaded)

    def _resume_decision(self, store) -> Any:
        from trainer.checkpoint import read_pointer
        from trainer.store import RepoMissing
        plan = self.plan
        if plan.resume_mode == "auto":
            return self.checkpointer.resume_decision(config_hash=self.cfg_hash,
                                                     horizon_step=plan.total_steps)
        # never / PATH: the store must be usable for the pushes to come; `never` also insists that it
        # holds no run yet, so a fresh start cannot silently fork an existing one.
        try:
            ptr = read_pointer(store)
        except RepoMissing:
            store.create()
            ptr = None
        if not store.exists():
            store.create()
        if plan.resume_mode == "never" and ptr is not None:
            raise Refused(f"--resume never but {self.hub_url} already has a pointer at step {ptr.step} "
                          f"({ptr.path_in_repo}); use --resume auto or a fresh repo")
        return None

    def _load_checkpoint(self, ckpt_dir: Path) -> dict[str, Any]:
        """Loads weights, optimizer/scheduler/scaler and this rank's RNG from a checkpoint dir."""
        import torch
        from safetensors.torch import load_file
        from trainer.model import load_hf_state_dict
        state_path = ckpt_dir / "trainer_state.json"
        if not state_path.is_file():
            raise Refused(f"{state_path} is missing")
        state = json.loads(state_path.read_text())
        if state.get("config_hash") != self.cfg_hash:
            changed = sorted(k for k in set(self.run_cfg) | set(state.get("run_config", {}))
                             if state.get("run_config", {}).get(k) != self.run_cfg.get(k))
            raise Refused(f"config changed since the checkpoint (config_hash {state.get('config_hash')} "
                          f"!= {self.cfg_hash}; differing: {', '.join(changed) or 'unknown'})")
        for name in ("model.safetensors", "optimizer.pt", "rng.pt"):
            if not (ckpt_dir / name).is_file():
                raise Refused(f"{ckpt_dir / name} is missing")
        load_hf_state_dict(self.raw_model, load_file(str(ckpt_dir / "model.safetensors")))
        opt_state = torch.load(ckpt_dir / "optimizer.pt", map_location="cpu", weights_only=True)
        rngs = torch.load(ckpt_dir / "rng.pt", map_location="cpu", weights_only=True)
        if len(rngs) != self.world_size:
            raise Refused(f"rng.pt holds {len(rngs)} ranks, this run has {self.world_size}")
        return {"step": int(state["step"]), "tokens": int(state["tokens_consumed"]),
                "opt": opt_state, "rng": rngs[self.rank]}

    # -- training ---------------------------------------------------------------------------------
    def _train(self, start_step: int, resumed_from: int | None, loaded: dict | None) -> int:
        import torch
        from trainer.data import train_batch
        from trainer.heap import FullCollections, freeze_heap
        from trainer.model import inductor_kernel_settings, keep_grads_allocated

        args, plan, prec = self.args, self.plan, self.precision
        raw_model = self.raw_model.to(self.device)
        model = raw_model
        self.log(f"compile: {self.compile_mode} ({self.compile_why})")
        # Both in place: parameter names unchanged (no `_orig_mod.`), so DDP, checkpoints and the shadow
        # model see the plain module. DDP wraps the compiled module, so its all-reduce hooks stay outside
        # the graph. Compiled inside DDP's forward, the whole model is still split by Dynamo's DDPOptimizer
        # at DDP's 25 MB buckets (~17 graphs for the frozen model), so that buckets reduce during the last
        # micro-step's backward; every 2-rank figure in bench/RESULTS.md has that split.
        if self.compile_mode == "model":
            raw_model.compile_model(graphs=self.cuda_graphs)
        elif self.compile_mode == "blocks":
            raw_model.compile_blocks()
        if self.compile_mode != "off":
            self.log(f"compile kernels: {inductor_kernel_settings()}")
        self.log(f"cuda graphs: {'on' if self.cuda_graphs else 'off'} ({self.cuda_graphs_why})")
        if self.cuda_graphs:
            # Before DDP wraps it: DDP then turns these into its bucket views. Allocated gradients are what
            # keeps accumulation correct under CUDA graphs (see keep_grads_allocated).
            keep_grads_allocated(raw_model)
        if self.ddp:
            model = wrap_ddp(model, device_type=self.device_type, local_rank=self.local_rank)

        # nanoGPT-style AdamW: decay only matrices (not norms); fused kernels on cuda.
        params = [p for p in raw_model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                fused=self.device_type == "cuda")
        sched = torch.optim.lr_scheduler.LambdaLR(opt, partial(
            _lr_factor, total=plan.total_steps, warmup=plan.warmup_steps, lr=args.lr,
            min_lr=plan.min_lr, schedule=args.schedule))
        scaler = torch.amp.GradScaler(self.device_type, enabled=prec.use_scaler)
        if loaded is not None:
            opt.load_state_dict(loaded["opt"]["optimizer"])
            sched.load_state_dict(loaded["opt"]["scheduler"])
            scaler.load_state_dict(loaded["opt"]["scaler"])
            set_rng_state(loaded["rng"], self.device_type)
        else:
            torch.manual_seed(args.seed + self.rank)  # per-rank stream for anything stochastic
        self.model, self.opt, self.sched, self.scaler = model, opt, sched, scaler

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[prec.name]
        autocast = partial(torch.autocast, device_type=self.device_type, dtype=dtype,
                           enabled=prec.name != "fp32")
        push_at = set(checkpoint_steps(start_step, plan.stop_step, args.push_every_steps))
        if self.master and self.snapshot_mode == "async" and (push_at or start_step == plan.total_steps):
            self._prepare_async_snapshot()  # before the first step: allocation is not a training pause
        if start_step == plan.total_steps:  # resumed at the horizon: only the final push is left
            self._checkpoint(start_step, push_ckpt=False, final=True)
        losses: dict[str, float] = {}
        pending_losses: list[tuple[int, torch.Tensor]] = []
        t_log, steps_since_log = time.time(), 0
        step_seconds: list[float] = []  # host time of each step (the first one is left out of tok_per_s)
        gc_full = FullCollections()     # Python's full collections after the freeze: each one stops a step

        def flush_losses() -> None:
            # One reduction per log interval instead of a host sync every step.
            if not pending_losses:
                return
            stacked = torch.stack([t for _, t in pending_losses])
            if self.ddp:
                import torch.distributed as dist
                dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
            vals = (stacked / self.world_size).tolist()
            for (s, _), v in zip(pending_losses, vals):
                losses[str(s)] = v
            pending_losses.clear()

        model.train()
        for step in range(start_step + 1, plan.stop_step + 1):
            t_step = time.time()
            lr_now = opt.param_groups[0]["lr"]
            step_loss = torch.zeros((), device=self.device)
            for micro in range(args.accum):
                if self.cuda_graphs:
                    # Each micro-step is a new replay: nothing of the last one's graph outputs is read again.
                    torch.compiler.cudagraph_mark_step_begin()
                x, y = train_batch(self.mix, seed=args.seed, step=step, rank=self.rank, micro=micro,
                                   world_size=self.world_size, accum=args.accum, batch=args.micro_batch)
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                # Gradients are all-reduced only on the last micro-step.
                sync = not self.ddp or micro == args.accum - 1
                with (contextlib.nullcontext() if sync else model.no_sync()):
                    with autocast():
                        _, loss = model(x, y)
                        loss = loss / args.accum
                    scaler.scale(loss).backward()
                step_loss += loss.detach().float()
            if args.grad_clip > 0:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), args.grad_clip)
            if self.snap_wait is not None:
                # The optimizer step overwrites the weights and moments a checkpoint snapshot is still
                # copying to host memory: the device (not this thread) waits for those copies.
                self.snap_wait.wait_on_current_stream()
                self.snap_wait = None
            scaler.step(opt)
            scaler.update()
            # In place under DDP (the grads are its bucket views) and under CUDA graphs (see
            # keep_grads_allocated); set to None otherwise, which frees them between steps.
            opt.zero_grad(set_to_none=not (self.ddp or self.cuda_graphs))
            sched.step()
            pending_losses.append((step, step_loss))
            steps_since_log += 1
            if step == start_step + 1 or step % args.log_every == 0 or step == plan.stop_step:
                flush_losses()
                now = time.time()
                tok_s = steps_since_log * plan.tokens_per_step / max(now - t_log, 1e-9)
                self.log(f"step {step}/{plan.total_steps} loss {losses[str(step)]:.4f} lr {lr_now:.1e} "
                         f"tok/s {tok_s:.0f}")
                t_log, steps_since_log = now, 0
            if step == start_step + 1:   # the compile is done: what lives now lives for the session
                frozen, gc_s = freeze_heap()
                self.log(f"gc: {frozen} objects frozen after step={step} (one full collection, {gc_s:.2f}s; "
                         f"later collections skip them)")
                gc_full.start()
                if self.host_buffers is not None:
                    self._prepare_copy_plan(step)   # setup, like the buffers: outside every push's pause
            step_seconds.append(time.time() - t_step)
            if step in push_at:
                flush_losses()
                self._checkpoint(step, push_ckpt=True, final=step == plan.total_steps)
        flush_losses()
        final_step = plan.stop_step
        trained_steps = final_step - start_step
        gc_full.stop()
        # Each figure's worst rank: under DDP a collection on any rank stops them all.
        mine = gc_full.summary()
        gc_worst = dict(zip(mine, self._max_over_ranks(list(mine.values()))))
        gc_worst["gc_full_collections"] = int(gc_worst["gc_full_collections"])
        if trained_steps:
            self.log(f"gc: {gc_worst['gc_full_collections']} full collections after the freeze, longest "
                     f"{gc_worst['gc_full_s_max']:.3f}s, total {gc_worst['gc_full_s_total']:.3f}s (worst rank)")

        val = {"val_loss": None, "val_ppl": None, "val_error": None, "val_skipped": True}
        if plan.horizon_leg:
            val = self._validate(autocast)      # overlaps the final push running in the background
            self._wait_push(final_step, announce=False)
            self.log(f"TRAIN DONE step={final_step} tokens={final_step * plan.tokens_per_step} "
                     f"seconds={time.time() - self.t_start:.1f}")
        else:
            self._wait_push(final_step, announce=False)
            self.log(f"segment boundary at step {final_step} (--stop-after-steps "
                     f"{args.stop_after_steps}): stopping")
            self.log("validation skipped (segment leg)")

        peaks = self._peak_stats()
        if self.master:
            first = start_step + 1 if trained_steps else None
            result = {
                "final_step": final_step, "segment_stop": not plan.horizon_leg,
                "resumed_from_step": resumed_from, "first_step": first,
                "tokens_consumed": final_step * plan.tokens_per_step,
                "tok_per_s": session_tok_per_s(step_seconds, plan.tokens_per_step),
                "params": self.params, "grad_ckpt": plan.grad_ckpt, "precision": prec.name,
                "compile": self.compile_mode, "cuda_graphs": self.cuda_graphs,
                "world_size": self.world_size, "final_loss": losses.get(str(final_step)),
                "losses": losses, **val, **peaks, "model": args.model, "seq_len": args.seq_len,
                "micro_batch": args.micro_batch, "accum": args.accum,
                "tokens_per_step": plan.tokens_per_step, "total_steps": plan.total_steps,
                "push_steps": self.push_steps, "hub_repo": self.hub_url,
                "ckpt_pause_s_max": round(self.ckpt_pause_s, 4),
                "ckpt_wait_s_max": round(self.ckpt_wait_s, 4), **gc_worst,
                "seconds": round(time.time() - self.t_start, 1),
            }
            # Strict JSON: a diverged (non-finite) loss becomes null and is counted, never `NaN`.
            bad = [k for k, v in losses.items() if not math.isfinite(v)]
            result["losses"] = {k: (None if k in bad else v) for k, v in losses.items()}
            if result["final_loss"] is not None and not math.isfinite(result["final_loss"]):
                result["final_loss"] = None
            result["nonfinite_losses"] = len(bad)
            _emit("RUN_JSON " + json.dumps(result, allow_nan=False))
        return EXIT_OK

    # -- checkpoints ------------------------------------------------------------------------------
    def _prepare_async_snapshot(self) -> None:
        """Rank 0, async path: the shadow model and the pinned host buffers, once, before the first step.

        The buffers are sized for the weights and for AdamW's state (two moments like each parameter and
        a scalar step); the optimizer state does not exist yet on a fresh start. A layout that differs
        after all gets its missing buffers at the first snapshot, inside the measured pause."""
        import torch
        from trainer.model import Llama
        with torch.random.fork_rng(devices=[]):  # its throwaway init must not advance rank 0's RNG
            self.shadow = Llama(self.cfg, attn=self.args.attn)
        self.host_buffers = HostBuffers(self.device)
        specs = [(tuple(t.shape), t.dtype) for t in self.raw_model.state_dict().values()]
        if self.opt.state:
            specs += [(tuple(t.shape), t.dtype) for st in self.opt.state.values() for t in st.values()
                      if torch.is_tensor(t) and t.device.type == self.device.type]
        else:  # AdamW (fused on cuda): exp_avg and exp_avg_sq like the parameter, `step` an fp32 scalar
            for g in self.opt.param_groups:
                for prm in g["params"]:
                    specs += [(tuple(prm.shape), prm.dtype)] * 2 + [((), torch.float32)]
        t0 = time.perf_counter()
        nbytes = self.host_buffers.reserve(specs)
        self.log(f"CKPT snapshot buffers: {nbytes} bytes {'pinned ' if self.device.type == 'cuda' else ''}"
                 f"host memory in {time.perf_counter() - t0:.2f}s (async snapshot)")

    def _prepare_copy_plan(self, step: int) -> None:
        """Rank 0, async path, after the session's first step (the optimizer state exists from then on):
        the snapshot's copy plan, so that the first push replays it like every later one."""
        t0 = time.perf_counter()
        added = self.host_buffers.prepare(self.raw_model.state_dict(keep_vars=True), self.opt.state_dict())
        plan = self.host_buffers.plan
        self.log(f"CKPT snapshot plan: {len(plan.live)} tensors in {len(plan.runs)} copy runs, built after "
                 f"step={step} in {time.perf_counter() - t0:.4f}s" + (f" ({added} more bytes)" if added else ""))

    def _checkpoint(self, step: int, *, push_ckpt: bool, final: bool) -> None:
        """Snapshot on the training thread (all ranks: RNG gather), then write + push in background.

        sync path (cpu): blocking copies into the shadow model and a host copy of the optimizer state.
        async path (cuda): the copies are only enqueued on a side stream into pinned buffers; the next
        optimizer step waits for them on the device, the push thread before it reads them. The pause
        reported (`snapshot_s=`, ckpt_pause_s_max) is this thread's time here plus that device wait."""
        import torch
        t_wait = time.perf_counter()
        self._wait_push(step, announce=True)
        t0 = time.perf_counter()  # from here to the submit is the snapshot's pause
        # A push still running when the next checkpoint comes (pushes more often than a push lasts)
        # stalls the loop too; reported on its own as ckpt_wait_s_max.
        self.ckpt_wait_s = max(self.ckpt_wait_s, t0 - t_wait)
        rngs = self.gather_later(rng_state(self.device_type))   # read by the push thread
        t_rng = time.perf_counter()
        if push_ckpt:
            self.push_steps.append(step)
        if not self.master:
            return
        pending, check, parts = None, None, ""
        if self.snapshot_mode == "async":
            if self.host_buffers is None:
                self._prepare_async_snapshot()
            # keep_vars: the live parameters themselves, the same objects every time, so HostBuffers reuses
            # its copy plan (a plain state_dict() detaches new tensor objects at every call).
            model_sd, dev_opt_sd = self.raw_model.state_dict(keep_vars=True), self.opt.state_dict()
            t_sd = time.perf_counter()
            plan_before = self.host_buffers.plan
            weights, opt_sd, pending, new_bytes = self.host_buffers.start(
                model_sd, dev_opt_sd, delay_s=self.snapshot_check or 0.0)
            # Where the training thread's pause goes (the next lever on it depends on which part is big).
            parts = (f" snapshot_parts_s=rng:{t_rng - t0:.4f}/state_dict:{t_sd - t_rng:.4f}"
                     f"/copies:{time.perf_counter() - t_sd:.4f}"
                     f" copy_plan={'replayed' if self.host_buffers.plan is plan_before else 'built'}")
            if new_bytes:
                _emit(f"CKPT snapshot buffers: {new_bytes} more bytes at step={step} (layout not foreseen)")
            self.snap_wait = pending
            if self.snapshot_check is not None:  # the step's state, copied the blocking way, to compare
                check = (to_host(self.raw_model.state_dict()), to_host(self.opt.state_dict()))
            opt_state = {"optimizer": opt_sd, "scheduler": self.sched.state_dict(),
                         "scaler": self.scaler.state_dict()}
            nbytes = tensor_bytes(opt_sd) + tensor_bytes(weights)
        else:
            from trainer.model import Llama
            if self.shadow is None:
                with torch.random.fork_rng(devices=[]):  # its throwaway init must not advance rank 0's RNG
                    self.shadow = Llama(self.cfg, attn=self.args.attn)
            self.shadow.load_state_dict(self.raw_model.state_dict())  # copies into host memory
            weights = None
            opt_state = {"optimizer": to_host(self.opt.state_dict()), "scheduler": self.sched.state_dict(),
                         "scaler": self.scaler.state_dict()}
            nbytes = tensor_bytes(opt_state) + sum(
                t.numel() * t.element_size() for t in self.shadow.state_dict().values())
        tokens = step * self.plan.tokens_per_step
        trainer_state = {"step": step, "tokens_consumed": tokens, "run_config": self.run_cfg,
                         "config_hash": self.cfg_hash, "world_size": self.world_size,
                         "final": final, "time": datetime.datetime.now(datetime.timezone.utc).isoformat()}
        if self.pusher is None:
            self.pusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-push")
        pause = time.perf_counter() - t0
        if pending is None:
            self.ckpt_pause_s = max(self.ckpt_pause_s, pause)
        job = partial(self._write_and_push, step, push_ckpt, final, trainer_state, opt_state, rngs, nbytes,
                      tokens, pause, weights, pending, check, parts)
        self.pending = (step, self.pusher.submit(job))

    def _write_and_push(self, step: int, push_ckpt: bool, final: bool, trainer_state: dict,
                        opt_state: dict, rng_gather: Callable[[], list], nbytes: int, tokens: int,
                        pause: float,
                        weights: dict | None = None, pending: "PendingCopy | None" = None,
                        check: tuple | None = None, parts: str = "") -> None:
        from trainer.checkpoint import prune_local, write_checkpoint_dir
        out_dir = self.args.out / "ckpt" / f"checkpoint-{step}"
        rngs = rng_gather()
        nbytes += tensor_bytes(rngs)
        wait = ""
        if pending is not None:
            # The copies must have landed before anything reads the buffers; the device wait they cost
            # the training stream (if it reached the optimizer step first) is part of the pause.
            device_wait = pending.finish()
            pause += device_wait
            self.ckpt_pause_s = max(self.ckpt_pause_s, pause)
            wait = f" device_wait_s={device_wait:.3f}"
            self.shadow.load_state_dict(weights)
            if check is not None:
                verdict = snapshot_diff((weights, opt_state["optimizer"]), check)
                _emit(f"CKPT snapshot-check step={step} {verdict}")
                if not verdict.startswith("ok"):
                    raise RuntimeError(f"async snapshot of step {step} differs from the step's state: {verdict}")
        _emit(f"CKPT save step={step} files={CKPT_FILES} bytes={nbytes} snapshot_s={pause:.3f}{wait}{parts}")
        files = write_checkpoint_dir(out_dir, model=self.shadow, cfg=self.cfg, trainer_state=trainer_state,
                                     optimizer_state=opt_state, rng_states=rngs)
        for to_final in ([False] if push_ckpt else []) + ([True] if final else []):
            self.checkpointer.push(step, out_dir, files, tokens=tokens, config_hash=self.cfg_hash,
                                   final=to_final)
        if self.args.prune:
            prune_local(self.args.out / "ckpt", keep=out_dir)

    def _wait_push(self, step: int, *, announce: bool) -> None:
        """Rank 0 waits for the running push; every rank learns whether it failed."""
        if self.gather_pending is not None:   # the last checkpoint's RNG gather, on every rank
            self.gather_pending()
            self.gather_pending = None
        err = None
        if self.master and self.pending is not None:
            prev_step, fut = self.pending
            if not fut.done() and announce:
                _emit(f"CKPT wait step={step}: push of step={prev_step} still running")
            try:
                fut.result()
            except Exception as e:  # noqa: BLE001 - any failure of the push fails the run, with its cause
                err = f"push of step={prev_step} to {self.hub_url} failed: {type(e).__name__}: {e}"
            self.pending = None
        if (err := self.from_master(err)):
            raise PushFailed(err)

    # -- validation and memory --------------------------------------------------------------------
    def _validate(self, autocast: Callable) -> dict[str, Any]:
        import torch
        from trainer.data import val_batches
        out = {"val_loss": None, "val_ppl": None, "val_error": None, "val_skipped": False}
        if self.args.val_tokens == 0:
            self.log("validation skipped (--val-tokens 0)")
            return {**out, "val_skipped": True}
        # No collective inside the try: a rank that fails must still reach the reduction below.
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        err = None
        try:
            self.raw_model.eval()
            with torch.no_grad():
                for x, y in val_batches(self.mix, tokens=self.args.val_tokens, batch=self.args.micro_batch,
                                        rank=self.rank, world_size=self.world_size):
                    x, y = x.to(self.device), y.to(self.device)
                    if self.cuda_graphs:
                        torch.compiler.cudagraph_mark_step_begin()
                    with autocast():
                        _, loss = self.raw_model(x, y)
                    total[0] += loss.double() * y.numel()
                    total[1] += y.numel()
        except Exception as e:  # noqa: BLE001 - reported in RUN_JSON instead of crashing the leg
            err = f"rank {self.rank}: {type(e).__name__}: {e}"
        finally:
            self.raw_model.train()
        err = self.agree(err)
        if self.ddp:
            import torch.distributed as dist
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
        if err:
            self.log(f"validation failed: {err}")
            return {**out, "val_error": err}
        if total[1].item() == 0:
            return {**out, "val_error": "validation produced no tokens"}
        vloss = (total[0] / total[1]).item()
        ppl = math.exp(vloss) if vloss < 700 else float("inf")
        self.log(f"validation loss {vloss:.4f} ppl {ppl:.2f} tokens {int(total[1].item())}")
        return {**out, "val_loss": vloss, "val_ppl": ppl}

    def _max_over_ranks(self, values: list[float]) -> list[float]:
        """Each value's maximum over the ranks (a collective: every rank calls it at the same point)."""
        import torch
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.ddp:
            import torch.distributed as dist
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def _peak_stats(self) -> dict[str, Any]:
        import torch
        if self.device_type != "cuda":
            self.log("peak_stats: alloc_gb=null reserved_gb=null alloc_gb_max_rank=null "
                     "reserved_gb_max_rank=null (cpu: no device memory stats)")
            return {"peak_gpu_gb": None, "peak_gpu_gb_max_rank": None, "peak_reserved_gb_max_rank": None,
                    "peak_reserved_gb_by_rank": None, "peak_note": "cpu: no device memory stats"}
        gib = 2 ** 30
        mine = [torch.cuda.max_memory_allocated(self.device) / gib, torch.cuda.max_memory_reserved(self.device) / gib]
        a, r, am, rm = (round(v, 3) for v in (*mine, *self._max_over_ranks(mine)))
        # Each rank's own peak (index = rank): one rank far above the others is what the plots show.
        by_rank = self.gather(round(mine[1], 3))
        self.log(f"peak_stats: alloc_gb={a} reserved_gb={r} alloc_gb_max_rank={am} reserved_gb_max_rank={rm}")
        return {"peak_gpu_gb": a, "peak_gpu_gb_max_rank": am, "peak_reserved_gb_max_rank": rm,
                "peak_reserved_gb_by_rank": by_rank}


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Destroying DDP's reducer and the gloo process group at interpreter exit deadlocked a finished
    # rank after its RUN_JSON (gloo's worker thread needs the GIL the destructor holds). The session is
    # over: leave without running destructors.
    os._exit(exit_code)
