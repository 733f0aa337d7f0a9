"""The Llama-style decoder that specprobe trains, in plain PyTorch.

Pre-norm blocks of RMSNorm -> grouped-query attention with rotary positions -> RMSNorm -> SwiGLU MLP,
no biases, and the output projection tied to the token embedding. Module and parameter names mirror
Hugging Face's `LlamaForCausalLM` (`modeling_llama.py`), and RoPE uses its `rotate_half` layout, so the
weights load into transformers unchanged (trainer/model/hf.py maps the config and the names).

The model is pure: a config and `ModelOptions` in, `(logits, loss)` out; no file I/O, no output.
Compiling it is applied from outside (trainer/model/compile.py), its custom autograd kernels live in
trainer/model/kernels.py, and distributed training, precision and checkpoints in the trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from trainer.model.kernels import LinearCrossEntropy, ce_sum, linear, loss_chunk_rows
from trainer.model.options import ModelOptions

INIT_STD = 0.02  # Llama's initializer_range, used for every Linear and the embedding


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


GEOMETRIES: dict[str, ModelConfig] = {
    # The lab's frozen model: 22 x 3,540,096 block parameters + 49152 x 576 tied embedding + 576 final norm.
    "ounce100m-22l": ModelConfig(n_layer=22, d_model=576, d_mlp=1536, n_head=9, n_kv_head=3, vocab_size=49152),
    # CPU tests: every feature of the big one (GQA, tied embedding, several blocks) at 119,104 parameters.
    "tiny": ModelConfig(n_layer=2, d_model=64, d_mlp=160, n_head=4, n_kv_head=2, vocab_size=512),
}


def sdpa_gqa(device: torch.device, setting: bool | None = None) -> bool:
    """Whether attention on this device uses sdpa's enable_gqa: `setting` when given (ModelOptions.sdpa_gqa),
    else on for cuda capability >= 8.0, where flash and cuDNN attention take grouped heads, and off on
    Turing (T4), whose memory-efficient kernel has none (sdpa would fall back to the math kernel), and CPU."""
    if setting is not None:
        return setting
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


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


def rope_cos_sin(head_dim: int, max_seq_len: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin tables, (max_seq_len, head_dim), with each frequency repeated in both halves (HF layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # (T, hd/2)
    emb = torch.cat((angles, angles), dim=-1)  # (T, hd)
    return emb.cos(), emb.sin()


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x (B, h, T, hd); cos/sin (T, hd) broadcast over batch and heads
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, kvh, T, hd) -> (B, kvh*n_rep, T, hd): each KV head serves n_rep consecutive query heads."""
    if n_rep == 1:
        return x
    b, kvh, t, hd = x.shape
    return x[:, :, None].expand(b, kvh, n_rep, t, hd).reshape(b, kvh * n_rep, t, hd)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, attn: str, options: ModelOptions):
        super().__init__()
        if attn not in ("eager", "sdpa"):
            raise ValueError(f"attn must be 'eager' or 'sdpa', got {attn!r}")
        self.attn, self.n_head, self.n_kv_head, self.head_dim = attn, cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.fp32_wgrad = options.fp32_wgrad  # a plain bool: the compiler specialises on it
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, gqa: bool = False) -> Tensor:
        b, t, _ = x.shape
        q, k, v = (linear(x, p, self.fp32_wgrad) for p in (self.q_proj, self.k_proj, self.v_proj))
        q = q.reshape(b, t, self.n_head, self.head_dim).transpose(1, 2)  # (B, h, T, hd)
        k = k.reshape(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, kvh, T, hd)
        v = v.reshape(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, kvh, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.attn == "sdpa" and gqa and self.n_head != self.n_kv_head:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return linear(y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim), self.o_proj, self.fp32_wgrad)
        # Expanding K/V explicitly (rather than sdpa's enable_gqa) keeps the memory-efficient kernel
        # available on Turing (T4), where flash attention is not; the copies are 1/3 of the query size.
        k, v = repeat_kv(k, self.n_head // self.n_kv_head), repeat_kv(v, self.n_head // self.n_kv_head)
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, h, T, T)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~causal, float("-inf"))
            # softmax in fp32 like HF's eager path: fp16 scores over a long row lose the small weights
            y = F.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype) @ v  # (B, h, T, hd)
        return linear(y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim), self.o_proj, self.fp32_wgrad)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, options: ModelOptions):
        super().__init__()
        self.fp32_wgrad = options.fp32_wgrad
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.down_proj = nn.Linear(cfg.d_mlp, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = linear(x, self.gate_proj, self.fp32_wgrad), linear(x, self.up_proj, self.fp32_wgrad)
        return linear(F.silu(gate) * up, self.down_proj, self.fp32_wgrad)  # SwiGLU


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, attn: str, options: ModelOptions):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg, attn, options)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg, options)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, gqa: bool = False) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, gqa)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(
        self, cfg: ModelConfig, attn: str = "sdpa", grad_ckpt: bool = False, options: ModelOptions | None = None
    ):
        super().__init__()
        options = options if options is not None else ModelOptions()
        self.cfg, self.grad_ckpt, self.options = cfg, grad_ckpt, options
        # Plain attributes read by forward: the compiler specialises on their values.
        self.bf16_residual, self.sdpa_gqa = options.bf16_residual, options.sdpa_gqa
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, attn, options) for _ in range(cfg.n_layer))
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
        x = self.embed_tokens(idx)  # (B, T, d)
        dev = x.device.type
        # bf16 has fp32's range, so carrying the residual stream in it changes only rounding; fp16 (T4)
        # keeps the fp32 stream, whose range fp16 could overflow.
        if self.bf16_residual and torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) == torch.bfloat16:
            x = x.to(torch.bfloat16)
        cos, sin = self.rope_cos[:t].to(x.dtype), self.rope_sin[:t].to(x.dtype)
        gqa = sdpa_gqa(x.device, self.sdpa_gqa)
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
            return F.linear(x, self.embed_tokens.weight), None  # (B, T, V)
        b, t = idx.shape
        return None, self.chunked_loss(x.reshape(b * t, -1), targets.reshape(b * t))

    # Run eagerly even inside a compiled model: the chunk loop with its in-place accumulation is what
    # dynamo traces worst, and its hot part (the softmax pass) is compiled on its own. The trunk before it
    # still compiles as one graph and the graph break costs one launch boundary a micro-step. Marked so by
    # keep_loss_eager() when a model is compiled, not by a decorator here: torch.compiler.disable imports
    # dynamo, seconds of CPU at every start of every rank that an eager run never uses.
    def chunked_loss(self, h: Tensor, y: Tensor) -> Tensor:
        """Mean CE over h (N, d) / y (N,); at most loss_chunk_rows(N) rows of logits exist at a time."""
        w, opts = self.embed_tokens.weight, self.options
        rows = loss_chunk_rows(h.shape[0], opts.loss_chunk_rows)
        if torch.is_grad_enabled() and (h.requires_grad or w.requires_grad):
            return LinearCrossEntropy.apply(h, w, y, rows, opts.fused_ce, opts.addmm_fp32)
        total = h.new_zeros((), dtype=torch.float32)
        for i in range(0, h.shape[0], rows):
            total = total + ce_sum(h[i : i + rows], w, y[i : i + rows])
        return total / y.numel()


def keep_loss_eager() -> None:
    """torch.compiler.disable on Llama.chunked_loss (once, before a whole-model compile): see its comment."""
    if not getattr(Llama.chunked_loss, "_specprobe_eager", False):
        eager = torch.compiler.disable(Llama.chunked_loss)
        eager._specprobe_eager = True
        Llama.chunked_loss = eager  # type: ignore[method-assign]


def unwrap(model: nn.Module) -> nn.Module:
    """The Llama inside a DDP (`.module`) and/or torch.compile (`._orig_mod`) wrapper."""
    while True:
        if isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        else:
            return model


def decay_groups(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The trainable parameters as AdamW's two groups, nanoGPT-style: the matrices (weight decay) and the rest
    (norms: none). A checkpoint's optimizer state numbers the parameters in this order."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2]


def count_params(model: nn.Module) -> int:
    """Unique parameters: `parameters()` yields a shared (tied) tensor once."""
    return sum(p.numel() for p in unwrap(model).parameters())
