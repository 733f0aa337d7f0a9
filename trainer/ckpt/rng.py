"""Every random-number generator a rank uses (torch, CUDA, numpy, Python), captured for a checkpoint and
restored on resume: with batches a pure function of (seed, step, rank, micro), this is what makes a
resumed run bitwise identical to an uninterrupted one on CPU."""

from __future__ import annotations

import random
from typing import Any


def rng_state(device_type: str) -> dict[str, Any]:
    """This rank's RNG state, as tensors and plain ints so torch.load(weights_only=True) can read it."""
    import numpy as np
    import torch

    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if device_type == "cuda" else None,
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": {"version": py_state[0], "state": list(py_state[1]), "gauss": py_state[2]},
    }


def set_rng_state(state: dict[str, Any], device_type: str) -> None:
    """Restore what rng_state() captured."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    if device_type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))


def rng_state_problem(state: Any) -> str | None:
    """Why ``state`` is not what rng_state() captures (None when it is): set_rng_state would otherwise fail
    half-way, or restore a generator other than the one saved."""
    import torch

    def byte_tensor(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1

    if not isinstance(state, dict) or set(state) != {"torch", "cuda", "numpy", "python"}:
        return f"must be a dict of torch, cuda, numpy and python states, got {_shape_of(state)}"
    if not byte_tensor(state["torch"]) or not (state["cuda"] is None or byte_tensor(state["cuda"])):
        return "its torch and cuda states must be 1-D uint8 tensors"
    n, p = state["numpy"], state["python"]
    if not (
        isinstance(n, dict)
        and isinstance(n.get("keys"), torch.Tensor)
        and tuple(n["keys"].shape) == (624,)
        and _int_in(n.get("pos"), 0, 624)
        and _int_in(n.get("has_gauss"), 0, 1)
        and isinstance(n.get("cached_gaussian"), float)
    ):
        return "its numpy state must hold 624 MT19937 keys, pos, has_gauss and cached_gaussian"
    if not (
        isinstance(p, dict)
        and p.get("version") == 3
        and isinstance(p.get("state"), list)
        and len(p["state"]) == 625
        and all(_int_in(x, 0, 2**32) for x in p["state"])
        and (p.get("gauss") is None or isinstance(p.get("gauss"), float))
    ):
        return "its python state must be random.getstate()'s: version 3, 625 ints, gauss"
    return None


def _int_in(x: Any, lo: int, hi: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi


def _shape_of(x: Any) -> str:
    return f"a dict of {sorted(map(str, x))[:8]}" if isinstance(x, dict) else type(x).__name__
