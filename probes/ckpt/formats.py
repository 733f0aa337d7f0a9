"""Checkpoint formats: each loader reads the files its trainer writes into the groups of probes/ckpt/compare.py.

| format        | what it is                                   | model                | optimizer               | scheduler      | rng                      | trainer_state                                  |
|---------------|----------------------------------------------|----------------------|-------------------------|----------------|--------------------------|------------------------------------------------|
| `p4`          | the P4 trainer's checkpoint folder           | model.safetensors    | optimizer.pt optimizer, scaler | optimizer.pt scheduler | rng.pt (per rank) | trainer_state.json, config.json               |
| `hf_trainer`  | a transformers Trainer `checkpoint-N/`       | model*.safetensors / pytorch_model*.bin | optimizer.pt, scaler.pt | scheduler.pt | rng_state*.pth | trainer_state.json                  |
| `lightning`   | a Lightning `.ckpt` file                     | state_dict           | optimizer_states        | lr_schedulers  | (none: Lightning saves none) | epoch, global_step, loops, callbacks, ...  |
| `accelerate`  | an accelerate `save_state` folder            | model*.safetensors / pytorch_model*.bin | optimizer*.bin, scaler.pt | scheduler*.bin | random_states_*.pkl | custom_checkpoint_*.pkl, sampler*.bin |
| `dcp`         | a torch.distributed.checkpoint folder        | the `model` key      | `optim`/`optimizer`     | `scheduler`/`lr_scheduler` | `rng`          | every other key                                |

Every file is read with ``torch.load(weights_only=True)`` (numpy's array types allowed where the trainer stores its
numpy RNG state) or as safetensors/JSON. What cannot be read that way is refused with the reason, unless the caller
passes ``trust_pickle`` (then it is loaded with full pickle and listed in ``unsafe_loads``): a transformers
``training_args.bin`` (a pickled TrainingArguments, so it is not compared by default) and a Lightning checkpoint whose
hyperparameters are objects. A DCP ``.metadata`` is a plain pickle in torch; it is read here by an unpickler that
allows only DCP's own metadata classes (probes/ckpt/dcp.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from probes.ckpt import FORMATS
from probes.ckpt.compare import Loaded, Part, flatten


class FormatError(ValueError):
    """The path is not a checkpoint of the format asked for (or of any known one); the message says why."""


def numpy_globals() -> list[Any]:
    """The numpy types a pickled numpy RNG state needs (both numpy 1's and 2's module names)."""
    import numpy as np

    found: list[Any] = [np.ndarray, np.dtype]
    core = np._core if hasattr(np, "_core") else np.core  # numpy 2 renamed numpy.core (1.x pickles name it)
    found.append(core.multiarray._reconstruct)
    found += [type(np.dtype(t)) for t in ("uint32", "int64", "float64", "uint8", "int32", "float32")]
    return found


def _why(exc: BaseException) -> str:
    text = str(exc)
    for pattern in (r"Unsupported global: GLOBAL \S+", r"Unsupported operand \S+", r"Weights only load failed[^.\n]*"):
        found = re.search(pattern, text)
        if found:  # torch's message is a page of advice; the line that says what was refused is enough
            return found.group(0)[:300]
    return (text.strip().splitlines() or [type(exc).__name__])[0][:300]


class Reader:
    """Reads one checkpoint's files into a Loaded, each file's failure kept against the groups it feeds."""

    def __init__(self, loaded: Loaded, root: Path, trust_pickle: bool) -> None:
        self.loaded, self.root, self.trust = loaded, root, trust_pickle

    def read(self, name: str, groups: list[str], parse: Callable[[Path], Any]) -> Any | None:
        """The parsed file ``name`` (relative to the root), or None with the reason kept in each group."""
        path = self.root / name
        parts = [self.loaded.part(g) for g in groups]
        for part in parts:
            part.files.append(name)
        if not path.is_file():
            for part in parts:
                part.missing.append(name)
            return None
        try:
            return parse(path)
        except _Refused as exc:
            message = f"{path}: {exc}"
        except Exception as exc:  # a truncated zip, a lying safetensors header, bad JSON: named, never raised
            message = f"{path}: {type(exc).__name__}: {_why(exc)}"
        for part in parts:
            part.errors.append(message)
        return None

    def torch_file(self, path: Path, *, numpy: bool = False) -> Any:
        try:
            with torch.serialization.safe_globals(numpy_globals() if numpy else []):
                return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            if not _is_unpickling(exc):
                raise
            if not self.trust:
                raise _Refused(
                    f"torch.load(weights_only=True) refuses it ({_why(exc)}); pass trust_pickle to load it with "
                    "full pickle, only for a file you trust"
                ) from None
        self.loaded.unsafe.append(str(path))
        return torch.load(path, map_location="cpu", weights_only=False)

    def safetensors_file(self, path: Path) -> dict[str, Any]:
        from safetensors.torch import load_file

        return load_file(str(path))

    @staticmethod
    def json_file(path: Path) -> Any:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise _Refused(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


class _Refused(Exception):
    """A file read on purpose not to be loaded, or not parseable; the message is the whole reason."""


def _is_unpickling(exc: BaseException) -> bool:
    import pickle

    return isinstance(exc, pickle.UnpicklingError) or "weights_only" in str(exc)


def _into(part: Part, tree: Any, prefix: str = "") -> None:
    if tree is not None:
        part.leaves.update(flatten(tree, prefix))


# ---- the P4 trainer ------------------------------------------------------------------------------------------


def load_p4(root: Path, trust_pickle: bool) -> Loaded:
    loaded = Loaded(
        "p4",
        str(root),
        # The save's wall-clock time and the hashes of the other files (compared here by value, within tolerance).
        default_ignore=["trainer_state.time", "trainer_state.files.*", "trainer_state.manifest_sha256"],
    )
    r = Reader(loaded, root, trust_pickle)
    _into(loaded.part("model"), r.read("model.safetensors", ["model"], r.safetensors_file))
    opt = r.read("optimizer.pt", ["optimizer", "scheduler"], r.torch_file)
    if opt is not None:
        if not isinstance(opt, dict) or not {"optimizer", "scheduler"} <= set(opt):
            for g in ("optimizer", "scheduler"):
                loaded.part(g).errors.append(f"{root / 'optimizer.pt'}: not a dict of optimizer, scheduler and scaler")
        else:
            _into(loaded.part("optimizer"), opt["optimizer"])
            _into(loaded.part("optimizer"), opt.get("scaler"), "scaler")
            _into(loaded.part("scheduler"), opt["scheduler"])
    rngs = r.read("rng.pt", ["rng"], r.torch_file)
    if rngs is not None:
        _into(loaded.part("rng"), {f"rank{i}": s for i, s in enumerate(rngs)} if isinstance(rngs, list) else rngs)
    _into(loaded.part("trainer_state"), r.read("trainer_state.json", ["trainer_state"], r.json_file))
    _into(loaded.part("trainer_state"), r.read("config.json", ["trainer_state"], r.json_file), "config")
    return loaded


# ---- transformers.Trainer -------------------------------------------------------------------------------------


def _model_files(root: Path) -> list[str]:
    """The weight files: safetensors if any (sharded or not, adapters too), else pytorch_model*.bin."""
    names = sorted(p.name for p in root.iterdir() if p.is_file())
    st = [n for n in names if n.endswith(".safetensors") and (n.startswith("model") or n.startswith("adapter_model"))]
    return st or [n for n in names if re.fullmatch(r"(pytorch_model|model)(_\d+)?(-\d+-of-\d+)?\.bin", n)]


def _read_models(r: Reader, root: Path, names: list[str], prefix_each: bool) -> None:
    part = r.loaded.part("model")
    if not names:
        part.missing.append("model.safetensors")
        return
    for name in names:
        parse = r.safetensors_file if name.endswith(".safetensors") else r.torch_file
        # shards of one model share names; separate models (model_1.safetensors) keep theirs apart
        prefix = re.sub(r"(-\d+-of-\d+)?\.(safetensors|bin)$", "", name) if prefix_each else ""
        _into(part, r.read(name, ["model"], parse), prefix if prefix not in ("model", "pytorch_model") else "")


def load_hf_trainer(root: Path, trust_pickle: bool) -> Loaded:
    loaded = Loaded(
        "hf_trainer",
        str(root),
        # The control flags of the moment of the save (why it saved, e.g. should_training_stop at a stop); the
        # Trainer does not restore them unless restore_callback_states_from_checkpoint is set.
        default_ignore=["trainer_state.stateful_callbacks.TrainerControl.*"],
    )
    r = Reader(loaded, root, trust_pickle)
    _read_models(r, root, _model_files(root), prefix_each=False)
    _into(loaded.part("optimizer"), r.read("optimizer.pt", ["optimizer"], r.torch_file))
    if (root / "scaler.pt").is_file():
        _into(loaded.part("optimizer"), r.read("scaler.pt", ["optimizer"], r.torch_file), "scaler")
    _into(loaded.part("scheduler"), r.read("scheduler.pt", ["scheduler"], r.torch_file))
    per_rank = sorted(root.glob("rng_state_*.pth"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    for i, name in enumerate([p.name for p in per_rank] or ["rng_state.pth"]):
        state = r.read(name, ["rng"], lambda p: r.torch_file(p, numpy=True))
        _into(loaded.part("rng"), state, f"rank{i}")
    _into(loaded.part("trainer_state"), r.read("trainer_state.json", ["trainer_state"], r.json_file))
    if (root / "training_args.bin").is_file():
        if trust_pickle:
            args = r.read("training_args.bin", ["trainer_state"], r.torch_file)
            _into(loaded.part("trainer_state"), args.to_dict() if hasattr(args, "to_dict") else None, "training_args")
        else:
            loaded.notes.append(
                "training_args.bin: a pickled TrainingArguments that torch.load(weights_only=True) cannot read "
                "(compared with trust_pickle)"
            )
    return loaded


# ---- Lightning -------------------------------------------------------------------------------------------------

_LIGHTNING_PATHS = ("dirpath", "last_model_path", "best_model_path", "kth_best_model_path", "best_k_models*")


def load_lightning(path: Path, trust_pickle: bool) -> Loaded:
    loaded = Loaded(
        "lightning",
        str(path),
        # Where ModelCheckpoint writes (two runs write to two folders): paths, not training state.
        default_ignore=[f"trainer_state.callbacks.*.{k}" for k in _LIGHTNING_PATHS],
    )
    loaded.absent["rng"] = "a Lightning checkpoint holds no RNG state"
    r = Reader(loaded, path.parent, trust_pickle)
    doc = r.read(path.name, ["whole"], r.torch_file)
    whole = loaded.parts.pop("whole")
    if doc is None:
        loaded.error = "; ".join(whole.errors) or f"{path}: no such file"
        return loaded
    if not isinstance(doc, dict) or "state_dict" not in doc:
        loaded.error = f"{path}: not a Lightning checkpoint (no state_dict)"
        return loaded
    for g in ("model", "optimizer", "scheduler", "trainer_state"):
        loaded.part(g).files.append(path.name)
    rest = dict(doc)
    _into(loaded.part("model"), rest.pop("state_dict"))
    for key, group in (("optimizer_states", "optimizer"), ("lr_schedulers", "scheduler")):
        states = rest.pop(key, None)
        if states is None:
            loaded.part(group).missing.append(f"{path.name}[{key}]")
        else:
            _into(loaded.part(group), states[0] if isinstance(states, list) and len(states) == 1 else states)
    for key in ("MixedPrecision", "native_amp_scaling_state"):
        if key in rest:
            _into(loaded.part("optimizer"), rest.pop(key), "scaler")
    _into(loaded.part("trainer_state"), rest)
    return loaded


# ---- accelerate ------------------------------------------------------------------------------------------------


def _indexed(root: Path, pattern: str) -> list[str]:
    """Names matching ``pattern`` (a regex with one number group, or none), by that number."""
    found = [(p.name, re.fullmatch(pattern, p.name)) for p in root.iterdir() if p.is_file()]
    return [n for n, m in sorted(((n, m) for n, m in found if m), key=lambda x: int(x[1].group(1) or 0))]


def load_accelerate(root: Path, trust_pickle: bool) -> Loaded:
    loaded = Loaded("accelerate", str(root))
    r = Reader(loaded, root, trust_pickle)
    models = _model_files(root)
    _read_models(r, root, models, prefix_each=len({re.sub(r"-\d+-of-\d+", "", m) for m in models}) > 1)
    for group, pattern, plain in (
        ("optimizer", r"optimizer(?:_(\d+))?\.bin", "optimizer.bin"),
        ("scheduler", r"scheduler(?:_(\d+))?\.bin", "scheduler.bin"),
    ):
        names = _indexed(root, pattern) or [plain]
        for name in names:
            _into(loaded.part(group), r.read(name, [group], r.torch_file), "" if len(names) == 1 else name[:-4])
    if (root / "scaler.pt").is_file():
        _into(loaded.part("optimizer"), r.read("scaler.pt", ["optimizer"], r.torch_file), "scaler")
    for name in _indexed(root, r"random_states_(\d+)\.pkl") or ["random_states_0.pkl"]:
        state = r.read(name, ["rng"], lambda p: r.torch_file(p, numpy=True))
        _into(loaded.part("rng"), state, "rank" + re.sub(r"\D", "", name))
    for name in _indexed(root, r"custom_checkpoint_(\d+)\.pkl") + _indexed(
        root, r"(?:sampler|dl_state_dict)(?:_(\d+))?\.bin"
    ):
        _into(loaded.part("trainer_state"), r.read(name, ["trainer_state"], r.torch_file), name.rsplit(".", 1)[0])
    if "trainer_state" not in loaded.parts:
        loaded.absent["trainer_state"] = "no registered objects (custom_checkpoint_*.pkl) or sampler states saved"
    return loaded


# ---- detection -------------------------------------------------------------------------------------------------


def detect(path: Path) -> str:
    """The format of ``path``; FormatError naming what it holds when none fits."""
    if path.is_file():
        return "lightning"
    if not path.is_dir():
        raise FormatError(f"{path}: no such file or directory")
    names = {p.name for p in path.iterdir()}
    if ".metadata" in names or any(n.endswith(".distcp") for n in names):  # a torn save has shards only
        return "dcp"
    if "trainer_state.json" in names:
        try:
            state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            state = None
        if isinstance(state, dict) and "config_hash" in state and "tokens_consumed" in state:
            return "p4"
        if isinstance(state, dict) and "global_step" in state:
            return "hf_trainer"
        return "p4" if "rng.pt" in names else "hf_trainer"
    if any(re.fullmatch(r"random_states_\d+\.pkl|optimizer(_\d+)?\.bin|custom_checkpoint_\d+\.pkl", n) for n in names):
        return "accelerate"
    shown = ", ".join(sorted(names)[:12]) or "nothing"
    raise FormatError(
        f"{path}: cannot tell its checkpoint format (it holds {shown}); pass the format: {', '.join(FORMATS[1:])}"
    )


def load(path: Path, fmt: str, trust_pickle: bool = False) -> Loaded:
    """Checkpoint ``path`` read as ``fmt`` (a name of FORMATS other than auto)."""
    if fmt == "lightning":
        if not path.is_file():
            raise FormatError(f"{path}: a Lightning checkpoint is a file, and there is no such file")
        return load_lightning(path, trust_pickle)
    if not path.is_dir():
        raise FormatError(f"{path}: a {fmt} checkpoint is a folder, and there is no such folder")
    if fmt == "dcp":
        from probes.ckpt.dcp import load_dcp

        return load_dcp(path, trust_pickle)
    loaders = {"p4": load_p4, "hf_trainer": load_hf_trainer, "accelerate": load_accelerate}
    return loaders[fmt](path, trust_pickle)
