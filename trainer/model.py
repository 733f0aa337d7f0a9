"""The Llama-style decoder that specprobe trains, in one file of plain PyTorch.

Pre-norm blocks of RMSNorm -> grouped-query attention with rotary positions -> RMSNorm -> SwiGLU MLP,
no biases, and the output projection tied to the token embedding. Module and parameter names mirror
Hugging Face's `LlamaForCausalLM` (`modeling_llama.py`), and RoPE uses its `rotate_half` layout, so
`save_pretrained` writes a directory that `transformers` loads with the same logits.

The model is pure: a config in, `(logits, loss)` out. Distributed training, precision and I/O of the
training state live in `trainer/train.py` and `trainer/checkpoint.py`.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

# Rows of the flattened (B*T, d) hidden states turned into logits at a time by the loss. One chunk's
# working set is ~4 bytes per logit (the bf16/fp16 logits, then the gradient in the same dtype): at vocab
# 49152 a 1024-row chunk is ~200 MB, while the whole micro-batch of 32x1024 tokens at once would be ~6 GB.
# 0 = loss_chunk_rows()'s rule, eight chunks per micro-batch: n/8 rows clamped to [512, 4096]. At
# micro-batch 32 that is 4096 (run 4: +3.4 % tok/s over 1024 for +1.4 GiB; 8192 and 16384 measured within
# 1 % of it in run 6 for +1.1 / +3.4 GiB); at micro-batch 4 it is 512, which keeps the 2-rank trainer at
# the reference shape under 4.0 GB a rank (3.579 GiB, bench/RESULTS.md run 8). A positive value fixes it.
LOSS_CHUNK_ROWS = 0


def loss_chunk_rows(n: int) -> int:
    """Rows per loss chunk for n rows of hidden states (see LOSS_CHUNK_ROWS)."""
    if LOSS_CHUNK_ROWS > 0:
        return LOSS_CHUNK_ROWS
    return min(4096, max(512, n // 8))


INIT_STD = 0.02  # Llama's initializer_range, used for every Linear and the embedding
# Run q/k/v as one matmul against the concatenated weights, and gate/up as another (the parameters, so
# checkpoints and HF names, stay separate). Off: measured SLOWER on the H200 under regional compile,
# 424,601 tok/s separate vs 379,778 / 405,715 fused at micro-batch 32 (bench/RESULTS.md, 2026-11-29): the
# per-step torch.cat of the weights and the split of their gradients cost more than the wider N saves
# (-5 % again in run 9; run 13's profile of a backward-only grouping located it: the concatenated q/k/v
# gradient is written through RoPE's transposed layout, 5.7 ms a step instead of 0.7).
FUSED_PROJ = False
# The projections' weight gradients straight out of their GEMMs in fp32 (cuBLAS writes the fp32 result:
# `mm(..., out_dtype=float32)`, torch >= 2.9 on cuda) instead of nn.Linear's bf16 product and a cast kernel
# per weight, 7 a block: no bf16 rounding of dW, ~150 fewer kernels a micro-step. On the H200 at micro-batch
# 32 with the whole-model compile: +0.6 % tok/s with combo kernels (bench/RESULTS.md run 13), 0 and +1.0 % on
# two cards without them (run 19). CPU has no mixed-dtype GEMM and rounds first, as nn.Linear does.
# SPECPROBE_FP32_WGRAD=0 restores nn.Linear's backward.
FP32_WGRAD = os.environ.get("SPECPROBE_FP32_WGRAD", "1") == "1"
# Opt-in, with FP32_WGRAD: q/k/v (and gate/up), which read the same input, run as one LinearFp32Grad whose
# backward concatenates their output gradients and runs ONE GEMM for the input's gradient (K = 960, not
# three GEMMs of K = 576/192/192 and two adds) and one for the three weight gradients. Run 13 measured it
# -5.2 % on the H200: the GEMMs saved 1.1 ms a step and ~300 launches, but Inductor lowered the
# concatenation as one "pointwise cat" kernel that recomputes every input per element (the q/k/v
# gradient through RoPE's transposed layout: 5.7 ms instead of 0.7). With `max_pointwise_cat_inputs=0`
# and ROPE_ROLL, run 19 measured it -4.8 to -5.5 %: on torch 2.11 the cat stayed a pointwise kernel.
# Kept for a torch whose Inductor lets each producer write its slice. SPECPROBE_GROUPED_DGRAD=1 turns it on.
GROUPED_DGRAD = os.environ.get("SPECPROBE_GROUPED_DGRAD", "0") == "1"
# Opt-in: RoPE's rotate_half as a roll of the head dimension times a sign folded into sin, instead of a
# torch.cat of the two negated/swapped halves: the same numbers exactly (a +-1 product and a permutation),
# but no cat for Inductor to lower, so the cat lowering chosen for GROUPED_DGRAD cannot touch RoPE.
# SPECPROBE_ROPE_ROLL=1 turns it on; on a GPU measured only together with GROUPED_DGRAD (run 19; bench key rope=roll).
ROPE_ROLL = os.environ.get("SPECPROBE_ROPE_ROLL", "0") == "1"
# sdpa with enable_gqa=True (the kernel reads each K/V head for its n_rep query heads) instead of expanding
# K/V into n_head copies first. None = auto (sdpa_gqa()): on for CUDA capability >= 8.0, where flash and
# cuDNN attention take grouped heads (H200, micro-batch 32: +1.0 % tok/s and -1.0 GiB, bench/RESULTS.md
# run 5); off on Turing (T4), whose memory-efficient kernel has no GQA (sdpa would fall back to the math
# kernel), and on CPU. SPECPROBE_SDPA_GQA=1 / =0 (or setting this) forces it either way.
SDPA_GQA: bool | None = {"1": True, "0": False}.get(os.environ.get("SPECPROBE_SDPA_GQA", ""))


def sdpa_gqa(device: torch.device) -> bool:
    """Whether attention on this device uses sdpa's enable_gqa (see SDPA_GQA)."""
    if SDPA_GQA is not None:
        return SDPA_GQA
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


# Under bf16 autocast, carry the residual stream (embedding output, block outputs) in bf16 instead of
# fp32: every norm, residual add and saved activation of it moves half the bytes. bf16 has fp32's range,
# so only rounding changes; fp16 (T4) keeps the fp32 stream, whose range fp16 could overflow.
# Measured on the H200 at micro-batch 32: +4.1 % tok/s, -0.8 GiB (bench/RESULTS.md run 5); the fast path's
# losses stay within the bf16 noise floor. SPECPROBE_BF16_RESIDUAL=0 keeps it fp32 as HF's autocast does.
BF16_RESIDUAL = os.environ.get("SPECPROBE_BF16_RESIDUAL", "1") == "1"


# Opt-in: compile_blocks() lets Inductor's partitioner recompute in the backward the pointwise results that
# feed a matmul there (the bf16 casts of the weights, the norm outputs, silu(gate) * up) instead of saving
# them; the backward then reads the fp32 weights (free to keep: they are the parameters). No matmul is
# recomputed (this is not gradient checkpointing). Measured on the H200 (run 7): micro-batch 32 peak
# 14.30 -> 10.53 GiB for -1.9 % tok/s, micro-batch 4 x accum 32 3.74 -> 3.13 GiB for about -25 % (that
# shape is launch-bound, and the recompute adds kernels). Off: speed is the lab's cost, and the defaults
# already fit the memory targets. SPECPROBE_LEAN_ACTIVATIONS=1 (or setting this) turns it on.
LEAN_ACTIVATIONS = os.environ.get("SPECPROBE_LEAN_ACTIVATIONS", "0") == "1"
# Opt-in: Inductor's combo kernels in compile_model() (independent small kernels, such as the weights'
# casts and the norms' weight-gradient reductions, run as one launch). Measured on the H200: +1.0 % at
# micro-batch 32 (bench/RESULTS.md run 12) and +22 % in the 2-rank trainer at micro-batch 4 x accum 32
# (launch-bound there; runs 16 and 20). Off, because with the coordinate-descent tuning the first backward
# compiles each combo kernel's candidate configs one after another with ptxas: at micro-batch 8 that ran
# past 7.5 minutes in every try (runs 13-18, 22), where without them the compile takes 61-78 s (run 19).
# The stall is the tuning's: combo kernels *instead of* it compiled in 60-73 s at micro 4, 8 and 32, equal
# at micro 32 and +19 % at micro 4 (runs 22, 25), but their 50-step loss check fell outside the bf16 noise
# floor (run 26: 9.0 % max against 5.4 %), so they stay opt-in; CUDA graphs (compile_model(graphs=True))
# took over the launch-bound shape since (3.4x at micro 4). SPECPROBE_COMBO_KERNELS=1
# TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=0 selects them.
COMBO_KERNELS = os.environ.get("SPECPROBE_COMBO_KERNELS", "0") == "1"


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int
    d_model: int
    d_mlp: int
    n_head: int
    n_kv_head: int
    vocab_size: int
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_head {self.n_head}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head {self.n_head} is not divisible by n_kv_head {self.n_kv_head}")
        if (self.d_model // self.n_head) % 2:
            raise ValueError(f"head dim {self.d_model // self.n_head} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def to_hf_config(self, dtype: str = "float32") -> dict[str, Any]:
        """The `config.json` of an equivalent transformers `LlamaForCausalLM`."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.d_model,
            "intermediate_size": self.d_mlp,
            "num_hidden_layers": self.n_layer,
            "num_attention_heads": self.n_head,
            "num_key_value_heads": self.n_kv_head,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_seq_len,
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "hidden_act": "silu",
            "tie_word_embeddings": True,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "initializer_range": INIT_STD,
            "pretraining_tp": 1,
            "use_cache": True,
            "torch_dtype": dtype,
        }

    @classmethod
    def from_hf_config(cls, d: dict[str, Any]) -> "ModelConfig":
        """Read a LlamaConfig dict; refuse one that describes a model this file cannot represent."""
        if d.get("model_type") != "llama":
            raise ValueError(f"config.json model_type is {d.get('model_type')!r}, expected 'llama'")
        # transformers 5 moved rope_theta into rope_parameters; older files have it top-level.
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        unsupported = {
            "hidden_act": (d.get("hidden_act", "silu"), "silu"),
            "tie_word_embeddings": (d.get("tie_word_embeddings", True), True),
            "attention_bias": (d.get("attention_bias", False), False),
            "mlp_bias": (d.get("mlp_bias", False), False),
            "rope type": (rope.get("rope_type", rope.get("type", "default")), "default"),
        }
        for key, (got, want) in unsupported.items():
            if got != want:
                raise ValueError(f"config.json {key} is {got!r}; this model supports only {want!r}")
        try:
            cfg = cls(
                n_layer=int(d["num_hidden_layers"]),
                d_model=int(d["hidden_size"]),
                d_mlp=int(d["intermediate_size"]),
                n_head=int(d["num_attention_heads"]),
                n_kv_head=int(d.get("num_key_value_heads", d["num_attention_heads"])),
                vocab_size=int(d["vocab_size"]),
                max_seq_len=int(d.get("max_position_embeddings", 2048)),
                rope_theta=float(d.get("rope_theta", rope.get("rope_theta", 10000.0))),
                norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            )
        except KeyError as e:
            raise ValueError(f"config.json lacks the field {e.args[0]!r}") from None
        if d.get("head_dim") not in (None, cfg.head_dim):
            raise ValueError(f"config.json head_dim {d['head_dim']} != hidden_size/num_attention_heads {cfg.head_dim}")
        return cfg


GEOMETRIES: dict[str, ModelConfig] = {
    # The lab's frozen model: 22 x 3,540,096 block parameters + 49152 x 576 tied embedding + 576 final norm.
    "ounce100m-22l": ModelConfig(n_layer=22, d_model=576, d_mlp=1536, n_head=9, n_kv_head=3, vocab_size=49152),
    # CPU tests: every feature of the big one (GQA, tied embedding, several blocks) at 119,104 parameters.
    "tiny": ModelConfig(n_layer=2, d_model=64, d_mlp=160, n_head=4, n_kv_head=2, vocab_size=512),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 and scale after casting back, exactly as HF's LlamaRMSNorm does under autocast.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


_MM_OUT_DTYPE = "dtype" in torch.ops.aten.mm.overloads()   # mm(..., out_dtype=): torch >= 2.9


class LinearFp32Grad(torch.autograd.Function):
    """x @ W.T for one weight, or for several that share x (one output each), in the autocast dtype as
    nn.Linear computes it under autocast, with a backward whose weight gradients are written in fp32 by the
    GEMM itself on cuda (see FP32_WGRAD). With several weights the backward concatenates the output
    gradients and runs one GEMM for x's gradient and one for all the weights' (see GROUPED_DGRAD)."""

    @staticmethod
    def forward(ctx, x: Tensor, *weights: Tensor) -> Tensor | tuple[Tensor, ...]:
        dev = x.device.type
        cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        with torch.autocast(dev, enabled=False):
            xc, ws = x.to(cdt), [w.to(cdt) for w in weights]
            outs = tuple(F.linear(xc, w) for w in ws)
        ctx.save_for_backward(xc, *ws)
        ctx.dtypes = (x.dtype, weights[0].dtype)
        return outs[0] if len(outs) == 1 else outs

    @staticmethod
    def backward(ctx, *grads: Tensor):
        xc, *ws = ctx.saved_tensors
        g = torch.cat([g.to(xc.dtype) for g in grads], dim=-1) if len(grads) > 1 else grads[0].to(xc.dtype)
        w = torch.cat(ws) if len(ws) > 1 else ws[0]
        dx = (g @ w).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        dws: list[Tensor | None] = [None] * len(ws)
        if any(ctx.needs_input_grad[1:]):   # several weights, some frozen: all computed, those dropped
            g2, x2 = g.reshape(-1, g.shape[-1]).t(), xc.reshape(-1, xc.shape[-1])
            if w.dtype == ctx.dtypes[1]:
                dw = g2 @ x2
            elif g.is_cuda and _MM_OUT_DTYPE:
                dw = torch.mm(g2, x2, out_dtype=ctx.dtypes[1])
            else:
                dw = (g2 @ x2).to(ctx.dtypes[1])
            parts = dw.split([wi.shape[0] for wi in ws]) if len(ws) > 1 else (dw,)
            dws = [p if need else None for p, need in zip(parts, ctx.needs_input_grad[1:])]
        return dx, *dws


def linear(x: Tensor, lin: nn.Linear) -> Tensor:
    """x through the bias-free Linear `lin`, with the fp32 weight-gradient backward when FP32_WGRAD."""
    return LinearFp32Grad.apply(x, lin.weight) if FP32_WGRAD else lin(x)


def linears(x: Tensor, *lins: nn.Linear) -> tuple[Tensor, ...]:
    """x through several bias-free Linears: one grouped backward with FP32_WGRAD and GROUPED_DGRAD, else each
    through linear()."""
    if FP32_WGRAD and GROUPED_DGRAD:
        return LinearFp32Grad.apply(x, *(lin.weight for lin in lins))
    return tuple(linear(x, lin) for lin in lins)


def rope_cos_sin(head_dim: int, max_seq_len: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin tables, (max_seq_len, head_dim), with each frequency repeated in both halves (HF layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # (T, hd/2)
    emb = torch.cat((angles, angles), dim=-1)                                        # (T, hd)
    return emb.cos(), emb.sin()


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x (B, h, T, hd); cos/sin (T, hd) broadcast over batch and heads
    if ROPE_ROLL:   # rotate_half(x) = roll(x, hd/2) * (-1 on the first half, +1 on the second)
        half = x.shape[-1] // 2
        sign = (torch.arange(x.shape[-1], device=x.device) >= half).to(sin.dtype) * 2 - 1
        return x * cos + x.roll(half, dims=-1) * (sin * sign)
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, kvh, T, hd) -> (B, kvh*n_rep, T, hd): each KV head serves n_rep consecutive query heads."""
    if n_rep == 1:
        return x
    b, kvh, t, hd = x.shape
    return x[:, :, None].expand(b, kvh, n_rep, t, hd).reshape(b, kvh * n_rep, t, hd)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, attn: str):
        super().__init__()
        if attn not in ("eager", "sdpa"):
            raise ValueError(f"attn must be 'eager' or 'sdpa', got {attn!r}")
        self.attn, self.n_head, self.n_kv_head, self.head_dim = attn, cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, gqa: bool = False) -> Tensor:
        b, t, _ = x.shape
        if FUSED_PROJ:
            w = torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight))
            nq, nkv = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
            q, k, v = F.linear(x, w).split((nq, nkv, nkv), dim=-1)
        else:
            q, k, v = linears(x, self.q_proj, self.k_proj, self.v_proj)
        q = q.reshape(b, t, self.n_head, self.head_dim).transpose(1, 2)     # (B, h, T, hd)
        k = k.reshape(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, kvh, T, hd)
        v = v.reshape(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, kvh, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.attn == "sdpa" and gqa and self.n_head != self.n_kv_head:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return linear(y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim), self.o_proj)
        # Expanding K/V explicitly (rather than sdpa's enable_gqa) keeps the memory-efficient kernel
        # available on Turing (T4), where flash attention is not; the copies are 1/3 of the query size.
        k, v = repeat_kv(k, self.n_head // self.n_kv_head), repeat_kv(v, self.n_head // self.n_kv_head)
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)                # (B, h, T, T)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~causal, float("-inf"))
            # softmax in fp32 like HF's eager path: fp16 scores over a long row lose the small weights
            y = F.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype) @ v            # (B, h, T, hd)
        return linear(y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim), self.o_proj)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.down_proj = nn.Linear(cfg.d_mlp, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if FUSED_PROJ:
            gate, up = F.linear(x, torch.cat((self.gate_proj.weight, self.up_proj.weight))).chunk(2, dim=-1)
        else:
            gate, up = linears(x, self.gate_proj, self.up_proj)
        return linear(F.silu(gate) * up, self.down_proj)  # SwiGLU


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, attn: str):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg, attn)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, gqa: bool = False) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, gqa)
        return x + self.mlp(self.post_attention_layernorm(x))


def _ce_sum(h: Tensor, weight: Tensor, y: Tensor) -> Tensor:
    """Summed cross-entropy of one chunk without gradients (evaluation): h (n, d), weight (V, d), y (n,)."""
    return F.cross_entropy(F.linear(h, weight).float(), y, reduction="sum")


def _ce_grad_eager(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """(summed CE, d CE_sum / d logits) of one chunk of low-precision logits (n, V); softmax in fp32.

    The gradient softmax - onehot is left unnormalised (entries in [-1, 1]): dividing by the token count
    here would push most of an fp16 gradient into subnormals; the backward applies the scale in fp32.
    """
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    loss = (lse - lf.gather(1, y[:, None]).squeeze(1)).sum()
    g = lf.sub_(lse[:, None]).exp_()                                   # softmax, in place of the fp32 copy
    g.scatter_add_(1, y[:, None], g.new_full((y.shape[0], 1), -1.0))   # minus the one-hot target
    return loss, g.to(logits.dtype)


def _ce_grad_pointwise(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """_ce_grad_eager's maths written for Inductor: the one-hot is a comparison, not an indexed write.

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


_ce_grad_compiled: Any = None  # torch.compile(_ce_grad_pointwise), built on the first CUDA call


def _ce_grad(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """On CUDA, the softmax/gradient pass fused by Triton: it reads the logits twice and writes the
    gradient once (~6 bytes a logit) where the eager ops move ~40; at micro-batch 32 that pass is 1.6 G
    logits a step. Falls back to eager where Triton cannot build (set SPECPROBE_FUSED_CE=0 to force)."""
    global _ce_grad_compiled
    if logits.device.type != "cuda" or os.environ.get("SPECPROBE_FUSED_CE", "1") == "0":
        return _ce_grad_eager(logits, y)
    if _ce_grad_compiled is None:
        try:
            fn = torch.compile(_ce_grad_pointwise, dynamic=False)
            fn(logits[:1], y[:1])  # build it now, so a Triton failure falls back here and not mid-run
            _ce_grad_compiled = fn
        except Exception as e:  # noqa: BLE001 - any compiler failure: the eager path is correct, only slower
            print(f"fused cross-entropy unavailable ({type(e).__name__}: {e}); using eager ops", flush=True)
            _ce_grad_compiled = _ce_grad_eager
    return _ce_grad_compiled(logits, y)


_addmm_fp32_ok: bool | None = None  # does this build's CUDA addmm take bf16/fp16 inputs into an fp32 out?


def _accumulate_mm(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc (fp32) += a @ b for low-precision a, b. On CUDA one GEMM does it (cuBLAS with an fp32 C and
    beta = 1: `addmm(..., out_dtype=float32)`, torch >= 2.9) instead of a low-precision product followed
    by a separate fp32 add over acc (at vocab 49152, 113 MB read and written again per loss chunk).
    Its first use is checked against the two-step sum, so a build that lacks it, or aliases `out` and
    `input` wrongly, falls back (with a line saying so) instead of training on a wrong gradient."""
    global _addmm_fp32_ok
    if acc.device.type != "cuda" or a.dtype == acc.dtype or _addmm_fp32_ok is False:
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
            print(f"addmm into fp32 {why}; adding separately", flush=True)
        acc.copy_(ref)


class LinearCrossEntropy(torch.autograd.Function):
    """Mean CE of (h @ weight.T) against y, loss_chunk_rows() rows of logits at a time, gradients included.

    The forward computes each chunk's gradients (d/dh, d/dweight) right after its loss, while its logits
    are at hand, and keeps only those (N x d and V x d): no (N, V) tensor outlives its chunk, and the
    logits matmul is not recomputed in the backward as a checkpointed chunk would (that recompute is
    2*V*d FLOP a token, ~7 % of the frozen model's step). Matmuls run in the autocast dtype (bf16/fp16)
    with fp32 accumulation of the weight gradient; the softmax runs in fp32.
    """

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, y: Tensor) -> Tensor:
        dev = h.device.type
        cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with torch.autocast(dev, enabled=False):
            hc, wc = h.to(cdt), weight.to(cdt)
            n = h.shape[0]
            rows = loss_chunk_rows(n)
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            grad_h = torch.empty(h.shape, dtype=torch.float32, device=h.device) if need_h else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if need_w else None
            for i in range(0, n, rows):
                hs, ys = hc[i:i + rows], y[i:i + rows]
                loss, g = _ce_grad(hs @ wc.t(), ys)
                total += loss
                if need_h:
                    grad_h[i:i + rows] = g @ wc          # (rows, d), widened to fp32 on the copy
                if need_w:
                    _accumulate_mm(grad_w, g.t(), hs)    # (V, d): fp32 sum of the chunks' products
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
        return gh, gw, None


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig, attn: str = "sdpa", grad_ckpt: bool = False):
        super().__init__()
        self.cfg, self.grad_ckpt = cfg, grad_ckpt
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, attn) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        # Not persistent: derived from the config, so they stay out of checkpoints and out of HF's names.
        cos, sin = rope_cos_sin(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=INIT_STD)

    def hidden(self, idx: Tensor) -> Tensor:
        """idx (B, T) int64 -> the final-norm hidden states (B, T, d) that the tied head turns into logits."""
        b, t = idx.shape
        if t > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {t} exceeds max_seq_len {self.cfg.max_seq_len}")
        x = self.embed_tokens(idx)                                                     # (B, T, d)
        dev = x.device.type
        if BF16_RESIDUAL and torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) == torch.bfloat16:
            x = x.to(torch.bfloat16)
        cos, sin = self.rope_cos[:t].to(x.dtype), self.rope_sin[:t].to(x.dtype)
        gqa = sdpa_gqa(x.device)
        for block in self.layers:
            if self.grad_ckpt and torch.is_grad_enabled():
                x = checkpoint(block, x, cos, sin, gqa, use_reentrant=False)
            else:
                x = block(x, cos, sin, gqa)
        return self.norm(x)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]:
        """idx (B, T) int64 -> (logits (B, T, V), None), or with targets (B, T) -> (None, mean CE loss)."""
        x = self.hidden(idx)
        if targets is None:
            return F.linear(x, self.embed_tokens.weight), None                        # (B, T, V)
        b, t = idx.shape
        return None, self.chunked_loss(x.reshape(b * t, -1), targets.reshape(b * t))

    def compile_blocks(self, **kwargs: Any) -> None:
        """Regional compilation: torch.compile each block (and the final norm) in place.

        The 22 blocks share one code object and dynamo treats their parameters as inputs, so ONE graph is
        traced and built and then reused by every block: compile takes seconds instead of the minute a
        whole-model torch.compile spends inlining 22 copies, it fuses the same things (RMSNorm, RoPE,
        SwiGLU, the residual adds), and the parameter names stay those of the plain module (no
        `_orig_mod.` prefix), so checkpoints and DDP see an unchanged model.
        """
        # Each block is a separate module instance; allow one cache entry per block in case guards on
        # module identity are ever needed (the default limit of 8 would silently fall back to eager).
        _compile_setup(recompile_limit=2 * self.cfg.n_layer + 8)
        for block in self.layers:
            block.compile(**kwargs)
        self.norm.compile(**kwargs)

    def compile_model(self, tune: bool = True, combo: bool | None = None, graphs: bool = False,
                      **kwargs: Any) -> None:
        """Whole-model compilation in place (`nn.Module.compile`): the embedding, the 22 blocks and the
        final norm as one Inductor graph; the loss stays outside it (chunked_loss is compiler-disabled).

        Against compile_blocks() it fuses across block boundaries and issues fewer launches, and with
        `tune` Inductor's coordinate-descent search times each Triton kernel's launch config: on the H200
        +3.8 % tok/s together at micro-batch 32 (bench/RESULTS.md run 9) and +19 % in the 2-rank trainer at
        micro-batch 4 (run 11, launch-bound there), for a warm-up of 1-3 minutes in a fresh process
        (seconds once Inductor's on-disk cache holds the kernels). In place, so parameter
        names stay those of the plain module, as they do for compile_blocks().
        `combo` turns on Inductor's combo kernels (None: COMBO_KERNELS, off unless SPECPROBE_COMBO_KERNELS=1;
        see there why). TORCHINDUCTOR_COORDINATE_DESCENT_TUNING, when set, decides the tuning instead.
        `graphs` records the compiled forward and backward as CUDA graphs (mode "reduce-overhead": one
        replay instead of ~1,450 launches a micro-step). Under gradient accumulation the caller must then
        keep the gradients allocated (keep_grads_allocated()) and zero them in place, never set them to None.
        """
        from torch._inductor import config as inductor
        if tune and "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING" not in os.environ:
            inductor.coordinate_descent_tuning = True
        if COMBO_KERNELS if combo is None else combo:
            inductor.combo_kernels = True
        _compile_setup()    # one graph (and its no-grad twin for validation): dynamo's default limit fits
        self.compile(**({"mode": "reduce-overhead"} if graphs else {}), **kwargs)

    # Run eagerly even inside torch.compile(model): the chunk loop with its in-place accumulation is what
    # dynamo traces worst, and its hot part (_ce_grad) is compiled on its own. The trunk before it still
    # compiles as one graph and the graph break costs one launch boundary a micro-step.
    @torch.compiler.disable
    def chunked_loss(self, h: Tensor, y: Tensor) -> Tensor:
        """Mean CE over h (N, d) / y (N,); at most loss_chunk_rows(N) rows of logits exist at a time."""
        w = self.embed_tokens.weight
        if torch.is_grad_enabled() and (h.requires_grad or w.requires_grad):
            return LinearCrossEntropy.apply(h, w, y)
        total = h.new_zeros((), dtype=torch.float32)
        rows = loss_chunk_rows(h.shape[0])
        for i in range(0, h.shape[0], rows):
            total = total + _ce_sum(h[i:i + rows], w, y[i:i + rows])
        return total / y.numel()


def _compile_setup(recompile_limit: int = 0) -> None:
    """Global compiler settings both compile scopes need; read when each graph is built (lazily, at the
    first forward). recompile_limit raises dynamo's cache limit to at least that many entries."""
    from torch._dynamo import config as cfg
    from torch._functorch import config as partitioner
    if LEAN_ACTIVATIONS:
        partitioner.ban_recompute_materialized_backward = False   # see LEAN_ACTIVATIONS
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
    """Inductor's kernel settings as the next graph will be built with them, for the run's log: which of
    coordinate-descent tuning and combo kernels are on decides both the speed and how long the first step
    compiles (bench/RESULTS.md runs 18, 22, 25), and environment variables can change either."""
    from torch._inductor import config as inductor
    onoff = {True: "on", False: "off"}
    return (f"coordinate-descent tuning {onoff[bool(inductor.coordinate_descent_tuning)]}, "
            f"combo kernels {onoff[bool(inductor.combo_kernels)]}")


def _unwrap(model: nn.Module) -> nn.Module:
    """The Llama inside a DDP (`.module`) and/or torch.compile (`._orig_mod`) wrapper."""
    while True:
        if isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        else:
            return model


def count_params(model: nn.Module) -> int:
    """Unique parameters: `parameters()` yields a shared (tied) tensor once."""
    return sum(p.numel() for p in _unwrap(model).parameters())


def hf_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Weights under LlamaForCausalLM's names; the tied lm_head is left out, as HF itself saves it."""
    return {"model." + k: v for k, v in _unwrap(model).state_dict().items()}


def load_hf_state_dict(model: nn.Module, sd: dict[str, Tensor]) -> None:
    """Load HF-named weights; any missing or unexpected name is an error that lists them."""
    sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}  # tied: a stored copy of the embedding
    inner = _unwrap(model)
    want = set(inner.state_dict())
    got = {k.removeprefix("model."): v for k, v in sd.items() if k.startswith("model.")}
    stray = sorted(k for k in sd if not k.startswith("model.")) + sorted("model." + k for k in set(got) - want)
    missing = sorted("model." + k for k in want - set(got))
    if missing or stray:
        raise KeyError(f"state dict does not match the model: missing {missing[:8]}, unexpected {stray[:8]}")
    inner.load_state_dict(got, strict=True)


def save_pretrained(model: nn.Module, cfg: ModelConfig, out_dir: Path) -> dict[str, str]:
    """Write config.json + model.safetensors loadable by `LlamaForCausalLM.from_pretrained(out_dir)`."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu").contiguous() for k, v in hf_state_dict(model).items()}
    dtype = str(next(iter(sd.values())).dtype).removeprefix("torch.")
    (out_dir / "config.json").write_text(json.dumps(cfg.to_hf_config(dtype=dtype), indent=2) + "\n")
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})  # HF requires format=pt
    from trainer.store import sha256_file   # here, not at import: the model itself does no I/O
    return {name: sha256_file(out_dir / name) for name in ("config.json", "model.safetensors")}

