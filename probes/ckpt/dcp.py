"""A torch.distributed.checkpoint folder read in one process, without trusting a pickle.

torch reads a DCP ``.metadata`` with ``pickle.load`` and its non-tensor items with ``torch.load(weights_only=False)``.
Here the metadata goes through an unpickler that allows only DCP's metadata classes and the torch types they hold,
and the non-tensor items through ``torch.load(weights_only=True)``; tensors are read by DCP's own file reader, which
already uses ``weights_only=True``. With ``trust_pickle`` a refused metadata is read with plain pickle instead.

The top-level keys of the saved state become the groups: ``model``; ``optim``/``optimizer``/``optimizers`` ->
optimizer; ``scheduler``/``lr_scheduler``/``schedulers`` -> scheduler; ``rng``/``rng_state``/``rngs`` -> rng; any
other key -> trainer_state, under its own name.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch

from probes.ckpt.compare import Loaded, flatten

_GROUP_OF = {
    "model": "model",
    "optim": "optimizer",
    "optimizer": "optimizer",
    "optimizers": "optimizer",
    "scheduler": "scheduler",
    "lr_scheduler": "scheduler",
    "schedulers": "scheduler",
    "rng": "rng",
    "rng_state": "rng",
    "rngs": "rng",
}
_PLAIN = {
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
}


class MetadataUnpickler(pickle.Unpickler):
    """Only what a DCP ``.metadata`` holds: the classes of torch.distributed.checkpoint.metadata, torch dtypes and
    sizes, paths. Anything else is refused, naming it."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module == "torch.distributed.checkpoint.metadata":
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not a DCP metadata type")


def _reader(root: Path, trust_pickle: bool, unsafe: list[str]) -> Any:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            data = (root / ".metadata").read_bytes()
            try:
                metadata = MetadataUnpickler(io.BytesIO(data)).load()
            except pickle.UnpicklingError as exc:
                if not trust_pickle:
                    raise _Unsafe(f"{root / '.metadata'}: {exc}; pass trust_pickle to read it with pickle") from None
                unsafe.append(str(root / ".metadata"))
                metadata = pickle.loads(data)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(root))


def _planner() -> Any:
    from torch.distributed.checkpoint import default_planner
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    set_element = default_planner.set_element  # the helper the planner itself uses, wherever torch keeps it

    class SafePlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafePlanner()


class _Unsafe(Exception):
    pass


def read_state(root: Path, trust_pickle: bool, unsafe: list[str]) -> dict[str, Any]:
    """The whole saved state of DCP folder ``root`` as nested dicts, in this one process."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=_reader(root, trust_pickle, unsafe), planner=_planner(), no_dist=True)
    return state


def _shards(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("*.distcp"))


def load_dcp(root: Path, trust_pickle: bool) -> Loaded:
    loaded = Loaded("dcp", str(root))
    files = [".metadata", *_shards(root)]
    if not (root / ".metadata").is_file():
        loaded.error = f"{root / '.metadata'} is missing: the save did not complete (DCP writes it last)"
        return loaded
    try:
        state = read_state(root, trust_pickle, loaded.unsafe)
    except _Unsafe as exc:
        message = str(exc)
    except Exception as exc:  # a shard cut short, a missing .distcp file, a metadata that lies
        message = f"{root}: the DCP checkpoint does not load: {type(exc).__name__}: {str(exc).strip()[:400]}"
    else:
        for key, value in state.items():
            group = _GROUP_OF.get(key, "trainer_state")
            part = loaded.part(group)
            part.files = files
            part.leaves.update(flatten(value, "" if group != "trainer_state" else key))
        return loaded
    loaded.error = message
    return loaded
