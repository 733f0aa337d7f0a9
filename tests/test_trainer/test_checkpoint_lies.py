"""A checkpoint whose files lie is refused on every rank with exit 3, naming the file, never a traceback.

Each store is a copy of the uninterrupted run's, without its pointer (the resume recovers ckpt/checkpoint-6,
the horizon's, and loads it to finish the final push). One file of checkpoint 6 is rewritten to lie, and
the hashes its trainer_state.json records are updated to match (resealed), so the hash checks pass and the
loader is reached: what is tested is the loader's own checking. Real torchrun, 2 gloo ranks.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import struct
from pathlib import Path
from typing import Callable

import pytest
import torch
from blobs import sha
from trainer_helpers import (
    BASELINE_STEPS,
    baseline,
    copy_repo,
    explain,
    open_repo,
    rank_exit_codes,
    run_trainer,
    torchrun_cmd,
    trainer_args,
)

from trainer.checkpoint import seal_trainer_state
from trainer.store.lease import LEASE_PATH

pytestmark = pytest.mark.slow

CKPT = "ckpt/checkpoint-6"


def lying_store(tmp_path_factory, tmp_path: Path, name: str, lie: Callable[[bytes], bytes]) -> tuple[Path, str]:
    """A copy of the baseline store where ``CKPT/name`` holds ``lie(its bytes)`` and trainer_state.json records
    the new hash (sealed again); no latest.json, so the resume recovers to CKPT."""
    base = baseline(tmp_path_factory)
    repo = copy_repo(base.repo, tmp_path)
    store = open_repo(repo)
    state = json.loads(store.read_bytes(f"{CKPT}/trainer_state.json"))
    state.pop("manifest_sha256")
    files = state.pop("files")
    out = tmp_path / "lie"
    out.mkdir()
    add = {}
    if name == "trainer_state.json":
        state = json.loads(lie(json.dumps(state).encode()))
    else:
        (out / name).write_bytes(lie(store.read_bytes(f"{CKPT}/{name}")))
        files[name] = sha((out / name).read_bytes())
        add[f"{CKPT}/{name}"] = out / name
    (out / "trainer_state.json").write_text(json.dumps(seal_trainer_state(state, files), indent=1))
    add[f"{CKPT}/trainer_state.json"] = out / "trainer_state.json"
    store.commit(add, delete=["latest.json"], message="a checkpoint that lies, with hashes to match")
    return base.mix, repo


def safetensors_header(raw: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def with_header(header: dict, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def first_tensor(header: dict) -> str:
    return sorted(k for k in header if k != "__metadata__")[0]


def offsets_past_the_end(raw: bytes) -> bytes:
    header, body = safetensors_header(raw)
    header[first_tensor(header)]["data_offsets"][1] = len(body) + 4096
    return with_header(header, body)


def header_length_2_62(raw: bytes) -> bytes:
    return struct.pack("<Q", 2**62) + raw[8:]


def dtype_in_the_header(raw: bytes) -> bytes:
    header, body = safetensors_header(raw)
    header[first_tensor(header)]["dtype"] = "F64"
    return with_header(header, body)


def tensor_dropped_from_the_header(raw: bytes) -> bytes:
    header, body = safetensors_header(raw)
    del header[first_tensor(header)]
    return with_header(header, body)


def a_tensor_stored_in_half_precision(raw: bytes) -> bytes:
    from safetensors.torch import load, save

    tensors = load(raw)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].half()
    return save(tensors, metadata={"format": "pt"})


def torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def a_pickled_object_weights_only_refuses(raw: bytes) -> bytes:
    return torch_bytes({"optimizer": argparse.Namespace(lr=1.0)})


def a_moment_of_the_wrong_shape(raw: bytes) -> bytes:
    opt = torch.load(io.BytesIO(raw), weights_only=True)
    opt["optimizer"]["state"][0]["exp_avg"] = torch.zeros(3)
    return torch_bytes(opt)


def no_scaler_state(raw: bytes) -> bytes:
    opt = torch.load(io.BytesIO(raw), weights_only=True)
    del opt["scaler"]
    return torch_bytes(opt)


def not_a_torch_file(raw: bytes) -> bytes:
    return b"PK\x03\x04 a zip that ends here"


def an_rng_state_without_numpy(raw: bytes) -> bytes:
    rngs = torch.load(io.BytesIO(raw), weights_only=True)
    for r in rngs:
        del r["numpy"]
    return torch_bytes(rngs)


def tokens_that_are_not_steps(raw: bytes) -> bytes:
    state = json.loads(raw)
    state["tokens_consumed"] += 1
    return json.dumps(state).encode()


@pytest.mark.parametrize(
    "name, lie, needle",
    [
        ("model.safetensors", offsets_past_the_end, "is not a readable safetensors file: SafetensorError"),
        ("model.safetensors", header_length_2_62, "is not a readable safetensors file: SafetensorError"),
        ("model.safetensors", dtype_in_the_header, "is not a readable safetensors file: SafetensorError"),
        ("model.safetensors", tensor_dropped_from_the_header, "is not a readable safetensors file: SafetensorError"),
        ("model.safetensors", a_tensor_stored_in_half_precision, "does not match the model's tensors: model."),
        ("optimizer.pt", a_pickled_object_weights_only_refuses, "does not load with torch.load(weights_only=True)"),
        ("optimizer.pt", a_moment_of_the_wrong_shape, "its state of parameter 0 must hold exp_avg and exp_avg_sq"),
        ("optimizer.pt", no_scaler_state, "must be a dict of optimizer, scheduler and scaler states"),
        ("rng.pt", not_a_torch_file, "does not load with torch.load(weights_only=True)"),
        ("rng.pt", an_rng_state_without_numpy, "the state of rank 0 must be a dict of torch, cuda, numpy and python"),
        ("trainer_state.json", tokens_that_are_not_steps, "tokens_consumed 1537 is not step 6 x 256 tokens per step"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_a_checkpoint_file_that_lies_is_refused_on_every_rank_naming_it(tmp_path, tmp_path_factory, name, lie, needle):
    mix, repo = lying_store(tmp_path_factory, tmp_path, name, lie)
    args = trainer_args(root=mix, out=tmp_path / "out", repo=repo, steps=BASELINE_STEPS, push_every=2)
    run = run_trainer(torchrun_cmd(args), timeout=120)
    codes = rank_exit_codes(run)
    assert set(codes) == {0, 1} and 3 in codes.values() and set(codes.values()) <= {3, -15}, explain(run)
    refusals = run.starting("refused: ")
    assert len(refusals) == 1, explain(run)
    assert f"checkpoint-6/{name}" in refusals[0] and needle in refusals[0], refusals[0]
    # torchrun prints its own traceback (ChildFailedError); none comes from the trainer's code.
    assert not re.search(r'File ".*/trainer/\w+\.py", line', run.text), explain(run)
    assert not run.starting("CKPT push"), explain(run)
    assert LEASE_PATH not in open_repo(repo).list_files()
