"""trainer/data/shards.py: manifest validation (each error names its shard or field) and pure batch sampling."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.data.shards import DataError, load_mix, read_manifest, sample_indices, train_batch, val_batches

SEQ = 7  # windows of 8 tokens


def write_mix(root: Path, shard_tokens=(100, 60, 45), val_tokens=80, vocab=300, dtype="uint16") -> dict:
    """A mix whose train stream is 0, 1, 2, ... (mod vocab), so every token says where it came from."""
    np_dtype = np.dtype("<u2" if dtype == "uint16" else "<u4")
    entries, start = [], 0
    for i, n in enumerate(shard_tokens):
        entries.append(_write(root, f"train/shard-{i:05d}.bin", np.arange(start, start + n) % vocab, np_dtype))
        start += n
    val = _write(root, "val/val-00000.bin", (np.arange(val_tokens) * 7 + 3) % vocab, np_dtype)
    manifest = {
        "format": "specprobe-mix/1",
        "dtype": dtype,
        "vocab_size": vocab,
        "n_shards": len(entries),
        "total_tokens": sum(shard_tokens),
        "shards": entries,
        "val": val,
        "source": {"kind": "test"},
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def _write(root: Path, rel: str, values: np.ndarray, dtype: np.dtype) -> dict:
    data = values.astype(dtype).tobytes()
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)
    return {"path": rel, "tokens": len(values), "sha256": hashlib.sha256(data).hexdigest()}


def edit_manifest(root: Path, fn) -> None:
    m = json.loads((root / "manifest.json").read_text())
    fn(m)
    (root / "manifest.json").write_text(json.dumps(m))


@pytest.fixture
def mix(tmp_path):
    write_mix(tmp_path)
    return load_mix(tmp_path, seq_len=SEQ, model_vocab=512, need_samples=20)


def test_load_mix_reports_the_manifest_numbers_and_sample_count(mix):
    assert (mix.vocab_size, mix.total_tokens, mix.n_samples) == (300, 205, 205 // 8)
    assert mix.manifest["source"] == {"kind": "test"}


def test_windows_are_contiguous_slices_of_the_concatenated_shards_and_y_is_x_shifted(mix):
    x, y = train_batch(mix, seed=0, step=1, rank=0, micro=0, world_size=1, accum=1, batch=25)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (25, SEQ)
    w = mix.permutation(0)[:25]
    # stream token k is k % 300 here, so each row must be exactly 8*w, 8*w+1, ... (crossing shard edges at 100, 160)
    want = torch.from_numpy((w[:, None] * 8 + np.arange(8)) % 300)
    assert torch.equal(x, want[:, :-1]) and torch.equal(y, want[:, 1:])


def test_same_arguments_give_the_same_batch_even_from_a_freshly_loaded_mix(mix, tmp_path):
    again = load_mix(tmp_path, seq_len=SEQ, model_vocab=512, need_samples=20, verify=False)
    kw = dict(seed=11, step=2, rank=1, micro=1, world_size=2, accum=2, batch=2)
    a, b = train_batch(mix, **kw), train_batch(again, **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    other = train_batch(mix, **{**kw, "seed": 12})
    assert not torch.equal(a[0], other[0])


def test_every_step_rank_micro_reads_disjoint_samples_and_a_horizon_never_repeats_one():
    steps, world, accum, batch = 3, 2, 2, 2
    seen = []
    for step in range(1, steps + 1):
        for rank in range(world):
            for micro in range(accum):
                seen.extend(
                    sample_indices(step=step, rank=rank, micro=micro, world_size=world, accum=accum, batch=batch)
                )
    assert sorted(seen) == list(range(steps * world * accum * batch))


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(1, 5), world=st.integers(1, 4), accum=st.integers(1, 4), batch=st.integers(1, 5))
def test_any_run_shape_tiles_the_first_samples_exactly_once(steps, world, accum, batch):
    seen = np.concatenate(
        [
            sample_indices(step=s, rank=r, micro=m, world_size=world, accum=accum, batch=batch)
            for s in range(1, steps + 1)
            for r in range(world)
            for m in range(accum)
        ]
    )
    assert np.array_equal(np.sort(seen), np.arange(steps * world * accum * batch))


def test_no_window_is_read_twice_within_the_horizon(mix):
    rows = set()
    for step in (1, 2, 3):
        for rank in (0, 1):
            for micro in (0, 1):
                x, _ = train_batch(mix, seed=3, step=step, rank=rank, micro=micro, world_size=2, accum=2, batch=2)
                rows.update(tuple(r) for r in x.tolist())
    assert len(rows) == 24  # 3 steps x 2 ranks x 2 micros x 2 rows, all distinct windows


def test_reading_past_the_mix_is_an_error_not_a_silent_repeat(mix):
    with pytest.raises(DataError, match="step 13 .* needs sample 25, but the mix holds 25 samples"):
        train_batch(mix, seed=0, step=13, rank=0, micro=0, world_size=1, accum=1, batch=2)


def test_bad_positions_are_refused():
    with pytest.raises(ValueError, match="1-based"):
        sample_indices(step=0, rank=0, micro=0, world_size=1, accum=1, batch=1)
    with pytest.raises(ValueError, match="rank 2 outside world_size 2"):
        sample_indices(step=1, rank=2, micro=0, world_size=2, accum=1, batch=1)


def test_val_batches_split_the_val_windows_evenly_and_disjointly_over_ranks(mix):
    # 80 val tokens = 10 windows of 8; asking for 1000 tokens caps at 10 windows
    per_rank = [[x for x, _ in val_batches(mix, tokens=1000, batch=3, rank=r, world_size=2)] for r in (0, 1)]
    assert [[b.shape[0] for b in bs] for bs in per_rank] == [[3, 2], [3, 2]]
    rows = [tuple(r) for bs in per_rank for b in bs for r in b.tolist()]
    assert len(set(rows)) == 10
    first, y = next(val_batches(mix, tokens=1000, batch=1, rank=0, world_size=1))
    assert first.tolist() == [[(k * 7 + 3) % 300 for k in range(7)]] and y[0, -1].item() == (7 * 7 + 3) % 300


def test_val_batches_take_about_the_requested_tokens(mix):
    xs = [x for x, _ in val_batches(mix, tokens=21, batch=8, rank=0, world_size=1)]
    assert sum(x.numel() for x in xs) == 21  # 3 windows of 7 predicted tokens


def test_val_split_too_small_for_the_ranks_is_named(tmp_path):
    write_mix(tmp_path, val_tokens=10)
    m = load_mix(tmp_path, seq_len=SEQ, model_vocab=512, need_samples=1)
    with pytest.raises(DataError, match="val/val-00000.bin: 10 val tokens do not give each of 2 ranks"):
        list(val_batches(m, tokens=100, batch=1, rank=0, world_size=2))


def test_uint32_mixes_load(tmp_path):
    write_mix(tmp_path, vocab=70000, dtype="uint32")
    m = load_mix(tmp_path, seq_len=SEQ, model_vocab=70000, need_samples=1)
    x, _ = train_batch(m, seed=0, step=1, rank=0, micro=0, world_size=1, accum=1, batch=1)
    assert x.shape == (1, SEQ)


def test_hash_mismatch_names_the_shard(tmp_path):
    write_mix(tmp_path)
    p = tmp_path / "train/shard-00001.bin"
    p.write_bytes(b"\x00\x00" + p.read_bytes()[2:])
    with pytest.raises(DataError, match="train/shard-00001.bin: sha256 .* does not match manifest.json"):
        load_mix(tmp_path, seq_len=SEQ, model_vocab=512, need_samples=1)
    load_mix(tmp_path, seq_len=SEQ, model_vocab=512, need_samples=1, verify=False)  # only lengths without verify


def test_length_mismatch_names_the_shard_and_both_counts(tmp_path):
    write_mix(tmp_path)
    p = tmp_path / "train/shard-00002.bin"
    p.write_bytes(p.read_bytes()[:-4])
    with pytest.raises(DataError, match="train/shard-00002.bin: 86 bytes = 43 tokens of uint16, manifest.json says 45"):
        load_mix(tmp_path, seq_len=SEQ, model_vocab=512, need_samples=1, verify=False)


def test_missing_shard_file_is_named(tmp_path):
    write_mix(tmp_path)
    (tmp_path / "val/val-00000.bin").unlink()
    with pytest.raises(DataError, match="val/val-00000.bin: listed in manifest.json but missing"):
        load_mix(tmp_path, seq_len=SEQ, model_vocab=512, need_samples=1)


def test_token_id_beyond_the_model_vocab_names_the_shard_and_position(tmp_path):
    write_mix(tmp_path, vocab=300)  # manifest says 300, but the model is smaller than the data
    with pytest.raises(DataError, match="manifest.json vocab_size 300 exceeds the model's vocab 256"):
        load_mix(tmp_path, seq_len=SEQ, model_vocab=256, need_samples=1)
    edit_manifest(tmp_path, lambda m: m.update(vocab_size=90))  # a manifest that under-reports its ids
    with pytest.raises(
        DataError,
        match=r"train/shard-00000.bin: token id 99 \(first out-of-range id at position 90\) >= model vocab 90",
    ):
        load_mix(tmp_path, seq_len=SEQ, model_vocab=90, need_samples=1)


def test_too_few_samples_for_the_horizon_says_what_is_needed_and_what_there_is(tmp_path):
    write_mix(tmp_path)
    with pytest.raises(
        DataError,
        match=r"needs 30 samples of seq_len\+1=8 tokens = 240 tokens, but the 3 train "
        r"shards hold 205 tokens \(25 samples\)",
    ):
        load_mix(tmp_path, seq_len=SEQ, model_vocab=512, need_samples=30)


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda m: m.pop("total_tokens"), "manifest.json: missing field 'total_tokens'"),
        (lambda m: m.update(format="other/2"), "format is 'other/2'"),
        (lambda m: m.update(dtype="int8"), "dtype is 'int8'"),
        (lambda m: m.update(n_shards=4), "n_shards is 4 but shards lists 3"),
        (lambda m: m.update(total_tokens=999), "total_tokens is 999 but the shards sum to 205"),
        (lambda m: m["shards"][1].pop("sha256"), r"shards\[1\]: missing field 'sha256'"),
        (lambda m: m["shards"][2].update(tokens="45"), r"shards\[2\].tokens: expected int"),
        (lambda m: m["val"].update(path="../../etc/passwd"), "val.path '../../etc/passwd' must be a relative path"),
        (lambda m: m.update(vocab_size=70000), "vocab_size 70000 does not fit dtype uint16"),
    ],
)
def test_malformed_manifest_names_the_field(tmp_path, edit, match):
    write_mix(tmp_path)
    edit_manifest(tmp_path, edit)
    with pytest.raises(DataError, match=match):
        read_manifest(tmp_path)


def test_missing_or_unparsable_manifest_is_named(tmp_path):
    with pytest.raises(DataError, match="no manifest.json in the mix root"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="manifest.json: not valid JSON"):
        read_manifest(tmp_path)
