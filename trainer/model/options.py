"""Model options: the switches that choose the model's kernels and rounding, read once from the environment.

Each option has one environment variable. `python -m trainer.train` builds `ModelOptions.from_env()` in
main(), prints it as the `model options:` line, records it in RUN_JSON and trainer_state.json
(`model_options`) and passes it to the model and to the compile step; no module reads these variables at
import. An option marked `numerics` changes what is computed (where values are rounded), so a resume that
changes one is refused like a changed learning rate (`numerics` in the run config's hash). The others pick
kernels or memory strategies for the same maths, as `--compile` does, and may change across a resume.
Why each default is what it is, with the measurements: docs/performance.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping


class OptionError(ValueError):
    """An environment variable of a model option holds a value the option cannot take."""


def _option(env: str, default: Any, *, numerics: bool, doc: str) -> Any:
    return field(default=default, metadata={"env": env, "numerics": numerics, "doc": doc})


@dataclass(frozen=True)
class ModelOptions:
    bf16_residual: bool = _option(
        "SPECPROBE_BF16_RESIDUAL",
        True,
        numerics=True,
        doc="under bf16 autocast, carry the residual stream in bf16 (half the bytes of every norm, residual "
        "add and saved activation); fp16 keeps fp32, whose range fp16 could overflow",
    )
    fp32_wgrad: bool = _option(
        "SPECPROBE_FP32_WGRAD",
        True,
        numerics=True,
        doc="the projections' weight gradients written in fp32 by their GEMMs (no bf16 rounding of dW, no "
        "cast kernel per weight); 0 = nn.Linear's backward",
    )
    addmm_fp32: bool = _option(
        "SPECPROBE_ADDMM_FP32",
        True,
        numerics=True,
        doc="on cuda, the loss's weight gradient accumulated into fp32 by one addmm per chunk (checked "
        "against the two-step sum at first use); 0 = a low-precision product, then an fp32 add",
    )
    sdpa_gqa: bool | None = _option(
        "SPECPROBE_SDPA_GQA",
        None,
        numerics=False,
        doc="sdpa reads each K/V head for its query heads (enable_gqa) instead of expanding K/V first; "
        "auto (unset) = on for cuda capability >= 8.0, off below (the T4's kernel has no GQA) and on cpu",
    )
    loss_chunk_rows: int = _option(
        "SPECPROBE_LOSS_CHUNK_ROWS",
        0,
        numerics=False,
        doc="rows of logits the loss holds at a time; 0 = eight chunks per micro-batch, clamped to [512, 4096] rows",
    )
    fused_ce: bool = _option(
        "SPECPROBE_FUSED_CE",
        True,
        numerics=False,
        doc="on cuda, the loss's softmax-minus-one-hot pass as one compiled Triton kernel; 0 = eager ops",
    )
    lean_activations: bool = _option(
        "SPECPROBE_LEAN_ACTIVATIONS",
        False,
        numerics=False,
        doc="compiled graphs recompute in the backward the pointwise inputs of its matmuls instead of "
        "saving them: less memory, a little slower",
    )
    combo_kernels: bool = _option(
        "SPECPROBE_COMBO_KERNELS",
        False,
        numerics=False,
        doc="Inductor's combo kernels in the whole-model compile; with Inductor's kernel tuning their "
        "first compile can take many minutes",
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "loss_chunk_rows":
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            elif f.name == "sdpa_gqa":
                ok = value is None or isinstance(value, bool)
            else:
                ok = isinstance(value, bool)
            if not ok:
                raise OptionError(f"model option {f.name}={value!r}: {_expected(f)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "ModelOptions":
        """The options the environment sets; an unset or empty variable keeps the default. OptionError
        naming the variable for a value the option cannot take."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(f.metadata["env"], "").strip()
            if raw:
                values[f.name] = _parse(f, raw)
        return cls(**values)

    def resolved(self, device_type: str, capability: tuple[int, int] | None) -> "ModelOptions":
        """These options with every `auto` decided for this device, as the run will use them."""
        if self.sdpa_gqa is not None:
            return self
        return dataclasses.replace(self, sdpa_gqa=device_type == "cuda" and (capability or (0, 0)) >= (8, 0))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def numerics(self) -> dict[str, Any]:
        """The options that change what is computed: what a resume must not change."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["numerics"]}

    def line(self) -> str:
        """The `model options:` log line: each option as name=value (on/off, auto for an undecided one)."""

        def show(name: str, value: Any) -> str:
            if value is None or (name == "loss_chunk_rows" and value == 0):
                return "auto"
            return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)

        return "model options: " + " ".join(f"{k}={show(k, v)}" for k, v in self.as_dict().items())


def env_names() -> dict[str, str]:
    """{option name: its environment variable}."""
    return {f.name: f.metadata["env"] for f in dataclasses.fields(ModelOptions)}


def _expected(f: dataclasses.Field) -> str:
    if f.name == "loss_chunk_rows":
        return "a whole number of rows >= 0 (0 = the automatic rule)"
    if f.name == "sdpa_gqa":
        return "1 (on) or 0 (off); unset = auto"
    return f"1 (on) or 0 (off); unset = {'on' if f.default else 'off'}"


def _parse(f: dataclasses.Field, raw: str) -> Any:
    env = f.metadata["env"]
    if f.name == "loss_chunk_rows":
        if raw.isascii() and raw.isdigit():
            return int(raw)
    elif raw in ("1", "0"):
        return raw == "1"
    raise OptionError(f"{env}={raw!r}: {_expected(f)}")
