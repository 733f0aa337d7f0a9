"""A checkpoint folder loaded into a session, every file checked before any of it is believed.

The files' hashes match the pointer by then (trainer/ckpt/scan.py), but a hash proves only that the bytes
are the ones written, not that what wrote them told the truth: a safetensors header whose offsets run past
the end, a header length of 2^62, a dtype the model does not have, a dropped tensor; an optimizer.pt or
rng.pt that ``torch.load(weights_only=True)`` refuses, or that holds another structure than this trainer
saves. Each is :class:`Unloadable` naming the file (trainer/ckpt/resume.py refuses it on every rank, exit 3),
never a traceback at the first optimizer step. What is checked:

- ``trainer_state.json``: step and tokens integers that agree (tokens = step x tokens per step, step within
  the horizon), a config hash, a run config that is an object;
- ``model.safetensors``: a readable file whose tensors are exactly the model's, each of its dtype and shape;
- ``optimizer.pt``: the optimizer, scheduler and grad-scaler states: AdamW's two groups (trainer/model/model.py
  ``decay_groups``) with finite hyperparameters, a moment of each parameter's shape and dtype, the
  scheduler at this step;
- ``rng.pt``: one RNG state per rank, each of the shape ``rng_state()`` captures.
"""

from __future__ import annotations

import math
import stat
from pathlib import Path
from typing import Any

import torch

from trainer.ckpt.checkpointer import STATE_MAX_BYTES
from trainer.ckpt.rng import rng_state_problem
from trainer.dist import Dist
from trainer.model import decay_groups, load_hf_state_dict
from trainer.runconfig import RunIdentity, judge_config_change
from trainer.store import NotRegularFile, file_kind, open_regular
from trainer.store.fields import COUNT_MAX, FieldError, Fields, load_doc

__all__ = ["Unloadable", "load_checkpoint"]


class Unloadable(ValueError):
    """A checkpoint file this session must not load; the message names the file and what is wrong."""


def load_checkpoint(
    ckpt_dir: Path,
    model: torch.nn.Module,
    dist: Dist,
    *,
    identity: RunIdentity,
    tokens_per_step: int,
    total_steps: int,
    allowed: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Weights into `model`; the optimizer/scheduler/scaler state and this rank's RNG state read and checked.
    Unloadable (a ValueError) naming the file when any of them is not what this trainer saves."""
    for name in ("trainer_state.json", "model.safetensors", "optimizer.pt", "rng.pt"):
        problem = _not_a_file(ckpt_dir / name)
        if problem:
            raise Unloadable(problem)
    state = _trainer_state(ckpt_dir / "trainer_state.json", tokens_per_step, total_steps)
    changes: list[dict[str, Any]] = []
    if state["config_hash"] != identity.hash:
        changes = judge_config_change(state.get("run_config"), state["config_hash"], identity, allowed, str(ckpt_dir))
    _load_weights(ckpt_dir / "model.safetensors", model)
    opt_state = _torch_file(ckpt_dir / "optimizer.pt")
    problem = _optimizer_problem(opt_state, model, state["step"])
    if problem:
        raise Unloadable(f"{ckpt_dir / 'optimizer.pt'}: {problem}")
    rngs = _torch_file(ckpt_dir / "rng.pt")
    if not isinstance(rngs, list) or len(rngs) != dist.world_size:
        held = f"{len(rngs)} ranks" if isinstance(rngs, list) else f"a {type(rngs).__name__}"
        raise Unloadable(f"{ckpt_dir / 'rng.pt'} holds {held}, this run has {dist.world_size}")
    problem = rng_state_problem(rngs[dist.rank])
    if problem:
        raise Unloadable(f"{ckpt_dir / 'rng.pt'}: the state of rank {dist.rank} {problem}")
    return {
        "step": state["step"],
        "tokens": state["tokens_consumed"],
        "opt": opt_state,
        "rng": rngs[dist.rank],
        "config_changes": changes,
    }


def _not_a_file(path: Path) -> str | None:
    """Why ``path`` cannot be loaded as a checkpoint file, or None: missing, or not a regular file (a FIFO
    would block the loader until a writer comes, a character device never end)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return f"{path} is missing"
    return None if stat.S_ISREG(mode) else f"{path} is {file_kind(mode)}, not a regular file"


def _trainer_state(path: Path, tokens_per_step: int, total_steps: int) -> dict[str, Any]:
    try:
        with open_regular(path) as f:
            raw = f.read(STATE_MAX_BYTES + 1)
    except NotRegularFile as e:
        raise Unloadable(str(e)) from None
    try:
        doc = load_doc(raw, str(path), max_bytes=STATE_MAX_BYTES)
        f = Fields(doc, str(path))
        step = f.int("step", 0, total_steps)
        tokens = f.int("tokens_consumed", 0, COUNT_MAX)
        f.str("config_hash")
        f.obj("run_config", default=None)
    except FieldError as e:
        raise Unloadable(str(e)) from None
    if tokens != step * tokens_per_step:
        raise Unloadable(
            f"{path}: tokens_consumed {tokens} is not step {step} x {tokens_per_step} tokens per step: the "
            "checkpoint does not describe this run's steps"
        )
    return doc


def _load_weights(path: Path, model: torch.nn.Module) -> None:
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except Exception as e:  # SafetensorError (a lying header) and I/O errors alike
        raise Unloadable(f"{path} is not a readable safetensors file: {type(e).__name__}: {e}") from None
    try:
        load_hf_state_dict(model, tensors)
    except (KeyError, ValueError, RuntimeError) as e:
        raise Unloadable(f"{path}: {e.args[0] if e.args else e}") from None


def _torch_file(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError, a broken zip, I/O: any failure refuses the file
        raise Unloadable(
            f"{path} does not load with torch.load(weights_only=True): {type(e).__name__}: {str(e)[:500]}"
        ) from None


def _optimizer_problem(opt_state: Any, model: torch.nn.Module, step: int) -> str | None:
    """Why ``opt_state`` is not the {optimizer, scheduler, scaler} this trainer saves after ``step``."""
    if not isinstance(opt_state, dict) or set(opt_state) != {"optimizer", "scheduler", "scaler"}:
        return "must be a dict of optimizer, scheduler and scaler states"
    return (
        _adamw_problem(opt_state["optimizer"], decay_groups(model))
        or _scheduler_problem(opt_state["scheduler"], step)
        or _scaler_problem(opt_state["scaler"])
    )


def _finite(x: Any, lo: float, hi: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and lo <= x <= hi


def _adamw_problem(opt: Any, groups: tuple[list[torch.nn.Parameter], ...]) -> str | None:
    if (
        not isinstance(opt, dict)
        or not isinstance(opt.get("state"), dict)
        or not isinstance(opt.get("param_groups"), list)
    ):
        return "its optimizer state must hold 'state' and 'param_groups'"
    if len(opt["param_groups"]) != len(groups):
        return f"its optimizer has {len(opt['param_groups'])} parameter groups, this model {len(groups)}"
    params: list[torch.nn.Parameter] = []
    for i, (saved, mine) in enumerate(zip(opt["param_groups"], groups)):
        want = list(range(len(params), len(params) + len(mine)))
        params += mine
        if not isinstance(saved, dict) or saved.get("params") != want:
            return f"its parameter group {i} must number parameters {want[0]}..{want[-1]}"
        betas = saved.get("betas")
        if not (
            _finite(saved.get("lr"), 0, 1e3)
            and _finite(saved.get("eps"), 1e-30, 1)
            and _finite(saved.get("weight_decay"), 0, 1e3)
            and isinstance(betas, (tuple, list))
            and len(betas) == 2
            and all(_finite(b, 0, 0.999999999) for b in betas)
            and not any(saved.get(k) for k in ("amsgrad", "maximize", "differentiable"))
        ):
            return f"its parameter group {i} holds hyperparameters this trainer never sets: {_brief(saved)}"
    for index, moments in opt["state"].items():
        if not isinstance(index, int) or not 0 <= index < len(params):
            return f"its optimizer state names parameter {index!r}, which this model does not have"
        p = params[index]
        if not isinstance(moments, dict) or not all(
            isinstance(moments.get(k), torch.Tensor) and moments[k].shape == p.shape and moments[k].dtype == p.dtype
            for k in ("exp_avg", "exp_avg_sq")
        ):
            return f"its state of parameter {index} must hold exp_avg and exp_avg_sq of shape {list(p.shape)}"
        if not (isinstance(moments.get("step"), torch.Tensor) and moments["step"].numel() == 1):
            return f"its state of parameter {index} must hold a one-element step tensor"
    return None


def _scheduler_problem(sched: Any, step: int) -> str | None:
    if not isinstance(sched, dict) or sched.get("last_epoch") != step:
        got = sched.get("last_epoch") if isinstance(sched, dict) else type(sched).__name__
        return f"its scheduler state must be at step {step} (last_epoch), got {got!r}"
    lrs = [sched.get("base_lrs"), sched.get("_last_lr")]
    if not all(isinstance(v, list) and all(_finite(x, 0, 1e3) for x in v) for v in lrs):
        return "its scheduler state must hold finite base_lrs and _last_lr"
    return None


def _scaler_problem(scaler: Any) -> str | None:
    if scaler == {}:
        return None  # saved by a run without a grad scaler
    if not isinstance(scaler, dict) or not all(
        _finite(scaler.get(k), 0, 1e38) for k in ("scale", "growth_factor", "backoff_factor", "growth_interval")
    ):
        return f"its grad scaler state must be empty or hold finite scale, factors and interval: {_brief(scaler)}"
    return None


def _brief(x: Any) -> str:
    return repr({k: v for k, v in x.items() if k != "params"} if isinstance(x, dict) else x)[:300]
