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
