"""Trainer speed and memory, side by side with transformers' LlamaForCausalLM, in one process.

    python bench/train_bench.py --device cuda                       # the default table (see DEFAULT_CONFIGS)
    python bench/train_bench.py --device cpu --model tiny --seq-len 64 --steps 3   # a smoke test anywhere
    python bench/train_bench.py --config impl=ours,micro=32,compile=regional --config impl=hf,micro=32,compile=full
    torchrun --nproc_per_node=2 bench/train_bench.py --config impl=ours,micro=32,accum=4,compile=regional
    python bench/train_bench.py --table rows.jsonl ...                # the table of saved --jsonl rows

Each --config is a comma-separated list of key=value (defaults in CONFIG_DEFAULTS):
  impl     ours (trainer/model/model.py) | hf (transformers LlamaForCausalLM built from the same config.json)
  task     speed (throughput + memory) | check (fast vs plain path losses over `steps`) | drift (tok/s and
           reserved memory per window, windows at `windows`, e.g. 20/180/1000) | graphs (the compiled path
           with and without CUDA graphs, accum micro-steps a step: every parameter's gradient compared after
           each of the first `gsteps` steps, and the losses over `steps`)
  micro, accum, prec (bf16|fp16|fp32), attn (sdpa|eager), compile (none | regional = ours:
      trainer.model.compile.compile_blocks(), hf: each decoder layer | full = ours: trainer.model.compile.compile_model()
      (in place, the coordinate-descent tuning only with ctune=1), hf: torch.compile(model)),
  ce (ours: fused = LinearCrossEntropy with the Triton softmax pass | fused_eager = same, eager softmax
      (ModelOptions.fused_ce off) | ckpt = a checkpointed F.cross_entropy per 1024-row chunk | plain = full
      logits),
  The model options of trainer/model/options.py, one key each (the trainer reads them from SPECPROBE_* variables):
  gqa (sdpa_gqa: auto = on for cuda capability >= 8.0 | 1 = sdpa enable_gqa=True, no K/V expansion | 0 =
       K/V expanded), ce_rows (loss_chunk_rows: rows of logits per loss chunk; 0 = n/8 clamped to [512, 4096]),
  res (bf16_residual: 1 = residual stream in bf16 under bf16 autocast; 0 = fp32),
  wacc (addmm_fp32: 1 = the loss's weight gradient accumulated by addmm into fp32 on CUDA; 0 = a bf16
        product, then a separate fp32 add),
  lean (lean_activations, compiled: 1 = the partitioner recomputes pointwise inputs of backward matmuls
        (weight casts, norm outputs, silu*up) instead of saving them; 0 = torch's default, the trainer's),
  pbwd (fp32_wgrad: fp32 = the projections' weight gradients straight out of their GEMMs in fp32, the
        trainer's default | autograd = nn.Linear's backward (bf16 product, cast)),
  combo (combo_kernels, compile=full: 1 = Inductor's combo kernels; 0 = off, the trainer's default),
  and:
  cmode (torch.compile mode for compile=regional|full: default | max-autotune-no-cudagraphs |
         reduce-overhead (CUDA graphs) | max-autotune),
  sdpa (cuda only: auto = torch's choice | flash | efficient | cudnn | math: only that backend enabled),
  ctune (1 = Inductor's coordinate_descent_tuning: each Triton kernel's launch config tuned by timing),
  ind (Inductor flags, name:value joined by '+', e.g. ind=combo_kernels:True+triton.unique_kernel_names:1;
       name?:value sets it only where this torch has it, and says so when it does not),
  prof (speed: 1 = also profile 3 steps: device time, launches a step, time per kernel family, and the
        PROF_TOP kernels with the most device time),
  noise (check: 1 = also run plain_split, the plain path with each micro-batch run as two accumulated
         halves (same maths, other GEMM shapes and reduction order; micro must be even), and plain in fp32
         without TF32, and compare every pair: the bf16 noise floor),
  zero (how gradients are cleared after a step: auto = as trainer/train.py, in place (kept allocated
        from the start, trainer.model.compile.keep_grads_allocated) on several ranks or under CUDA graphs, set to None
        otherwise | inplace | none: set to None, which under CUDA graphs with accum > 1 is cudagraph trees'
        known silent error, pytorch/pytorch#169545, the one task=graphs must catch),
  gsteps (graphs: optimizer steps whose full gradients are compared),
  ddp (2 ranks: 0 = the trainer's trainer.dist.GradientSync, the gradients accumulated locally and
       all-reduced once after the last micro-step; 1 = torch's DistributedDataParallel with no_sync on every
       micro-step but the last, the trainer's way before, kept to measure the two side by side),
  bcast (ddp=1: 1 = DDP's default broadcast_buffers=True, a broadcast of the RoPE tables from rank 0 at
         every forward, i.e. a collective that lines the ranks up at every micro-step; 0 = off),
  ddpopt (ddp=1, compiled: 1 = Dynamo's DDPOptimizer, torch's default: the graph split at DDP's buckets
          so they reduce during the backward; 0 = torch._dynamo.config.optimize_ddp off, one graph),
  gcfreeze (speed, drift: 1 = after the warm-up steps, one full garbage collection and gc.freeze(), as
            the trainer's freeze_heap() (trainer/heap.py) after its first step; 0 = Python's collector left
            alone: its first full collection after a compile can land in the timed steps; speed rows count
            and time the full collections of their timed steps either way:
            gc_full_collections, gc_full_s_max),
  steps (timed optimizer steps), warmup (untimed steps first: compile and allocator warm-up), stall (1:
  also time the checkpoint snapshot the trainer does on its training thread, and a pinned async one)

Every optimizer step is the trainer's: `accum` micro-steps of autocast forward + (scaled) backward, grad
clipping at 1.0, fused AdamW (betas 0.9/0.95, wd 0.1 on matrices), zero_grad (see `zero`). Inputs are
random tokens already on the device, rotated over 4 batches. Timing: synchronize, wall clock over the
timed steps, synchronize; tok/s counts every rank's tokens. MFU uses this convention:
  FLOP/token = 6 * params + 12 * n_layer * d_model * seq_len, against --peak-tflops (790 by default, an
  H200's bf16 dense figure; the script also measures an 8192^3 bf16 matmul on the card and prints it).
Memory: torch.cuda.max_memory_allocated / max_memory_reserved per rank over the whole config (warm-up
included), in GiB (2^30 bytes, as trainer/train.py's peak_stats). Rows go to --jsonl as they finish, so a
timeout loses only the row in progress.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import json
import math
import os
import re
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from trainer.ckpt.snapshot import to_host  # noqa: E402
from trainer.dist import GradientSync  # noqa: E402
from trainer.heap import FullCollections, freeze_heap  # noqa: E402
from trainer.model.compile import compile_blocks, compile_model, keep_grads_allocated  # noqa: E402
from trainer.model.hf import to_hf_config  # noqa: E402
from trainer.model.kernels import addmm_fp32_status, ce_sum  # noqa: E402
from trainer.model.model import GEOMETRIES, Llama, count_params  # noqa: E402
from trainer.model.options import ModelOptions  # noqa: E402

GIB = 2**30
PROF_TOP = 40
# Kernel families of a profile, by name (cuBLAS/nvjet GEMMs, cuDNN/flash attention, Inductor's Triton
# kernels, ATen's elementwise/reduction kernels, the fused optimizer).
PROF_FAMILIES = [
    ("gemm", r"nvjet|gemm|cutlass|sm90_xmma|ampere_"),
    ("attention", r"sdpa|flash|fmha|cudnn"),
    ("triton", r"^triton_"),
    ("aten_elementwise", r"elementwise|vectorized|reduce_kernel"),
    ("optimizer", r"multi_tensor|fused_adam|FusedAdam"),
]
CONFIG_DEFAULTS: dict[str, Any] = {
    "impl": "ours",
    "task": "speed",
    "micro": 4,
    "accum": 1,
    "prec": "bf16",
    "attn": "sdpa",
    "compile": "none",
    "steps": 30,
    "warmup": 8,
    "stall": 0,
    "windows": "20/180/1000",
    "lr": 6e-4,
    "ce": "fused",
    "gqa": "auto",
    "ce_rows": 0,
    "cmode": "default",
    "sdpa": "auto",
    "prof": 0,
    "noise": 0,
    "res": 1,
    "wacc": 1,
    "ctune": 0,
    "lean": 0,
    "pbwd": "fp32",
    "combo": 0,
    "ind": "",
    "zero": "auto",
    "gsteps": 3,
    "ddp": 0,
    "bcast": 0,
    "ddpopt": 1,
    "gcfreeze": 1,
}
DEFAULT_CONFIGS = [
    "impl=ours,micro=32,compile=regional,steps=40,warmup=10",
    "impl=hf,micro=32,compile=full,steps=40,warmup=10",
    "impl=ours,micro=4,compile=regional,steps=60,warmup=10",
    "impl=hf,micro=4,compile=full,steps=60,warmup=10",
]


def parse_config(text: str) -> dict[str, Any]:
    cfg = dict(CONFIG_DEFAULTS)
    for item in filter(None, text.split(",")):
        key, _, val = item.partition("=")
        if key not in CONFIG_DEFAULTS:
            raise SystemExit(f"--config {text!r}: unknown key {key!r} (known: {', '.join(CONFIG_DEFAULTS)})")
        cfg[key] = type(CONFIG_DEFAULTS[key])(val) if not isinstance(CONFIG_DEFAULTS[key], str) else val
    return cfg


def settle_heap(cfg: dict[str, Any]) -> None:
    """Between the warm-up and the timed steps: the trainer's freeze_heap() unless gcfreeze=0."""
    if cfg["gcfreeze"]:
        freeze_heap()


def label(cfg: dict[str, Any]) -> str:
    extra = ""
    if cfg["impl"] == "ours" and cfg["ce"] != "fused":
        extra = f" ce={cfg['ce']}"
    for key in (
        "gqa",
        "ce_rows",
        "cmode",
        "sdpa",
        "prof",
        "noise",
        "res",
        "wacc",
        "ctune",
        "lean",
        "ind",
        "pbwd",
        "combo",
        "zero",
        "gsteps",
        "ddp",
        "bcast",
        "ddpopt",
        "gcfreeze",
    ):
        if cfg.get(key, CONFIG_DEFAULTS[key]) != CONFIG_DEFAULTS[key]:
            extra += f" {key}={cfg[key]}"
    return (
        f"{cfg['impl']} {cfg['task']} m{cfg['micro']}x{cfg['accum']} {cfg['prec']} {cfg['attn']} "
        f"compile={cfg['compile']}{extra}"
    )


# ------------------------------------------------------------------------------------------ models


def build_model(cfg: dict[str, Any], model_name: str, device: torch.device) -> tuple[torch.nn.Module, Any]:
    """(the module whose parameters the optimizer owns, loss_fn(x, y) -> scalar loss)."""
    mcfg = GEOMETRIES[model_name]
    torch.manual_seed(1234)
    set_sdpa_backend(cfg["sdpa"], device)
    ckw = {} if cfg["cmode"] == "default" else {"mode": cfg["cmode"]}
    from torch._inductor import config as inductor_config

    inductor_config.coordinate_descent_tuning = bool(cfg["ctune"])
    inductor_config.combo_kernels = False  # compile_model (combo=1) or ind= may turn it on
    set_inductor_flags(cfg["ind"])
    if cfg["impl"] == "ours":
        opts = model_options(cfg)
        from torch._functorch import config as partitioner

        partitioner.ban_recompute_materialized_backward = True  # torch's default; lean=1 lifts it
        raw = Llama(mcfg, attn=cfg["attn"], options=opts).to(device)
        if cfg["compile"] == "regional":
            compile_blocks(raw, opts, **ckw)
        if cfg["compile"] == "full":  # in place, as trainer/train.py does: DDP(raw) then runs it compiled
            compile_model(raw, opts, tune=bool(cfg["ctune"]), **ckw)
        model = raw
        if cfg["ce"] in ("fused", "fused_eager"):
            return raw, lambda x, y: model(x, y)[1]
        if cfg["ce"] == "ckpt":
            from torch.utils.checkpoint import checkpoint

            def ckpt_loss(x, y):
                h, yy = raw.hidden(x).flatten(0, 1), y.flatten()
                total = h.new_zeros((), dtype=torch.float32)
                for i in range(0, h.shape[0], 1024):
                    total = total + checkpoint(
                        ce_sum, h[i : i + 1024], raw.embed_tokens.weight, yy[i : i + 1024], use_reentrant=False
                    )
                return total / yy.numel()

            return raw, ckpt_loss
        if cfg["ce"] == "plain":
            return raw, lambda x, y: F.cross_entropy(
                F.linear(raw.hidden(x), raw.embed_tokens.weight).float().flatten(0, 1), y.flatten()
            )
        raise SystemExit(f"unknown ce {cfg['ce']!r}")
    if cfg["impl"] == "hf":
        import transformers

        hf_cfg = transformers.LlamaConfig(
            **{k: v for k, v in to_hf_config(mcfg).items() if k not in ("architectures", "torch_dtype")}
        )
        hf_cfg.use_cache = False
        # fp32 master weights like ours; autocast does the bf16/fp16 casts for both.
        raw = transformers.LlamaForCausalLM._from_config(hf_cfg, attn_implementation=cfg["attn"]).to(device)
        if cfg["compile"] == "regional":
            for layer in raw.model.layers:
                layer.compile(**ckw)
        model = torch.compile(raw, **ckw) if cfg["compile"] == "full" else raw
        # HF shifts labels by one inside; with random tokens that changes nothing measured.
        return raw, lambda x, y: model(input_ids=x, labels=x).loss
    raise SystemExit(f"unknown impl {cfg['impl']!r}")


def wrap_ddp(model: Any, *, device_type: str, local_rank: int, sync_buffers: bool = False) -> Any:
    """torch's DistributedDataParallel as the trainer ran it before GradientSync (row key ddp=1):
    gradient_as_bucket_view, and buffers not re-broadcast at every forward unless `sync_buffers` (torch >=
    2.13 names that `forward_sync_buffers`, `broadcast_buffers` before)."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    name = (
        "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else "broadcast_buffers"
    )
    return DDP(
        model,
        device_ids=[local_rank] if device_type == "cuda" else None,
        gradient_as_bucket_view=True,
        **{name: sync_buffers},
    )


def model_options(cfg: dict[str, Any]) -> ModelOptions:
    """The row's ModelOptions, from its option keys (the module docstring lists them)."""
    if cfg["pbwd"] not in ("fp32", "autograd"):
        raise SystemExit(f"unknown pbwd {cfg['pbwd']!r} (fp32 | autograd)")
    if cfg["gqa"] not in ("auto", "1", "0"):
        raise SystemExit(f"unknown gqa {cfg['gqa']!r} (auto | 1 | 0)")
    return ModelOptions(
        bf16_residual=bool(cfg["res"]),
        fp32_wgrad=cfg["pbwd"] == "fp32",
        addmm_fp32=bool(cfg["wacc"]),
        sdpa_gqa={"auto": None, "1": True, "0": False}[cfg["gqa"]],
        loss_chunk_rows=int(cfg["ce_rows"]),
        fused_ce=cfg["ce"] != "fused_eager",
        lean_activations=bool(cfg["lean"]),
        combo_kernels=bool(cfg["combo"]),
    )


def set_inductor_flags(text: str) -> None:
    """ind=name:value+name:value: set torch._inductor.config attributes (dotted names reach sub-configs),
    values parsed as int, float or True/False, else kept as text. An unknown name is an error, unless it ends
    in '?' (name?:value: set where this torch has it)."""
    from torch._inductor import config as inductor_config

    for item in filter(None, text.split("+")):
        name, _, raw = item.partition(":")
        optional = name.endswith("?")
        name = name.rstrip("?")
        *path, attr = name.split(".")
        obj = inductor_config
        for part in path:
            obj = getattr(obj, part)
        if not hasattr(obj, attr):
            if optional:  # a knob newer than this torch: the row still runs, and its log says so
                print(f"ind: torch._inductor.config has no {name!r} (torch {torch.__version__}); not set", flush=True)
                continue
            raise SystemExit(f"ind: torch._inductor.config has no {name!r}")
        val: Any = {"True": True, "False": False}.get(raw, raw)
        for conv in (int, float):
            if isinstance(val, str):
                with contextlib.suppress(ValueError):
                    val = conv(val)
        setattr(obj, attr, val)


_SDPA_FLAGS = ("flash", "mem_efficient", "math", "cudnn")


def set_sdpa_backend(which: str, device: torch.device) -> None:
    """Enable every sdpa backend (auto) or only one. Global flags, read when sdpa dispatches (and when
    dynamo traces it), so they are set before the model is built and compiled; cuda only."""
    if which not in ("auto", "flash", "efficient", "cudnn", "math"):
        raise SystemExit(f"unknown sdpa backend {which!r}")
    if device.type != "cuda":
        return
    want = {"efficient": "mem_efficient"}.get(which, which)
    for name in _SDPA_FLAGS:
        fn = getattr(torch.backends.cuda, f"enable_{name}_sdp", None)
        if fn is not None:
            fn(which == "auto" or name == want)


def make_optimizer(raw: torch.nn.Module, device: torch.device, lr: float) -> torch.optim.Optimizer:
    # The trainer's optimizer (trainer/train.py): decay matrices only, fused kernels on cuda.
    params = [p for p in raw.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def learnable_batches(n: int, micro: int, seq: int, vocab: int, device: torch.device, seed: int):
    """Sequences of an affine recurrence t -> (a*t + b) mod V with 10 % noise: a loss that falls fast."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.empty(micro, seq + 1, dtype=torch.long)
        x[:, 0] = torch.randint(0, vocab, (micro,), generator=g)
        for t in range(1, seq + 1):
            x[:, t] = (x[:, t - 1] * 7 + 13) % vocab
        noise = torch.rand(micro, seq + 1, generator=g) < 0.1
        x[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=g)
        out.append((x[:, :-1].contiguous().to(device), x[:, 1:].contiguous().to(device)))
    return out


# --------------------------------------------------------------------------------------- the runner


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.ddp = int(os.environ.get("RANK", -1)) != -1
        if self.ddp:
            import torch.distributed as dist

            self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            local = int(os.environ["LOCAL_RANK"])
            if args.device == "cuda":
                torch.cuda.set_device(local)
            self.device = torch.device("cuda", local) if args.device == "cuda" else torch.device("cpu")
            dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        else:
            self.rank, self.world = 0, 1
            self.device = torch.device(args.device)
        mcfg = GEOMETRIES[args.model]
        with torch.device("meta"):
            self.n_params = count_params(Llama(mcfg))
        self.flop_per_token = 6 * self.n_params + 12 * mcfg.n_layer * mcfg.d_model * args.seq_len
        self.vocab = mcfg.vocab_size

    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)

    def reduce_max(self, vals: list[float]) -> list[float]:
        if not self.ddp:
            return vals
        import torch.distributed as dist

        t = torch.tensor(vals, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def fresh(self) -> None:
        gc.unfreeze()  # the last row's frozen objects (its compiled graphs) become collectable again
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        from torch import _dynamo  # `import torch._dynamo` here would make `torch` a local name of fresh()

        _dynamo.reset()

    def zero_in_place(self, cfg: dict[str, Any]) -> bool:
        """Whether this row clears gradients in place (keeping them allocated) instead of setting them to None."""
        if cfg["zero"] not in ("auto", "inplace", "none"):
            raise SystemExit(f"unknown zero {cfg['zero']!r} (auto | inplace | none)")
        if cfg["zero"] == "auto":  # trainer/train.py's rule
            return self.ddp or cfg["cmode"] == "reduce-overhead"
        return cfg["zero"] == "inplace"

    def setup(self, cfg: dict[str, Any]):
        import torch._dynamo.config as dynamo_config

        dynamo_config.optimize_ddp = bool(cfg["ddpopt"])  # read when a frame compiles inside DDP's forward
        raw, loss_fn = build_model(cfg, self.args.model, self.device)
        model, self.sync = raw, None
        if self.ddp and not cfg["ddp"]:  # as trainer/train.py: one all-reduce a step, grads in one buffer
            if not self.zero_in_place(cfg):
                raise SystemExit("zero=none would replace GradientSync's gradient views: use zero=inplace or ddp=1")
            self.sync = GradientSync([p for p in raw.parameters() if p.requires_grad], self.world)
        elif self.zero_in_place(cfg):
            keep_grads_allocated(raw)  # before DDP, which makes them its bucket views
        if self.ddp and cfg["ddp"]:
            model = wrap_ddp(
                raw, device_type=self.device.type, local_rank=self.device.index or 0, sync_buffers=bool(cfg["bcast"])
            )
            if cfg["impl"] == "ours":
                loss_fn = lambda x, y: model(x, y)[1]  # noqa: E731 - the DDP wrapper must run the forward
            else:
                loss_fn = lambda x, y: model(input_ids=x, labels=x).loss  # noqa: E731
        opt = make_optimizer(raw, self.device, cfg["lr"])
        scaler = torch.amp.GradScaler(self.device.type, enabled=cfg["prec"] == "fp16")
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[cfg["prec"]]
        autocast = lambda: torch.autocast(self.device.type, dtype=dtype, enabled=cfg["prec"] != "fp32")  # noqa: E731
        return raw, model, loss_fn, opt, scaler, autocast

    def make_step(self, cfg, raw, model, loss_fn, opt, scaler, autocast, batches, before_opt=None):
        accum = cfg["accum"]
        counter = [0]
        graphs, in_place = cfg["cmode"] == "reduce-overhead", self.zero_in_place(cfg)

        def step() -> torch.Tensor:
            total = torch.zeros((), device=self.device)
            for a in range(accum):
                if graphs:  # as trainer/train.py: each micro-step is a new replay
                    torch.compiler.cudagraph_mark_step_begin()
                x, y = batches[counter[0] % len(batches)]
                counter[0] += 1
                last = a == accum - 1
                ctx = model.no_sync() if (self.ddp and cfg["ddp"] and not last) else contextlib.nullcontext()
                with ctx:
                    with autocast():
                        loss = loss_fn(x, y) / accum
                    scaler.scale(loss).backward()
                total += loss.detach().float()
            if self.sync is not None:
                self.sync.all_reduce()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
            if before_opt is not None:
                before_opt()
            scaler.step(opt)
            scaler.update()
            # As trainer/train.py: on several ranks the grads are views of one buffer (GradientSync's or
            # DDP's buckets), zeroed in place; under CUDA graphs they stay allocated so that accumulation
            # adds into them (see `zero`).
            opt.zero_grad(set_to_none=not in_place)
            return total

        return step

    def random_batches(self, micro: int, seed: int, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """n (inputs, targets) pairs of uniform random tokens, already on the device (no loader in the timing)."""
        g = torch.Generator().manual_seed(seed)
        shape = (micro, self.args.seq_len)
        return [
            (
                torch.randint(0, self.vocab, shape, generator=g).to(self.device),
                torch.randint(0, self.vocab, shape, generator=g).to(self.device),
            )
            for _ in range(n)
        ]

    # -- tasks --------------------------------------------------------------------------------------
    def speed(self, cfg: dict[str, Any]) -> dict[str, Any]:
        raw, model, loss_fn, opt, scaler, autocast = self.setup(cfg)
        batches = self.random_batches(cfg["micro"], seed=99 + self.rank)
        hook: dict[str, Any] = {}
        step = self.make_step(
            cfg,
            raw,
            model,
            loss_fn,
            opt,
            scaler,
            autocast,
            batches,
            before_opt=lambda: hook["fn"]() if "fn" in hook else None,
        )
        t0 = time.time()
        for _ in range(cfg["warmup"]):
            step()
        sync(self.device)
        warm_s = time.time() - t0
        settle_heap(cfg)
        scales = []
        cuda = self.device.type == "cuda"
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(cfg["steps"] + 1)] if cuda else []
        gc_full = FullCollections()
        gc_full.start()
        t0 = time.time()
        losses = []
        for i in range(cfg["steps"]):
            if cuda:
                marks[i].record()
            losses.append(step())
            if scaler.is_enabled():
                scales.append(scaler._scale.detach().clone())  # no sync: compared once at the end
        if cuda:
            marks[-1].record()
        sync(self.device)
        dt = time.time() - t0
        gc_full.stop()
        tokens = cfg["steps"] * cfg["accum"] * cfg["micro"] * self.args.seq_len * self.world
        row = self.row(cfg, tok_s=tokens / dt, step_s=dt / cfg["steps"], warm_s=warm_s)
        row.update(gc_full.summary())
        if cuda:
            # Device time per step (event to event): its spread tells a uniformly slow row (clock, kernel
            # choice) from one with a few stalled steps; tok_s_median is the row's figure without outliers.
            ms = sorted(a.elapsed_time(b) for a, b in zip(marks, marks[1:]))
            q = lambda f: ms[min(len(ms) - 1, int(f * len(ms)))]  # noqa: E731
            row.update(
                step_ms_min=round(ms[0], 2),
                step_ms_p50=round(q(0.5), 2),
                step_ms_p90=round(q(0.9), 2),
                step_ms_max=round(ms[-1], 2),
                tok_s_median=round(tokens / cfg["steps"] / (q(0.5) / 1000), 1),
            )
        row["addmm_fp32"] = addmm_fp32_status()
        row["final_loss"] = float(losses[-1])
        row["loss_finite"] = bool(all(math.isfinite(float(v)) for v in losses))
        if scales:
            s = [float(v) for v in scales]
            row["scaler_overflow_steps"] = sum(1 for a, b in zip(s, s[1:]) if b < a)  # scale halves on a skip
            row["scaler_final_scale"] = s[-1]
        if cfg["prof"]:
            row["prof_top"] = self.profile(step, n=3)
        if cfg["stall"]:
            row.update(self.stall(cfg, raw, opt, step, hook, row["step_s"]))
        del raw, model, opt, batches
        return row

    def profile(self, step, n: int) -> list[list[Any]]:
        """[kernel/op name, ms per step, % of the profiled device time] for the PROF_TOP heaviest over n
        steps, after the total, the launches per step and the time per PROF_FAMILIES family."""
        from torch.profiler import ProfilerActivity, profile

        cuda = self.device.type == "cuda"
        acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
        sync(self.device)
        with profile(activities=acts) as prof:
            for _ in range(n):
                step()
            sync(self.device)
        ev = prof.key_averages()

        def self_t(e):  # microseconds of device (or, on cpu, host) self time
            for name in ("self_device_time_total", "self_cuda_time_total") if cuda else ("self_cpu_time_total",):
                if hasattr(e, name):
                    return float(getattr(e, name))
            return 0.0

        rows = sorted(((e.key, self_t(e), e.count) for e in ev), key=lambda r: -r[1])
        total = sum(t for _, t, _ in rows) or 1.0
        out = [["TOTAL", round(total / 1000 / n, 3), 100.0]]
        # Launches a step and device time by family: what fewer kernels (CUDA graphs, fusion) can still buy.
        out.append(["LAUNCHES", round(sum(c for _, t, c in rows if t > 0) / n, 1), None])
        for fam, pat in PROF_FAMILIES:
            t = sum(t for k, t, _ in rows if re.search(pat, k))
            out.append([f"FAMILY {fam}", round(t / 1000 / n, 3), round(100 * t / total, 1)])
        out += [[k[:90], round(t / 1000 / n, 3), round(100 * t / total, 1)] for k, t, _ in rows[:PROF_TOP]]
        return out

    def row(self, cfg, **kw) -> dict[str, Any]:
        alloc = reserved = None
        if self.device.type == "cuda":
            alloc, reserved = self.reduce_max(
                [torch.cuda.max_memory_allocated(self.device) / GIB, torch.cuda.max_memory_reserved(self.device) / GIB]
            )
        tok_s = kw.get("tok_s")
        per_gpu = tok_s / self.world if tok_s else None
        return {
            "config": label(cfg),
            **cfg,
            "world": self.world,
            "seq_len": self.args.seq_len,
            "card": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "tok_s": round(tok_s, 1) if tok_s else None,
            "mfu_pct": round(100 * per_gpu * self.flop_per_token / (self.args.peak_tflops * 1e12), 2)
            if per_gpu
            else None,
            "peak_alloc_gib": round(alloc, 3) if alloc is not None else None,
            "peak_reserved_gib": round(reserved, 3) if reserved is not None else None,
            **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in kw.items() if k != "tok_s"},
        }

    def stall(self, cfg, raw, opt, step, hook, step_s: float) -> dict[str, Any]:
        """Training-thread pause of one checkpoint snapshot, measured as (snapshot + step) - step.

        sync: what the trainer's blocking snapshot does (trainer/ckpt/snapshot.py): load_state_dict into a
              host-memory shadow model plus to_host(optimizer.state_dict()), both blocking copies to
              pageable memory.
        async: copy every parameter and optimizer state into preallocated pinned host buffers on a side
              stream that first waits for the current stream; the training thread only enqueues, and the
              next optimizer step waits (on the device, not the host) for the copies to finish, since it
              overwrites what they read.
        """
        out: dict[str, Any] = {}
        if self.world != 1:  # the extra steps below would leave the other ranks waiting in a collective
            return out
        shadow = Llama(GEOMETRIES[self.args.model], attn=cfg["attn"])

        def snap_sync():
            shadow.load_state_dict(raw.state_dict())
            to_host(opt.state_dict())

        tensors = [p for p in raw.parameters()] + [
            t for st in opt.state.values() for t in st.values() if torch.is_tensor(t) and t.device.type != "cpu"
        ]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if self.device.type == "cuda":
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
            side = torch.cuda.Stream(self.device)

            def snap_async():
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    for h, t in zip(host, tensors):
                        h.copy_(t, non_blocking=True)
                ev = side.record_event()
                hook["fn"] = lambda: (torch.cuda.current_stream(self.device).wait_event(ev), hook.pop("fn"))
        else:
            snap_async = None
        for name, fn in (("sync", snap_sync), ("async", snap_async)):
            if fn is None:
                continue
            pauses = []
            for _ in range(3):
                sync(self.device)
                t0 = time.time()
                step()
                sync(self.device)
                base = time.time() - t0
                t0 = time.time()
                fn()
                step()
                sync(self.device)
                pauses.append(max(time.time() - t0 - base, 0.0))
            p = statistics.median(pauses)
            out[f"stall_{name}_s"] = round(p, 4)
            out[f"stall_{name}_pct_of_step"] = round(100 * p / step_s, 2)
        out["snapshot_bytes"] = nbytes
        return out

    def check(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """Losses of the fast path (compile + fused chunked CE) vs the plain path (no compile, one full
        logits tensor and F.cross_entropy) from the same init on the same learnable batches."""
        curves = {}
        batches = learnable_batches(8, cfg["micro"], self.args.seq_len, self.vocab, self.device, seed=5)
        paths = ("plain", "fast") + (("plain_split", "plain_fp32") if cfg["noise"] else ())
        if cfg["noise"] and cfg["micro"] % 2:
            raise SystemExit(f"noise=1 splits each micro-batch in two halves: give an even micro, not {cfg['micro']}")
        tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        for path in paths:
            self.fresh()
            t0 = time.perf_counter()
            c = dict(cfg, impl="ours", compile=cfg["compile"] if path == "fast" else "none")
            path_batches = batches
            if path == "plain_split":  # the same maths, half the rows a GEMM: each micro-batch as two halves
                c["accum"] = 2 * cfg["accum"]
                half = cfg["micro"] // 2
                path_batches = [(x[i : i + half], y[i : i + half]) for x, y in batches for i in (0, half)]
            if path.startswith("plain"):  # the textbook model: fp32 residual stream as HF's autocast path,
                c["res"], c["pbwd"] = 0, "autograd"  # nn.Linear's own backward
            if path == "plain_fp32":  # fp32 everywhere, TF32 off: the reference the bf16 paths round away from
                c["prec"] = "fp32"
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
            raw, model, loss_fn, opt, scaler, autocast = self.setup(c)
            if path.startswith("plain"):

                def loss_fn(x, y, raw=raw):  # the textbook loss
                    h = raw.hidden(x)
                    logits = F.linear(h, raw.embed_tokens.weight).float()
                    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

            step = self.make_step(c, raw, model, loss_fn, opt, scaler, autocast, path_batches)
            # Progress on the log as it happens: a check killed by its budget still says how far it got
            # (a killed compile otherwise leaves no trace of which path it was in).
            t1 = time.perf_counter()
            self.log(f"check: path {path} built in {t1 - t0:.1f} s")
            curves[path] = [float(step())]
            t2 = time.perf_counter()
            self.log(f"check: path {path} first step (compile, if any) {t2 - t1:.1f} s")
            curves[path] += [float(step()) for _ in range(cfg["steps"] - 1)]
            self.log(f"check: path {path} {cfg['steps'] - 1} more steps in {time.perf_counter() - t2:.1f} s")
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
            del raw, model, opt
        a, b = curves["plain"], curves["fast"]
        pairs = {}
        for x, y in (
            ("plain", "plain_split"),
            ("plain", "fast"),
            ("plain_fp32", "plain"),
            ("plain_fp32", "plain_split"),
            ("plain_fp32", "fast"),
        ):
            if x in curves and y in curves:
                d = [abs(u - v) for u, v in zip(curves[x], curves[y])]
                r = [e / abs(u) for e, u in zip(d, curves[x])]
                pairs[f"{y}_vs_{x}"] = {
                    "max_abs": round(max(d), 5),
                    "max_rel": round(max(r), 5),
                    "mean_rel": round(sum(r) / len(r), 5),
                    "final_rel": round(r[-1], 5),
                    "argmax_step": 1 + d.index(max(d)),
                }
        extra = {
            f"curve_{k}": [round(v, 4) for v in curves[k][::5]] + [round(curves[k][-1], 4)]
            for k in curves
            if k not in ("plain", "fast")
        }
        if "fast_vs_plain_fp32" in pairs:
            # The noise-floor gate: the fast path is no further from the fp32 reference than the two bf16
            # plain paths are (max and mean relative distance over the steps).
            f, ref = pairs["fast_vs_plain_fp32"], [pairs["plain_vs_plain_fp32"], pairs["plain_split_vs_plain_fp32"]]
            extra["within_noise_floor"] = f["max_rel"] <= max(r["max_rel"] for r in ref) and f["mean_rel"] <= max(
                r["mean_rel"] for r in ref
            )
        diffs = [abs(x - y) for x, y in zip(a, b)]
        rel = [d / abs(x) for d, x in zip(diffs, a)]
        return {
            "config": label(cfg),
            **cfg,
            "world": self.world,
            "plain_first": a[0],
            "plain_last": a[-1],
            "fast_first": b[0],
            "fast_last": b[-1],
            "max_abs_diff": max(diffs),
            "max_rel_diff": max(rel),
            "mean_rel_diff": sum(rel) / len(rel),
            # bf16 has 8 mantissa bits (2^-8 = 0.4 %); two paths that round differently drift apart
            # slowly over steps, so the gate is 2 % relative at any step and 0.5 % on average.
            "within_tolerance": max(rel) < 0.02 and sum(rel) / len(rel) < 0.005,
            "curve_plain": [round(v, 4) for v in a[::5]],
            "curve_fast": [round(v, 4) for v in b[::5]],
            "pairs": pairs,
            **extra,
        }

    def graphs(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """CUDA graphs keep the numbers: the compiled path without them (`nograph`: cmode default, gradients
        set to None) and with them (`graph`: cmode reduce-overhead, gradients cleared per `zero`), from the
        same init on the same learnable batches, `accum` micro-steps a step. After each of the first
        `gsteps` steps every parameter's gradient (clipped, as the optimizer sees it) is compared; the
        losses are compared over all `steps`. The floor is the same comparison of `nograph` with the
        uncompiled model (`eager`): what other kernels alone change. Only step 1 starts from the same
        weights; after it each path follows its own. A graphed gradient that lost micro-steps is off by
        O(1), where one that kept them differs by rounding only (docs/performance.md has the figures)."""
        if cfg["compile"] == "none":
            raise SystemExit("task=graphs compares compiled paths: give compile=full (or regional)")
        batches = learnable_batches(8, cfg["micro"], self.args.seq_len, self.vocab, self.device, seed=5)
        losses: dict[str, list[float]] = {}
        grads: dict[str, list[torch.Tensor]] = {}
        for path in ("eager", "nograph", "graph"):
            self.fresh()
            c = dict(
                cfg,
                impl="ours",
                task="speed",
                cmode="reduce-overhead" if path == "graph" else "default",
                zero=cfg["zero"] if path == "graph" else "auto",
                compile="none" if path == "eager" else cfg["compile"],
            )
            raw, model, loss_fn, opt, scaler, autocast = self.setup(c)
            params = [p for p in raw.parameters() if p.requires_grad]
            kept: list[torch.Tensor] = []

            def grab(params=params, kept=kept):
                if len(kept) < cfg["gsteps"]:
                    kept.append(torch.cat([p.grad.detach().float().flatten() for p in params]).cpu())

            step = self.make_step(c, raw, model, loss_fn, opt, scaler, autocast, batches, before_opt=grab)
            t0 = time.perf_counter()
            losses[path] = [float(step()) for _ in range(cfg["steps"])]
            self.log(f"graphs: path {path} {cfg['steps']} steps in {time.perf_counter() - t0:.1f} s")
            grads[path] = kept
            del raw, model, opt, step

        def rel_l2(x: str, y: str) -> list[float]:
            return [float(f"{float((g - r).norm() / r.norm()):.3g}") for g, r in zip(grads[x], grads[y])]

        def loss_rel(x: str, y: str) -> list[float]:
            return [abs(u - v) / abs(u) for u, v in zip(losses[x], losses[y])]

        rel, floor = rel_l2("graph", "nograph"), rel_l2("nograph", "eager")
        lrel, lfloor = loss_rel("nograph", "graph"), loss_rel("eager", "nograph")
        a, b = losses["nograph"], losses["graph"]
        return {
            "config": label(cfg),
            **cfg,
            "world": self.world,
            "grad_rel_l2": rel,
            "grad_rel_l2_floor": floor,
            "grad_bitwise_equal": [bool(torch.equal(g, r)) for g, r in zip(grads["graph"], grads["nograph"])],
            "loss_bitwise_equal": a == b,
            "loss_max_rel": round(max(lrel), 6),
            "loss_mean_rel": round(sum(lrel) / len(lrel), 6),
            "loss_max_rel_floor": round(max(lfloor), 6),
            "loss_mean_rel_floor": round(sum(lfloor) / len(lfloor), 6),
            "curve_nograph": [round(v, 4) for v in a[::5]] + [round(a[-1], 4)],
            "curve_graph": [round(v, 4) for v in b[::5]] + [round(b[-1], 4)],
            # From the same weights (step 1), CUDA graphs move the gradient no further than compiling does.
            "graphs_keep_gradients": bool(rel) and rel[0] <= floor[0],
        }

    def drift(self, cfg: dict[str, Any]) -> dict[str, Any]:
        raw, model, loss_fn, opt, scaler, autocast = self.setup(cfg)
        batches = self.random_batches(cfg["micro"], seed=7 + self.rank)
        step = self.make_step(cfg, raw, model, loss_fn, opt, scaler, autocast, batches)
        for _ in range(cfg["warmup"]):
            step()
        sync(self.device)
        settle_heap(cfg)
        ends = [int(w) for w in cfg["windows"].split("/")]
        tok_step = cfg["accum"] * cfg["micro"] * self.args.seq_len * self.world
        windows, done, t0 = [], 0, time.time()
        for end in ends:
            tw = time.time()
            while done < end:
                step()
                done += 1
            sync(self.device)
            now = time.time()
            reserved = torch.cuda.memory_reserved(self.device) / GIB if self.device.type == "cuda" else None
            alloc_peak = torch.cuda.max_memory_allocated(self.device) / GIB if self.device.type == "cuda" else None
            windows.append(
                {
                    "steps_to": end,
                    "tok_s_window": round(
                        (end - (ends[ends.index(end) - 1] if ends.index(end) else 0)) * tok_step / (now - tw), 1
                    ),
                    "tok_s_cumulative": round(end * tok_step / (now - t0), 1),
                    "reserved_gib": round(reserved, 3) if reserved is not None else None,
                    "peak_alloc_gib": round(alloc_peak, 3) if alloc_peak is not None else None,
                }
            )
        row = self.row(cfg, tok_s=ends[-1] * tok_step / (time.time() - t0))
        row["drift_windows"] = windows
        return row

    def run(self, cfg: dict[str, Any]) -> dict[str, Any]:
        self.fresh()
        self.log(f"== {label(cfg)}")
        t0 = time.time()
        try:
            row = getattr(self, cfg["task"])(cfg)
        except Exception as e:  # one failing row (OOM, missing transformers) must not end the table
            if self.args.verbose:
                traceback.print_exc()
            row = {"config": label(cfg), **cfg, "world": self.world, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        row["wall_s"] = round(time.time() - t0, 1)
        row["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.log("ROW " + json.dumps(row))
        if self.rank == 0 and self.args.jsonl:
            with open(self.args.jsonl, "a") as f:
                f.write(json.dumps(row) + "\n")
        self.fresh()
        return row


def matmul_tflops(device: torch.device) -> float | None:
    """bf16 8192^3 matmul on random data: the card's practical ceiling (mean of 10 after 3 warm-ups)."""
    if device.type != "cuda":
        return None
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    t0 = time.time()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize(device)
    return 2 * 8192**3 * 10 / (time.time() - t0) / 1e12


def shape_key(r: dict[str, Any]) -> tuple:
    """Rows with the same key train the same tokens per step the same way: comparable tok/s."""
    return (r.get("micro"), r.get("accum"), r.get("prec"), r.get("world", 1), r.get("seq_len"), r.get("card"))


def vs_baseline(rows: list[dict[str, Any]]) -> dict[int, float]:
    """{index of a row of ours: its tok/s over the mean tok/s of the HF + torch.compile(model) rows of the same
    shape among `rows`}: the speed-up, only ever against a baseline measured in the same table."""
    base: dict[tuple, list[float]] = {}
    for r in rows:
        if r.get("impl") == "hf" and r.get("compile") == "full" and r.get("task") == "speed" and r.get("tok_s"):
            base.setdefault(shape_key(r), []).append(r["tok_s"])
    return {
        i: r["tok_s"] / (sum(base[shape_key(r)]) / len(base[shape_key(r)]))
        for i, r in enumerate(rows)
        if r.get("impl") == "ours" and r.get("task") == "speed" and r.get("tok_s") and shape_key(r) in base
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    ratios = vs_baseline(rows)
    head = f"{'config':<60} {'tok/s':>10} {'MFU%':>6} {'alloc':>7} {'resv':>7} {'stall ms':>9} {'notes'}"
    print(head)
    print("-" * len(head))
    for i, r in enumerate(rows):
        if r.get("error"):
            print(f"{r['config']:<60} ERROR {r['error'][:120]}")
            continue
        if r.get("task") == "check":
            print(
                f"{r['config']:<60} check: plain {r['plain_first']:.3f}->{r['plain_last']:.3f} fast "
                f"{r['fast_first']:.3f}->{r['fast_last']:.3f} max rel {r['max_rel_diff']:.2e} "
                # The verdict that means something is the noise floor (noise=1): the fixed gate sits below
                # what two plain bf16 paths already differ by.
                + (f"within_noise_floor={r['within_noise_floor']} " if "within_noise_floor" in r else "")
                + f"fixed_2%/0.5%_gate={r['within_tolerance']}"
            )
            for k, v in (r.get("pairs") or {}).items():
                print(
                    f"    {k:<26} max_abs {v['max_abs']:.4f} (step {v['argmax_step']}) max_rel {v['max_rel']:.2e} "
                    f"mean_rel {v['mean_rel']:.2e} final_rel {v['final_rel']:.2e}"
                )
            continue
        if r.get("task") == "graphs":
            print(
                f"{r['config']:<60} graphs: grad rel L2 {r['grad_rel_l2']} (compiled vs eager "
                f"{r['grad_rel_l2_floor']}) bitwise {r['grad_bitwise_equal']} loss max/mean rel "
                f"{r['loss_max_rel']:.2e}/{r['loss_mean_rel']:.2e} (compiled vs eager {r['loss_max_rel_floor']:.2e}/"
                f"{r['loss_mean_rel_floor']:.2e}) graphs_keep_gradients={r['graphs_keep_gradients']}"
            )
            continue
        stall = (
            f"{1000 * r['stall_sync_s']:.0f}/{1000 * r.get('stall_async_s', float('nan')):.0f}"
            if "stall_sync_s" in r
            else ""
        )
        notes = [f"vs_hf_compile={ratios[i]:.2f}x"] if i in ratios else []
        if r.get("world", 1) > 1:
            notes.append(f"world={r['world']}")
        if "scaler_overflow_steps" in r:
            notes.append(f"overflow_steps={r['scaler_overflow_steps']}")
        if "warm_s" in r:
            notes.append(f"warm={r['warm_s']:.0f}s")
        if "tok_s_median" in r:
            notes.append(
                f"median={r['tok_s_median']:.0f} step_ms p50/p90/max={r['step_ms_p50']}/{r['step_ms_p90']}"
                f"/{r['step_ms_max']}"
            )
        if r.get("gc_full_collections"):  # a full collection stopped the timed steps: say how long
            notes.append(f"gc_full={r['gc_full_collections']}x max {1000 * r['gc_full_s_max']:.0f}ms")
        if r.get("addmm_fp32") is not None and r.get("impl") == "ours":
            notes.append(f"addmm_fp32={r['addmm_fp32']}")
        if "drift_windows" in r:
            notes.append(
                " ".join(f"{w['steps_to']}:{w['tok_s_window']:.0f}/{w['reserved_gib']}G" for w in r["drift_windows"])
            )
        print(
            f"{r['config']:<60} {r['tok_s'] or 0:>10.0f} {r['mfu_pct'] or 0:>6.1f} "
            f"{r['peak_alloc_gib'] if r['peak_alloc_gib'] is not None else '-':>7} "
            f"{r['peak_reserved_gib'] if r['peak_reserved_gib'] is not None else '-':>7} {stall:>9} {' '.join(notes)}"
        )
        for name, v, pct in r.get("prof_top") or []:
            if name == "LAUNCHES":
                print(f"    {v:>9.1f} launches/step")
            else:
                print(f"    {v:>9.3f} ms/step {pct:>5.1f} %  {name}")


def trainer_row(log_text: str, where: str, peak_tflops: float) -> dict[str, Any]:
    """A speed row measured by the trainer itself (`python -m trainer.train`, any number of ranks): its
    RUN_JSON carries the bench's step figures (trainer/steptime.py), so the trainer's step and the bench's
    rows compare in one table."""
    found = [line.split("RUN_JSON ", 1)[1] for line in log_text.splitlines() if "RUN_JSON " in line]
    base = {"config": f"trainer {where}", "impl": "trainer", "task": "speed"}
    if not found:
        return {**base, "error": f"no RUN_JSON line in {where}"}
    try:
        rj = json.loads(found[-1])
    except json.JSONDecodeError as e:
        return {**base, "error": f"{where}: RUN_JSON is not JSON: {e}"}
    world = rj["world_size"]
    tok_s = rj["tok_per_s"]
    per_gpu = tok_s / world if tok_s else None
    mcfg = GEOMETRIES[rj["model"]]
    flop_per_token = 6 * rj["params"] + 12 * mcfg.n_layer * mcfg.d_model * rj["seq_len"]
    opts = rj.get("model_options") or {}
    return {
        **base,
        "config": (
            f"trainer m{rj['micro_batch']}x{rj['accum']} {rj['precision']} {rj.get('attn', '')} "
            f"compile={rj['compile']} graphs={int(bool(rj.get('cuda_graphs')))}"
        ).replace("  ", " "),
        "micro": rj["micro_batch"],
        "accum": rj["accum"],
        "prec": rj["precision"],
        "world": world,
        "seq_len": rj["seq_len"],
        "card": rj.get("card", ""),
        "tok_s": tok_s,
        "mfu_pct": round(100 * per_gpu * flop_per_token / (peak_tflops * 1e12), 2) if per_gpu else None,
        "peak_alloc_gib": rj.get("peak_gpu_gb_max_rank"),
        "peak_reserved_gib": rj.get("peak_reserved_gb_max_rank"),
        **{
            k: rj[k]
            for k in (
                "tok_s_median",
                "step_ms_min",
                "step_ms_p50",
                "step_ms_p90",
                "step_ms_max",
                "gc_full_collections",
                "gc_full_s_max",
            )
            if rj.get(k) is not None
        },
        "steps": rj["final_step"] - (rj["first_step"] or 1) + 1,
        "model_options": opts,
        "source": where,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="ounce100m-22l", choices=sorted(GEOMETRIES))
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--config", action="append", help="key=value,... (repeatable; default: DEFAULT_CONFIGS)")
    p.add_argument("--steps", type=int, default=None, help="override every config's steps (smoke tests)")
    p.add_argument("--warmup", type=int, default=None, help="override every config's warmup")
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--jsonl", type=Path, default=None, help="append one JSON row per config")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing rows")
    p.add_argument("--table", type=Path, nargs="+", help="only print the table of these --jsonl files")
    p.add_argument(
        "--trainer-log",
        type=Path,
        nargs="+",
        help="rows from the trainer's own runs: each log's RUN_JSON becomes a row (appended to --jsonl)",
    )
    return p


def _trainer_rows(args: argparse.Namespace) -> int:
    """--trainer-log: the trainer's own runs as rows, and how the multi-rank ones scale against one rank."""
    rows = [trainer_row(log.read_text(errors="replace"), str(log), args.peak_tflops) for log in args.trainer_log]
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print_table(rows)
    one = next((r for r in rows if r.get("world") == 1 and r.get("tok_s")), None)
    for r in rows:
        if one and r.get("world", 1) > 1 and r.get("tok_s"):
            print(
                f"scaling {r['world']} ranks vs 1: tok/s {r['tok_s'] / one['tok_s']:.2f}x, "
                f"median {r['tok_s_median'] / one['tok_s_median']:.2f}x ({r['source']} vs {one['source']})"
            )
    return 0 if all(not r.get("error") for r in rows) else 1


def _tables(files: list[Path]) -> int:
    """--table: the table of saved --jsonl rows, each file's BENCH_INFO first."""
    rows = [json.loads(line) for f in files if f.exists() for line in f.read_text().splitlines() if line]
    for r in rows:
        if "info" in r:
            print("BENCH_INFO " + json.dumps(r["info"]))
    print_table([r for r in rows if "info" not in r])
    return 0


def _bench_info(bench: Bench, args: argparse.Namespace) -> None:
    """The BENCH_INFO line (and --jsonl row): what the rows were measured on."""
    info = {
        "card": torch.cuda.get_device_name(bench.device) if bench.device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "world": bench.world,
        "params": bench.n_params,
        "flop_per_token": bench.flop_per_token,
        "peak_tflops_assumed": args.peak_tflops,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if bench.world == 1:
        tf = matmul_tflops(bench.device)
        info["matmul_bf16_tflops_measured"] = round(tf, 1) if tf else None
    print("BENCH_INFO " + json.dumps(info), flush=True)
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            f.write(json.dumps({"info": info, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")


def _config(text: str, args: argparse.Namespace) -> dict[str, Any]:
    """One row's config, with --steps / --warmup over it."""
    cfg = parse_config(text)
    if args.steps is not None:
        cfg["steps"] = args.steps
        cfg["windows"] = "/".join(str(max(1, args.steps * k)) for k in (1, 2, 3))
    if args.warmup is not None:
        cfg["warmup"] = args.warmup
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # A row killed by its part's budget (device_all.sh: timeout sends SIGTERM) first writes every thread's
    # stack to stderr, which the part's log keeps: where it was stuck, not only that it was.
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    if args.trainer_log:
        return _trainer_rows(args)
    if args.table:
        return _tables(args.table)
    if args.device == "cuda":
        # TF32 for any fp32 matmul left (the fp32 rows, optimizer-side math): same range, 10-bit mantissa.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    bench = Bench(args)
    if bench.rank == 0:
        _bench_info(bench, args)
    rows = [bench.run(_config(text, args)) for text in args.config or DEFAULT_CONFIGS]
    if bench.rank == 0:
        print_table(rows)
    if bench.ddp:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
