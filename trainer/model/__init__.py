"""The model: the Llama decoder with its kernels and options, the compile policy applied to it from outside,
and its Hugging Face form.

- ``model``    :class:`Llama`, :class:`ModelConfig`, ``GEOMETRIES``; pure: a config and options in, ``(logits, loss)`` out
- ``kernels``  the model's hand-written autograd kernels (fp32 weight gradients, the chunked linear + cross-entropy)
- ``options``  :class:`ModelOptions`: the kernel and rounding switches, one ``SPECPROBE_*`` variable each
- ``compile``  the compile policy applied to a built model: the whole model or each block, in place
- ``hf``       Hugging Face interop: transformers' ``LlamaForCausalLM`` config and weight names, ``save_pretrained``

The names below are the ones callers use. The kernels are not among them: only the model calls them (a test or
the bench that measures one names ``trainer.model.kernels``).
"""

from __future__ import annotations

from trainer.model.compile import compile_blocks, compile_model, inductor_kernel_settings, keep_grads_allocated
from trainer.model.hf import load_hf_state_dict, save_pretrained
from trainer.model.model import GEOMETRIES, Llama, ModelConfig, count_params, decay_groups
from trainer.model.options import ModelOptions, OptionError

__all__ = [
    "GEOMETRIES",
    "Llama",
    "ModelConfig",
    "ModelOptions",
    "OptionError",
    "compile_blocks",
    "compile_model",
    "count_params",
    "decay_groups",
    "inductor_kernel_settings",
    "keep_grads_allocated",
    "load_hf_state_dict",
    "save_pretrained",
]
