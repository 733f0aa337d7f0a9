"""Hugging Face interop: the model's config and weights as transformers' `LlamaForCausalLM` names them.

A checkpoint's `config.json` + `model.safetensors` written by `save_pretrained` load with
`LlamaForCausalLM.from_pretrained(dir)` and give the same logits (tests/test_trainer/test_model.py runs it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.nn as nn
from torch import Tensor

from trainer.model.model import INIT_STD, ModelConfig, unwrap
from trainer.store import sha256_file


def to_hf_config(cfg: ModelConfig, dtype: str = "float32") -> dict[str, Any]:
    """The `config.json` of an equivalent transformers `LlamaForCausalLM`."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_mlp,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
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


def from_hf_config(d: dict[str, Any]) -> ModelConfig:
    """Read a LlamaConfig dict; refuse one that describes a model trainer/model/model.py cannot represent."""
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
        cfg = ModelConfig(
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


def hf_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Weights under LlamaForCausalLM's names; the tied lm_head is left out, as HF itself saves it."""
    return {"model." + k: v for k, v in unwrap(model).state_dict().items()}


def load_hf_state_dict(model: nn.Module, sd: dict[str, Tensor]) -> None:
    """Load HF-named weights; any missing or unexpected name is an error that lists them, and so is a tensor
    of another dtype or shape than the model's (loading would convert a dtype silently)."""
    sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}  # tied: a stored copy of the embedding
    inner = unwrap(model)
    mine = inner.state_dict()
    got = {k.removeprefix("model."): v for k, v in sd.items() if k.startswith("model.")}
    stray = sorted(k for k in sd if not k.startswith("model.")) + sorted("model." + k for k in set(got) - set(mine))
    missing = sorted("model." + k for k in set(mine) - set(got))
    if missing or stray:
        raise KeyError(f"state dict does not match the model: missing {missing[:8]}, unexpected {stray[:8]}")
    unlike = [
        f"model.{k}: {str(v.dtype).removeprefix('torch.')}{list(v.shape)}, the model's "
        f"{str(mine[k].dtype).removeprefix('torch.')}{list(mine[k].shape)}"
        for k, v in sorted(got.items())
        if v.dtype != mine[k].dtype or v.shape != mine[k].shape
    ]
    if unlike:
        raise ValueError(f"state dict does not match the model's tensors: {'; '.join(unlike[:8])}")
    inner.load_state_dict(got, strict=True)


def save_pretrained(model: nn.Module, cfg: ModelConfig, out_dir: Path) -> dict[str, str]:
    """Write config.json + model.safetensors loadable by `LlamaForCausalLM.from_pretrained(out_dir)`;
    returns {file name: sha256}."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu").contiguous() for k, v in hf_state_dict(model).items()}
    dtype = str(next(iter(sd.values())).dtype).removeprefix("torch.")
    (out_dir / "config.json").write_text(json.dumps(to_hf_config(cfg, dtype=dtype), indent=2) + "\n")
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})  # HF requires format=pt
    return {name: sha256_file(out_dir / name) for name in ("config.json", "model.safetensors")}
