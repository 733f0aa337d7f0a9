"""A checkpoint whose files lie is refused naming the file, never a traceback.

What each lie meets is the loader's own checking (trainer/ckpt/load.py): the hash checks in front of it
are passed on purpose. Every lie is tried on the loader in this process, against checkpoint 4 of a one-process
session (the checks of a file do not depend on the rank count); one lie goes the whole way, under real torchrun
with 2 gloo ranks, through a store whose recorded hashes match it (resealed): exit 3 on every rank.
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
    ACCUM,
    BASELINE_STEPS,
    MICRO,
    SEQ_LEN,
    baseline,
    copy_repo,
    explain,
    open_repo,
    rank_exit_codes,
    run_trainer,
    segment_one_process,
    torchrun_cmd,
    trainer_args,
)

from trainer.ckpt.checkpointer import seal_trainer_state
from trainer.ckpt.load import Unloadable, load_checkpoint
from trainer.dist import Dist
from trainer.model.model import GEOMETRIES, Llama
from trainer.runconfig import RunIdentity
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


LIES = [
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
    ("trainer_state.json", tokens_that_are_not_steps, "tokens_consumed 513 is not step 4 x 128 tokens per step"),
]


@pytest.mark.parametrize("name, lie, needle", LIES, ids=lambda v: getattr(v, "__name__", None))
def test_the_loader_refuses_a_checkpoint_file_that_lies_naming_it(tmp_path, tmp_path_factory, name, lie, needle):
    """Checkpoint 4 of a one-process session, one file rewritten to lie, loaded as its resume would load it."""
    _mix, repo = segment_one_process(tmp_path_factory)
    store = open_repo(repo)
    ckpt = tmp_path / "checkpoint-4"
    ckpt.mkdir()
    for f in ("trainer_state.json", "model.safetensors", "optimizer.pt", "rng.pt"):
        raw = store.read_bytes(f"ckpt/checkpoint-4/{f}")
        (ckpt / f).write_bytes(lie(raw) if f == name else raw)
    state = json.loads(store.read_bytes("ckpt/checkpoint-4/trainer_state.json"))
    model = Llama(GEOMETRIES["tiny"], attn="eager")
    with pytest.raises(Unloadable) as refused:
        load_checkpoint(
            ckpt,
            model,
            Dist("cpu", {}),  # one process, no launcher: rank 0 of 1
            identity=RunIdentity(state["run_config"]),
            tokens_per_step=MICRO * ACCUM * SEQ_LEN,
            total_steps=BASELINE_STEPS,
        )
    message = str(refused.value)
    assert f"checkpoint-4/{name}" in message and needle in message, message


def test_a_checkpoint_file_that_lies_is_refused_on_every_rank_naming_it(tmp_path, tmp_path_factory):
    """The lie that gets furthest (a header safetensors accepts, a tensor of another dtype) through the whole
    resume: hashes that match, 2 ranks that refuse together, no trainer traceback, nothing pushed."""
    name, lie, needle = LIES[4]
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
