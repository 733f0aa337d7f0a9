"""The compile policy, applied to a built model from outside (as torchtitan's parallelize.py does).

Both scopes compile in place (`nn.Module.compile`), so parameter names stay those of the plain module (no
`_orig_mod.` prefix) and DDP, checkpoints and the snapshot's shadow model see an unchanged model. These
functions change process-wide Dynamo, Inductor and partitioner settings, which are read when each graph is
built (lazily, at the first forward); `inductor_kernel_settings()` says what the next graph will get.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn as nn

from trainer.model.model import Llama, keep_loss_eager
from trainer.model.options import ModelOptions


def compile_blocks(model: Llama, options: ModelOptions, **kwargs: Any) -> None:
    """Regional compilation: torch.compile each block (and the final norm) in place.

    The blocks share one code object and dynamo treats their parameters as inputs, so ONE graph is traced
    and built and then reused by every block: compile takes seconds instead of the minute a whole-model
    compile spends inlining 22 copies, and it fuses the same things (RMSNorm, RoPE, SwiGLU, residual adds).
    """
    # Each block is a separate module instance; allow one cache entry per block in case guards on module
    # identity are ever needed (the default limit of 8 would silently fall back to eager).
    _compile_setup(options, recompile_limit=2 * model.cfg.n_layer + 8)
    for block in model.layers:
        block.compile(**kwargs)
    model.norm.compile(**kwargs)


def compile_model(
    model: Llama, options: ModelOptions, *, tune: bool = True, graphs: bool = False, **kwargs: Any
) -> None:
    """Whole-model compilation in place: the embedding, the blocks and the final norm as one Inductor graph;
    the loss stays outside it (keep_loss_eager() disables the compiler in Llama.chunked_loss).

    It fuses across block boundaries and issues fewer launches than compile_blocks(). With `tune`,
    Inductor's coordinate-descent search times each Triton kernel's launch configuration (minutes of
    warm-up in a fresh process, seconds once Inductor's on-disk cache holds the kernels);
    TORCHINDUCTOR_COORDINATE_DESCENT_TUNING, when set, decides instead. `options.combo_kernels` turns on
    Inductor's combo kernels. `graphs` records the compiled forward and backward as CUDA graphs (mode
    "reduce-overhead": one replay instead of ~1,450 launches a micro-step); under gradient accumulation the
    caller must then keep the gradients allocated (keep_grads_allocated()) and zero them in place.
    """
    from torch._inductor import config as inductor

    if tune and "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING" not in os.environ:
        inductor.coordinate_descent_tuning = True
    if options.combo_kernels:
        inductor.combo_kernels = True
    _compile_setup(options)  # one graph (and its no-grad twin for validation): dynamo's default limit fits
    keep_loss_eager()
    model.compile(**({"mode": "reduce-overhead"} if graphs else {}), **kwargs)


def _compile_setup(options: ModelOptions, recompile_limit: int = 0) -> None:
    """Global compiler settings both scopes need. recompile_limit raises dynamo's cache limit to at least
    that many entries."""
    from torch._dynamo import config as cfg
    from torch._functorch import config as partitioner

    if options.lean_activations:
        # The partitioner may recompute in the backward the pointwise results that feed a matmul there
        # (the weights' casts, the norm outputs, silu(gate) * up) instead of saving them; no matmul is
        # recomputed (this is not gradient checkpointing).
        partitioner.ban_recompute_materialized_backward = False
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), recompile_limit))


def keep_grads_allocated(module: nn.Module) -> None:
    """Give every trainable parameter of `module` a zero gradient where it has none.

    Why: with CUDA graphs (compile_model(graphs=True)) a gradient that the backward graph returns lives in
    the graph's memory pool, and autograd adopts it as `.grad` when there is none yet; the next micro-step's
    replay then overwrites it, and the accumulated gradient silently loses micro-steps (cudagraph trees'
    known error, pytorch/pytorch#169545). With `.grad` already allocated autograd adds into it in place,
    which is what accumulation needs; zero_grad(set_to_none=False) keeps it allocated across steps."""
    for p in module.parameters():
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)


def inductor_kernel_settings() -> str:
    """Inductor's kernel settings as the next graph will be built with them, for the run's log: whether
    coordinate-descent tuning and combo kernels are on decides both the speed and how long the first step
    compiles, and environment variables can change either."""
    from torch._inductor import config as inductor

    onoff = {True: "on", False: "off"}
    return (
        f"coordinate-descent tuning {onoff[bool(inductor.coordinate_descent_tuning)]}, "
        f"combo kernels {onoff[bool(inductor.combo_kernels)]}"
    )
