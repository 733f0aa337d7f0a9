"""Resumable Llama-style trainer with store-backed checkpoints (the system specprobe checks).

One process (CPU or one GPU)::

    python -m trainer.train --root MIX --out RUN --hub-repo file:///abs/store/owner/name --model tiny \\
        --seq-len 32 --micro-batch 2 --accum 2 --tokens 1024 --push-every-steps 4 --val-tokens 256 --log-every 1

Two GPUs of one host (DDP: NCCL on cuda, gloo on cpu), a segment of the frozen model that stops at step 10::

    torchrun --nproc_per_node=2 -m trainer.train --root MIX --out RUN --hub-repo owner/name --prune \\
        --seq-len 1024 --attn eager --micro-batch 4 --accum 32 --tokens 5242880 --lr 6e-4 \\
        --push-every-steps 10 --val-tokens 200000 --log-every 5 --resume auto --stop-after-steps 10

tokens_per_step = world_size x micro_batch x accum x seq_len, and the horizon is tokens / tokens_per_step
steps. --stop-after-steps N ends the session at the ABSOLUTE step N (0 = the horizon), always on a verified
checkpoint; --resume auto continues from the store's latest.json on the same learning-rate curve, bitwise on
CPU. Checkpoints are pushed at every multiple of --push-every-steps, at the stop step and at the horizon
(then again as final/ with a terminal pointer). Model options: SPECPROBE_* variables (trainer/model/options.py).
The lines the specs read: docs/DESIGN.md; speed, memory and the defaults per GPU: docs/performance.md.

Exit codes: :class:`Exit` below, the same on every rank.
"""

from __future__ import annotations

import argparse
import enum
import hashlib
import json
import math
import os
import random
import sys
import time
from functools import partial
from typing import Any, Sequence

from trainer.deps import command_imports

# A core-only install says which dependency is missing, in one line (trainer/deps.py).
with command_imports("python -m trainer.train", __name__):
    import numpy as np
    import torch

    from trainer import sigterm
    from trainer.ckpt.resume import Refused, resume
    from trainer.ckpt.rng import set_rng_state
    from trainer.ckpt.session import CheckpointSession, PushFailed
    from trainer.ckpt.snapshot import Snapshotter
    from trainer.cli import build_parser
    from trainer.data import DataError, load_mix, train_batch, val_batches
    from trainer.dist import Dist, GradientSync
    from trainer.heap import FullCollections, freeze_heap
    from trainer.log import emit, setup_logging
    from trainer.model import (
        GEOMETRIES,
        Llama,
        compile_blocks,
        compile_model,
        count_params,
        decay_groups,
        inductor_kernel_settings,
        keep_grads_allocated,
    )
    from trainer.plan import RunPlan, Runtime, UsageError, choose_runtime, run_identity, validate_args
    from trainer.runconfig import RunIdentity
    from trainer.schedule import lr_factor
    from trainer.steptime import StepTimer
    from trainer.store import parse_store_url, redact_url


class Exit(enum.IntEnum):
    """Exit codes of `python -m trainer.train`, the same on every rank. A SIGTERM ends the process by that
    signal instead (trainer/sigterm.py): the launcher sees -15, never a code."""

    DONE = 0  # the session trained to its stop step, and every push it made verified
    ERROR = 1  # an unexpected error: the traceback says where (Python's own code for one)
    USAGE = 2  # a bad command line or SPECPROBE_* value, refused before any work (argparse's own code too)
    REFUSED = 3  # a precondition not met: the resume, the data mix, the store (its lease, its pointer)
    PUSH_FAILED = 4  # a checkpoint push failed; the store's pointer still names the last verified checkpoint


def main(argv: Sequence[str] | None = None) -> Exit:
    args = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(rank)
    try:
        plan = validate_args(
            args,
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            model_max_seq_len=GEOMETRIES[args.model].max_seq_len,
        )
        runtime = choose_runtime(args, os.environ)  # a bad SPECPROBE_* value is a usage error too
    except UsageError as e:
        # Every rank says it: torchrun stops the others as soon as the first rank exits, so a message
        # left to rank 0 alone is lost whenever another rank gets there first.
        emit(f"python -m trainer.train: error: {e}", sys.stderr)
        return Exit.USAGE
    trainer = Trainer(args, plan, runtime)
    _SESSIONS.append(trainer)  # never garbage-collected mid-exit: see __main__
    code = trainer.run()
    if sigterm.received() and (trainer.terminated or code == Exit.DONE):
        sigterm.end_by_signal()  # the launcher sees a SIGTERM, never a success
    return code


_SESSIONS: list["Trainer"] = []

# A step's batch digest: 8 bytes (16 hex digits) tell two data orders apart, and keep RUN_JSON's
# `batches` at ~30 bytes a step.
DIGEST_BYTES = 8


def combine_digests(by_rank: Sequence[dict[str, str]]) -> dict[str, str]:
    """One digest per step over every rank's tokens (`by_rank` in rank order): the whole step's batch,
    whichever rank trained which part of it."""
    steps = by_rank[0] if by_rank else {}
    out = {}
    for step in steps:
        h = hashlib.blake2b(digest_size=DIGEST_BYTES)
        for rank in by_rank:
            h.update(rank.get(step, "-").encode())
        out[step] = h.hexdigest()
    return out


def _is_hub(url: str) -> bool:
    """A Hugging Face Hub store URL (an invalid one is refused later, where the store is opened)."""
    try:
        return parse_store_url(url).kind == "hf"
    except ValueError:
        return False


def session_tok_per_s(step_seconds: Sequence[float], tokens_per_step: int) -> float | None:
    """Tokens per second of a session, leaving out its first step (compile, cuBLAS/NCCL and allocator
    warm-up); over that step alone when it is the only one; None when the session trained no step."""
    if not step_seconds:
        return None
    timed = list(step_seconds[1:]) or list(step_seconds)
    return round(len(timed) * tokens_per_step / max(sum(timed), 1e-9), 1)


class Trainer:
    """One training session: setup -> resume (trainer/ckpt/resume.py) -> build -> loop -> finish."""

    def __init__(self, args: argparse.Namespace, plan: RunPlan, runtime: Runtime):
        self.args, self.plan, self.rt = args, plan, runtime
        self.t_start = time.time()
        self.cfg = GEOMETRIES[args.model]
        self.identity: RunIdentity | None = None  # from setup() on, once the mix is read: its hash is part of it
        self.hub_url = redact_url(args.hub_repo)
        self.saves: CheckpointSession | None = None  # from the resume on: it holds the store's lease
        self.losses: dict[str, float] = {}
        self.lrs: dict[str, float] = {}  # the learning rate each step's optimizer step used
        self.batch_digests: dict[str, str] = {}  # this rank's tokens of each step, hashed (batch_digest)
        self.config_changes: list[dict[str, Any]] = []  # what --allow-config-change let the resume change
        self.step_seconds: list[float] = []  # host time of each step (the first is left out of tok_per_s)
        self.terminated = False  # a SIGTERM cut the session short (trainer/sigterm.py)

    def log(self, msg: str) -> None:
        if self.dist.master:
            emit(msg)

    def run(self) -> Exit:
        self.dist = Dist(self.rt.device_type, os.environ)
        sigterm.install()  # from here on the session holds things a SIGTERM must not leave held
        code = Exit.ERROR
        try:
            self.setup()
            begin = resume(
                self.dist,
                self.args,
                self.plan,
                self.raw_model,
                identity=self.identity,
                log=self.log,
                hub=self.rt.hub,
            )
            self.saves = CheckpointSession(
                self.dist,
                begin.checkpointer,
                self.snapshots,
                start=begin.step,
                plan=self.plan,
                push_every=self.args.push_every_steps,
                out=self.args.out,
                cfg=self.cfg,
                prune=self.args.prune,
                identity=self.identity,
                model_options=self.rt.options.as_dict(),
                hub_url=self.hub_url,
            )
            self.config_changes = begin.config_changes
            self.build(begin.loaded)
            self.loop(begin.step)
            code = self.finish(begin.step, begin.loaded["step"] if begin.loaded else None)
        except Refused as e:
            if self.dist.master:
                emit(f"refused: {e}", sys.stderr)
            code = Exit.REFUSED
        except PushFailed as e:
            if self.dist.master:
                emit(f"CKPT FAILED: {e}", sys.stderr)
            code = Exit.PUSH_FAILED
        except sigterm.Terminated:
            self.terminated = True  # resume() released the lease already if it held it
        finally:
            if self.saves is not None:
                # The running push finishes (a SIGTERM abandons it), then the store's lease is released.
                try:
                    self.saves.close(abandon_push=sigterm.received())
                except sigterm.Terminated:  # it came while the push was being waited for
                    self.terminated = True
                    self.saves.close(abandon_push=True)
            if sigterm.received():
                cut = self.terminated or code == Exit.DONE
                emit(
                    f"terminated: SIGTERM {'stopped the session' if self.terminated else 'arrived as it ended'} "
                    f"(rank {self.dist.rank}); "
                    + ("ending by SIGTERM" if cut else f"exiting with its own code {code}"),
                    sys.stderr,
                )
            # No destroy_process_group(): tearing gloo down from Python can deadlock (its worker thread
            # waits for the GIL that the destructor holds while joining it). __main__ exits without
            # running destructors instead; every push has finished and every collective has completed.
        return code

    # -- setup: data, model, store ----------------------------------------------------------------
    def setup(self) -> None:
        args, plan, rt = self.args, self.plan, self.rt
        self.log(rt.precision.line())
        self.log(rt.options.line())
        # Every rank loads the manifest, rank 0 verifies the shards' hashes; all agree on the outcome.
        err, mix = None, None
        try:
            mix = load_mix(
                args.root,
                seq_len=args.seq_len,
                model_vocab=self.cfg.vocab_size,
                need_samples=plan.total_steps * args.micro_batch * args.accum * plan.world_size,
                verify=self.dist.master,
            )
        except DataError as e:
            err = f"data mix {args.root}: {e}"
        if err := self.dist.agree(err):
            raise Refused(err)
        self.mix = mix
        self.identity = run_identity(args, plan, rt, mix=mix.sha256)
        n_shards = mix.manifest.get("n_shards", len(mix.manifest.get("shards", [])))
        self.log(
            f"mix: {args.root} shards={n_shards} total_tokens={mix.total_tokens} vocab={mix.vocab_size} "
            f"sha256={mix.sha256}"
        )
        # The same seed on every rank for the init (DDP also broadcasts rank 0's weights).
        torch.manual_seed(args.seed)
        self.raw_model = Llama(self.cfg, attn=args.attn, grad_ckpt=plan.grad_ckpt, options=rt.options)
        self.params = count_params(self.raw_model)
        self.log(f"params: {self.params} model={args.model}")
        self.log(f"checkpoint hub target: {self.hub_url}")
        if _is_hub(args.hub_repo):
            self.log(rt.hub.line())
        self.snapshots = Snapshotter(
            rt.snapshot,
            rt.snapshot_check,
            self.dist.device,
            emit=emit,
            new_model=lambda: Llama(self.cfg, attn=args.attn, options=rt.options),
        )

    # -- build: device, compile, gradient sync, optimizer ---------------------------------------------------------
    def build(self, loaded: dict | None) -> None:
        args, plan, rt = self.args, self.plan, self.rt
        raw = self.raw_model.to(self.dist.device)
        self.log(f"compile: {rt.compile_mode} ({rt.compile_why})")
        # In place: parameter names unchanged, and the checkpoint and the snapshot see the plain module.
        if rt.compile_mode == "model":
            compile_model(raw, rt.options, graphs=rt.cuda_graphs)
        elif rt.compile_mode == "blocks":
            compile_blocks(raw, rt.options)
        if rt.compile_mode != "off":
            self.log(f"compile kernels: {inductor_kernel_settings()}")
        self.log(f"cuda graphs: {'on' if rt.cuda_graphs else 'off'} ({rt.cuda_graphs_why})")
        trainable = [p for p in raw.parameters() if p.requires_grad]
        # Several ranks: one all-reduce per step of gradients kept in one flat buffer (trainer/dist.py says
        # why not DDP); it also keeps them allocated, which CUDA graphs need.
        self.grads = GradientSync(trainable, self.dist.world_size) if self.dist.ddp else None
        if rt.cuda_graphs and self.grads is None:
            keep_grads_allocated(raw)
        # nanoGPT-style AdamW: decay only matrices (not norms); fused kernels on cuda.
        matrices, rest = decay_groups(raw)
        groups = [{"params": matrices, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=rt.device_type == "cuda")
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt,
            partial(
                lr_factor,
                total=plan.total_steps,
                warmup=plan.warmup_steps,
                lr=args.lr,
                min_lr=plan.min_lr,
                schedule=args.schedule,
            ),
        )
        self.scaler = torch.amp.GradScaler(rt.device_type, enabled=rt.precision.use_scaler)
        if loaded is not None:
            self.opt.load_state_dict(loaded["opt"]["optimizer"])
            self.sched.load_state_dict(loaded["opt"]["scheduler"])
            if self.scaler.is_enabled() and loaded["opt"]["scaler"]:  # empty from a run without a scaler
                self.scaler.load_state_dict(loaded["opt"]["scaler"])
            set_rng_state(loaded["rng"], rt.device_type)
            # The optimizer's state brings back the saved run's weight decay and peak lr: this run's flags
            # win (they equal the saved ones unless --allow-config-change let them differ), from this step.
            for group, wd in zip(self.opt.param_groups, (args.weight_decay, 0.0)):
                group["weight_decay"] = wd
            self.sched.base_lrs = [args.lr] * len(self.opt.param_groups)
            for group, fn in zip(self.opt.param_groups, self.sched.lr_lambdas):
                group["lr"] = args.lr * fn(self.sched.last_epoch)
        else:
            torch.manual_seed(args.seed + self.dist.rank)  # per-rank stream for anything stochastic
            # Python's and numpy's too: they are saved in rng.pt, which must be a function of the seed.
            random.seed(args.seed + self.dist.rank)
            np.random.seed(args.seed + self.dist.rank)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[rt.precision.name]
        self.autocast = partial(
            torch.autocast, device_type=rt.device_type, dtype=dtype, enabled=rt.precision.name != "fp32"
        )

    # -- the loop -------------------------------------------------------------------------------------
    def loop(self, start: int) -> None:
        args, plan = self.args, self.plan
        self.saves.track(self.raw_model, self.opt, self.sched, self.scaler)
        if start == plan.total_steps:  # resumed at the horizon: only the final push is left
            self.saves.save(start)
        pending: list[tuple[int, torch.Tensor]] = []  # losses not yet read back from the device
        t_log, since_log = time.time(), 0
        self.gc_full = FullCollections()  # Python's full collections after the freeze: each one stops a step
        self.timer = StepTimer(self.dist.device)
        self.raw_model.train()
        for step in range(start + 1, plan.stop_step + 1):
            t_step = time.time()
            self.timer.mark()
            lr_now = self.opt.param_groups[0]["lr"]
            self.lrs[str(step)] = lr_now
            pending.append((step, self.train_step(step)))
            since_log += 1
            if step == start + 1 or step % args.log_every == 0 or step == plan.stop_step:
                if step == plan.stop_step:
                    self.timer.mark()  # the last step's end, before the flush lets the device catch up
                self.flush_losses(pending)
                self.timer.read()
                now = time.time()
                tok_s = since_log * plan.tokens_per_step / max(now - t_log, 1e-9)
                self.log(
                    f"step {step}/{plan.total_steps} loss {self.losses[str(step)]:.4f} lr {lr_now:.1e} "
                    f"tok/s {tok_s:.0f}"
                )
                t_log, since_log = now, 0
            if step == start + 1:  # the compile is done: what lives now lives for the session
                frozen, gc_s = freeze_heap()
                self.log(
                    f"gc: {frozen} objects frozen after step={step} (one full collection, {gc_s:.2f}s; "
                    f"later collections skip them)"
                )
                self.gc_full.start()
                self.snapshots.prepare_plan(self.raw_model, self.opt, step)  # setup, outside every pause
            self.step_seconds.append(time.time() - t_step)
            if self.saves.due(step):
                self.flush_losses(pending)
                self.saves.save(step)
        self.flush_losses(pending)
        self.gc_full.stop()

    def train_step(self, step: int) -> torch.Tensor:
        """One optimizer step of `accum` micro-steps; returns its loss, still on the device."""
        args, rt, ddp = self.args, self.rt, self.dist.ddp
        step_loss = torch.zeros((), device=self.dist.device)
        digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
        for micro in range(args.accum):
            if rt.cuda_graphs:  # each micro-step is a new replay: nothing of the last one's outputs is read
                torch.compiler.cudagraph_mark_step_begin()
            x, y = train_batch(
                self.mix,
                seed=args.seed,
                step=step,
                rank=self.dist.rank,
                micro=micro,
                world_size=self.dist.world_size,
                accum=args.accum,
                batch=args.micro_batch,
            )
            # Still on the host: hashing what this rank trains on costs no device sync.
            digest.update(x.numpy())
            digest.update(y.numpy())
            x, y = x.to(self.dist.device, non_blocking=True), y.to(self.dist.device, non_blocking=True)
            with self.autocast():
                _, loss = self.raw_model(x, y)
                loss = loss / args.accum
            self.scaler.scale(loss).backward()
            step_loss += loss.detach().float()
        if self.grads is not None:
            self.grads.all_reduce()
        if args.grad_clip > 0:
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), args.grad_clip)
        self.snapshots.before_optimizer_step()
        self.scaler.step(self.opt)
        self.scaler.update()
        # In place on several ranks (the grads are views of GradientSync's buffer) and under CUDA graphs
        # (see keep_grads_allocated); set to None otherwise, which frees them between steps.
        self.opt.zero_grad(set_to_none=not (ddp or rt.cuda_graphs))
        self.sched.step()
        self.batch_digests[str(step)] = digest.hexdigest()
        return step_loss

    def flush_losses(self, pending: list[tuple[int, torch.Tensor]]) -> None:
        """The pending steps' losses, averaged over the ranks: one reduction per log interval instead of a
        host sync every step."""
        if not pending:
            return
        vals = (self.dist.sum_(torch.stack([t for _, t in pending])) / self.dist.world_size).tolist()
        for (s, _), v in zip(pending, vals):
            self.losses[str(s)] = v
        pending.clear()

    # -- finish: validation, the last push, RUN_JSON ------------------------------------------------------
    def finish(self, start: int, resumed_from: int | None) -> Exit:
        plan, final_step = self.plan, self.plan.stop_step
        # Each figure's worst rank: under DDP a collection on any rank stops them all.
        mine = self.gc_full.summary()
        gc_worst = dict(zip(mine, self.dist.max_over_ranks(list(mine.values()))))
        gc_worst["gc_full_collections"] = int(gc_worst["gc_full_collections"])
        if final_step > start:
            self.log(
                f"gc: {gc_worst['gc_full_collections']} full collections after the freeze, longest "
                f"{gc_worst['gc_full_s_max']:.3f}s, total {gc_worst['gc_full_s_total']:.3f}s (worst rank)"
            )
        val: dict[str, Any] = {
            "val_loss": None,
            "val_ppl": None,
            "val_error": None,
            "val_skipped": True,
            "val_tokens": 0,
        }
        if plan.horizon_leg:
            val = self.validate()  # overlaps the final push running in the background
            self.saves.wait()
            self.log(
                f"TRAIN DONE step={final_step} tokens={final_step * plan.tokens_per_step} "
                f"seconds={time.time() - self.t_start:.1f}"
            )
        else:
            self.saves.wait()
            self.log(
                f"segment boundary at step {final_step} (--stop-after-steps {self.args.stop_after_steps}): stopping"
            )
            self.log("validation skipped (segment leg)")
        peaks = self.peak_stats()
        batches = combine_digests(self.dist.gather(self.batch_digests))  # one gather for the whole session
        if self.dist.master:
            report = self.run_report(start, resumed_from, val, peaks, gc_worst, batches)
            emit("RUN_JSON " + json.dumps(report, allow_nan=False))
        return Exit.DONE

    def run_report(
        self, start: int, resumed_from: int | None, val: dict, peaks: dict, gc: dict, batches: dict[str, str]
    ) -> dict:
        """The RUN_JSON document (docs/DESIGN.md lists its keys). Strict JSON: a diverged (non-finite) loss
        becomes null and is counted, never `NaN`."""
        args, plan, final_step = self.args, self.plan, self.plan.stop_step
        losses = {k: (v if math.isfinite(v) else None) for k, v in self.losses.items()}
        return {
            "final_step": final_step,
            "segment_stop": not plan.horizon_leg,
            "resumed_from_step": resumed_from,
            "first_step": start + 1 if final_step > start else None,
            "tokens_consumed": final_step * plan.tokens_per_step,
            "tok_per_s": session_tok_per_s(self.step_seconds, plan.tokens_per_step),
            "params": self.params,
            "grad_ckpt": plan.grad_ckpt,
            "precision": self.rt.precision.name,
            "compile": self.rt.compile_mode,
            "cuda_graphs": self.rt.cuda_graphs,
            "model_options": self.rt.options.as_dict(),
            "world_size": self.dist.world_size,
            "final_loss": losses.get(str(final_step)),
            "losses": losses,
            "lrs": self.lrs,
            "batches": batches,
            **val,
            **peaks,
            "model": args.model,
            "attn": args.attn,
            "seq_len": args.seq_len,
            "micro_batch": args.micro_batch,
            "accum": args.accum,
            "tokens_per_step": plan.tokens_per_step,
            "total_steps": plan.total_steps,
            "push_steps": self.saves.push_steps,
            "hub_repo": self.hub_url,
            "ckpt_pause_s_max": round(self.snapshots.pause_max_s, 4),
            "ckpt_wait_s_max": round(self.saves.wait_s_max, 4),
            **gc,
            **self.timer.summary(plan.tokens_per_step),
            "seconds": round(time.time() - self.t_start, 1),
            "nonfinite_losses": sum(v is None for v in losses.values()),
            "config_changes": self.config_changes,
            "mix_sha256": self.mix.sha256,  # the mix in the run's identity (its config_hash covers it)
        }

    def validate(self) -> dict[str, Any]:
        out = {"val_loss": None, "val_ppl": None, "val_error": None, "val_skipped": False, "val_tokens": 0}
        if self.args.val_tokens == 0:
            self.log("validation skipped (--val-tokens 0)")
            return {**out, "val_skipped": True}
        self.log(f"validation start tokens={self.args.val_tokens}")  # a watcher's cue: this takes a while
        # No collective inside the try: a rank that fails must still reach the reduction below.
        total = torch.zeros(2, dtype=torch.float64, device=self.dist.device)
        err = None
        try:
            self.raw_model.eval()
            with torch.no_grad():
                for x, y in val_batches(
                    self.mix,
                    tokens=self.args.val_tokens,
                    batch=self.args.micro_batch,
                    rank=self.dist.rank,
                    world_size=self.dist.world_size,
                ):
                    x, y = x.to(self.dist.device), y.to(self.dist.device)
                    if self.rt.cuda_graphs:
                        torch.compiler.cudagraph_mark_step_begin()
                    with self.autocast():
                        _, loss = self.raw_model(x, y)
                    total[0] += loss.double() * y.numel()
                    total[1] += y.numel()
        except Exception as e:  # reported in RUN_JSON instead of crashing the leg
            err = f"rank {self.dist.rank}: {type(e).__name__}: {e}"
        finally:
            self.raw_model.train()
        err = self.dist.agree(err)
        self.dist.sum_(total)
        out["val_tokens"] = tokens = int(total[1].item())  # the target tokens averaged over, all ranks'
        vloss = (total[0] / total[1]).item() if tokens else math.nan
        if not err and tokens == 0:
            err = "validation produced no tokens"
        elif not err and not math.isfinite(vloss):
            err = f"validation loss is {vloss} (the model diverged)"  # RUN_JSON has no NaN to write
        if err:
            self.log(f"validation failed: {err}")
            return {**out, "val_error": err}
        # A loss past ~709 overflows the perplexity: null, as RUN_JSON writes every non-finite number.
        ppl = math.exp(vloss) if vloss < 700 else None
        shown = "null" if ppl is None else f"{ppl:.2f}"
        self.log(f"validation loss {vloss:.4f} ppl {shown} tokens {tokens}")
        return {**out, "val_loss": vloss, "val_ppl": ppl}

    def peak_stats(self) -> dict[str, Any]:
        if self.rt.device_type != "cuda":
            self.log(
                "peak_stats: alloc_gb=null reserved_gb=null alloc_gb_max_rank=null "
                "reserved_gb_max_rank=null (cpu: no device memory stats)"
            )
            return {
                "peak_gpu_gb": None,
                "peak_gpu_gb_max_rank": None,
                "peak_reserved_gb_max_rank": None,
                "peak_reserved_gb_by_rank": None,
                "peak_note": "cpu: no device memory stats",
            }
        gib, dev = 2**30, self.dist.device
        mine = [torch.cuda.max_memory_allocated(dev) / gib, torch.cuda.max_memory_reserved(dev) / gib]
        a, r, am, rm = (round(v, 3) for v in (*mine, *self.dist.max_over_ranks(mine)))
        # Each rank's own peak (index = rank): one rank far above the others is what the plots show.
        by_rank = self.dist.gather(round(mine[1], 3))
        self.log(f"peak_stats: alloc_gb={a} reserved_gb={r} alloc_gb_max_rank={am} reserved_gb_max_rank={rm}")
        return {
            "peak_gpu_gb": a,
            "peak_gpu_gb_max_rank": am,
            "peak_reserved_gb_max_rank": rm,
            "peak_reserved_gb_by_rank": by_rank,
        }


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Destroying DDP's reducer and the gloo process group at interpreter exit deadlocked a finished rank
    # after its RUN_JSON (gloo's worker thread needs the GIL the destructor holds). The session is over:
    # leave without running destructors.
    os._exit(exit_code)
