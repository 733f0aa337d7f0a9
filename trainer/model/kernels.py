"""The model's hand-written autograd kernels: a projection whose weight gradient the GEMM writes in fp32,
and the tied output projection fused with the cross-entropy loss, a chunk of rows at a time.

Both run their matmuls in the autocast dtype, as nn.Linear does under autocast; what they change is
where results are rounded and which intermediate tensors exist. A fallback that a build cannot run is
announced with `warnings.warn` once and the correct, slower path is taken.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

_MM_OUT_DTYPE = "dtype" in torch.ops.aten.mm.overloads()  # mm(..., out_dtype=): torch >= 2.9


# ------------------------------------------------------------------------------------------ projections


class LinearFp32Grad(torch.autograd.Function):
    """x @ W.T in the autocast dtype, as nn.Linear computes it under autocast, with a backward whose weight
    gradient cuBLAS writes in fp32 on cuda (`mm(..., out_dtype=float32)`) instead of a low-precision product
    and a cast kernel per weight. CPU has no mixed-dtype GEMM and rounds first, as nn.Linear does."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor) -> Tensor:
        dev = x.device.type
        cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        with torch.autocast(dev, enabled=False):
            xc, wc = x.to(cdt), weight.to(cdt)
            out = F.linear(xc, wc)
        ctx.save_for_backward(xc, wc)
        ctx.dtypes = (x.dtype, weight.dtype)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        xc, w = ctx.saved_tensors
        g = grad.to(xc.dtype)
        dx = (g @ w).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            g2, x2 = g.reshape(-1, g.shape[-1]).t(), xc.reshape(-1, xc.shape[-1])
            if w.dtype == ctx.dtypes[1]:
                dw = g2 @ x2
            elif g.is_cuda and _MM_OUT_DTYPE:
                dw = torch.mm(g2, x2, out_dtype=ctx.dtypes[1])
            else:
                dw = (g2 @ x2).to(ctx.dtypes[1])
        return dx, dw


def linear(x: Tensor, lin: nn.Linear, fp32_wgrad: bool) -> Tensor:
    """x through the bias-free Linear `lin`; with `fp32_wgrad`, LinearFp32Grad's backward."""
    return LinearFp32Grad.apply(x, lin.weight) if fp32_wgrad else lin(x)


# ---------------------------------------------------------------------------------------------- loss


def loss_chunk_rows(n: int, fixed: int = 0) -> int:
    """Rows of logits per loss chunk for n rows of hidden states: `fixed` when positive, else eight chunks
    per micro-batch clamped to [512, 4096]. One chunk holds ~4 bytes a logit (the low-precision logits,
    then their gradient): at vocab 49152 a 4096-row chunk is ~800 MB where a whole micro-batch of 32 x 1024
    tokens at once would be ~6 GB, and 512 rows keep small micro-batches within the 2-rank memory target."""
    if fixed > 0:
        return fixed
    return min(4096, max(512, n // 8))


def ce_sum(h: Tensor, weight: Tensor, y: Tensor) -> Tensor:
    """Summed cross-entropy of one chunk without gradients (evaluation): h (n, d), weight (V, d), y (n,)."""
    return F.cross_entropy(F.linear(h, weight).float(), y, reduction="sum")


def ce_grad_eager(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """(summed CE, d CE_sum / d logits) of one chunk of low-precision logits (n, V); softmax in fp32.

    The gradient softmax - onehot is left unnormalised (entries in [-1, 1]): dividing by the token count
    here would push most of an fp16 gradient into subnormals; the backward applies the scale in fp32.
    """
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    loss = (lse - lf.gather(1, y[:, None]).squeeze(1)).sum()
    g = lf.sub_(lse[:, None]).exp_()  # softmax, in place of the fp32 copy
    g.scatter_add_(1, y[:, None], g.new_full((y.shape[0], 1), -1.0))  # minus the one-hot target
    return loss, g.to(logits.dtype)


def ce_grad_pointwise(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """ce_grad_eager's maths written for Inductor: the one-hot is a comparison, not an indexed write.

    An indexed write (scatter_add_) cannot join a fused kernel, so compiling the in-place form above
    writes the whole fp32 softmax to memory, scatters into it, and casts it in a third kernel (~18 bytes a
    logit). Here the softmax-minus-one-hot and its cast are one pointwise pass after the row reduction:
    the logits are read twice and the gradient written once, in the logits' dtype. Eagerly this form
    would allocate several fp32 copies, hence two spellings of one function.
    """
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    loss = (lse - lf.gather(1, y[:, None]).squeeze(1)).sum()
    hit = torch.arange(lf.shape[1], device=lf.device)[None, :] == y[:, None]
    g = (lf - lse[:, None]).exp() - hit.to(lf.dtype)
    return loss, g.to(logits.dtype)


_ce_grad_compiled: Any = None  # torch.compile(ce_grad_pointwise), built at the first CUDA call (a cache)


def ce_grad(logits: Tensor, y: Tensor, fused: bool = True) -> tuple[Tensor, Tensor]:
    """ce_grad_eager's result. On CUDA with `fused`, one Triton pass that reads the logits twice and
    writes the gradient once (~6 bytes a logit where the eager ops move ~40); it falls back to the eager
    ops, with a warning, where Triton cannot build."""
    global _ce_grad_compiled
    if logits.device.type != "cuda" or not fused:
        return ce_grad_eager(logits, y)
    if _ce_grad_compiled is None:
        try:
            fn = torch.compile(ce_grad_pointwise, dynamic=False)
            fn(logits[:1], y[:1])  # build it now, so a Triton failure falls back here and not mid-run
            _ce_grad_compiled = fn
        except Exception as e:  # any compiler failure: the eager path is correct, only slower
            warnings.warn(
                f"fused cross-entropy unavailable ({type(e).__name__}: {e}); using eager ops",
                RuntimeWarning,
                stacklevel=2,
            )
            _ce_grad_compiled = ce_grad_eager
    return _ce_grad_compiled(logits, y)


_addmm_fp32_ok: bool | None = None  # does this build's CUDA addmm take bf16/fp16 inputs into an fp32 out?


def addmm_fp32_status() -> bool | None:
    """Whether the fp32 addmm worked in this process (None: not tried yet)."""
    return _addmm_fp32_ok


def accumulate_mm(acc: Tensor, a: Tensor, b: Tensor, fp32_addmm: bool = True) -> None:
    """acc (fp32) += a @ b for low-precision a, b. On CUDA with `fp32_addmm`, one GEMM does it (cuBLAS with
    an fp32 C and beta = 1: `addmm(..., out_dtype=float32)`, torch >= 2.9) instead of a low-precision
    product followed by a separate fp32 add over acc (at vocab 49152, 113 MB read and written again per
    loss chunk). Its first use is checked against the two-step sum, so a build that lacks it, or aliases
    `out` and `input` wrongly, falls back (with a warning) instead of training on a wrong gradient."""
    global _addmm_fp32_ok
    if not fp32_addmm or acc.device.type != "cuda" or a.dtype == acc.dtype or _addmm_fp32_ok is False:
        acc += a @ b
    elif _addmm_fp32_ok:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:  # first use: try it on acc itself (the same aliasing as later) and keep the two-step result
        ref = acc + (a @ b).float()
        try:
            torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
            err = ((acc - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            why = "" if err < 1e-2 else f"disagrees with the two-step sum (rel err {err:.2e})"
        except (TypeError, RuntimeError, NotImplementedError) as e:
            why = f"unavailable ({type(e).__name__}: {str(e)[:120]})"
        _addmm_fp32_ok = not why
        if why:
            warnings.warn(f"addmm into fp32 {why}; adding separately", RuntimeWarning, stacklevel=2)
        acc.copy_(ref)


class LinearCrossEntropy(torch.autograd.Function):
    """Mean CE of (h @ weight.T) against y, `rows` rows of logits at a time, gradients included.

    The forward computes each chunk's gradients (d/dh, d/dweight) right after its loss, while its logits
    are at hand, and keeps only those (N x d and V x d): no (N, V) tensor outlives its chunk, and the
    logits matmul is not recomputed in the backward as a checkpointed chunk would (that recompute is
    2*V*d FLOP a token, ~7 % of the frozen model's step). Matmuls run in the autocast dtype (bf16/fp16)
    with fp32 accumulation of the weight gradient; the softmax runs in fp32.
    """

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, y: Tensor, rows: int, fused: bool, fp32_addmm: bool) -> Tensor:
        dev = h.device.type
        cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with torch.autocast(dev, enabled=False):
            hc, wc = h.to(cdt), weight.to(cdt)
            n = h.shape[0]
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            grad_h = torch.empty(h.shape, dtype=torch.float32, device=h.device) if need_h else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if need_w else None
            for i in range(0, n, rows):
                hs, ys = hc[i : i + rows], y[i : i + rows]
                loss, g = ce_grad(hs @ wc.t(), ys, fused)
                total += loss
                if need_h:
                    grad_h[i : i + rows] = g @ wc  # (rows, d), widened to fp32 on the copy
                if need_w:
                    accumulate_mm(grad_w, g.t(), hs, fp32_addmm)  # (V, d): fp32 sum of the chunks' products
        ctx.save_for_backward(grad_h, grad_w)
        ctx.n, ctx.dtypes = n, (h.dtype, weight.dtype)
        return total / n

    @staticmethod
    def backward(ctx, gout: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        scale = gout.float() / ctx.n
        # In place: the saved buffers die with this call, and a scaled copy of the (V, d) fp32 weight
        # gradient would be one more 113 MB block live at the start of the backward, the peak.
        gh = grad_h.mul_(scale).to(ctx.dtypes[0]) if grad_h is not None else None
        gw = grad_w.mul_(scale).to(ctx.dtypes[1]) if grad_w is not None else None
        return gh, gw, None, None, None, None
