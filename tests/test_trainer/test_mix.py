"""trainer/data/mix.py: the synthetic mix (deterministic, well-formed, learnable) and build/publish/fetch."""

import json
import math
import sys

import numpy as np
import pytest
import torch

from trainer.data import mix as mixmod
from trainer.data.mix import DOC_LEN, EOS_ID, build_synthetic, main
from trainer.data.shards import load_mix, read_manifest, train_batch
from trainer.model.model import GEOMETRIES, Llama
from trainer.store.url import open_store

SMALL = dict(tokens=30_000, val_tokens=5_000, vocab=512, seed=7, shards=3)


def cli(*args: str) -> list[str]:
    return [str(a) for a in args]


def test_synthetic_build_is_deterministic_and_seed_dependent(tmp_path):
    a = build_synthetic(tmp_path / "a", **SMALL)
    b = build_synthetic(tmp_path / "b", **SMALL)
    c = build_synthetic(tmp_path / "c", **{**SMALL, "seed": 8})

    def hashes(m):
        return [e["sha256"] for e in [*m["shards"], m["val"]]]

    assert hashes(a) == hashes(b)
    assert (tmp_path / "a/train/shard-00002.bin").read_bytes() == (tmp_path / "b/train/shard-00002.bin").read_bytes()
    assert not set(hashes(a)) & set(hashes(c))
    assert len(set(hashes(a))) == 4  # every shard and the val split hold different documents


def test_synthetic_manifest_describes_the_files_and_how_they_were_built(tmp_path):
    m = build_synthetic(tmp_path, **SMALL)
    assert read_manifest(tmp_path) == m
    assert (m["dtype"], m["vocab_size"], m["n_shards"], m["total_tokens"]) == ("uint16", 512, 3, 30_000)
    assert [e["tokens"] for e in m["shards"]] == [10_000, 10_000, 10_000] and m["val"]["tokens"] == 5_000
    assert [e["path"] for e in m["shards"]] == [
        "train/shard-00000.bin",
        "train/shard-00001.bin",
        "train/shard-00002.bin",
    ]
    assert m["source"]["kind"] == "synthetic" and m["source"]["seed"] == 7 and m["source"]["eos_id"] == EOS_ID
    tokens = np.fromfile(tmp_path / "train/shard-00000.bin", dtype="<u2")
    assert tokens.max() < 512
    # documents are DOC_LEN tokens with EOS last, and EOS appears nowhere else
    assert np.array_equal(np.flatnonzero(tokens == EOS_ID), np.arange(DOC_LEN - 1, len(tokens), DOC_LEN))


def test_synthetic_language_is_far_more_predictable_than_uniform(tmp_path):
    build_synthetic(tmp_path, **{**SMALL, "tokens": 200_000, "shards": 1})
    t = np.fromfile(tmp_path / "train/shard-00000.bin", dtype="<u2").astype(np.int64)
    # empirical bigram conditional entropy: ~4 successors per token instead of 512
    pairs = np.bincount(t[:-1] * 512 + t[1:], minlength=512 * 512).reshape(512, 512).astype(float)
    p = pairs / pairs.sum()
    cond = p / np.maximum(p.sum(1, keepdims=True), 1e-12)
    h = -(p[p > 0] * np.log(cond[p > 0])).sum()
    assert h < 0.5 * math.log(512)


def test_large_vocab_uses_uint32(tmp_path):
    m = build_synthetic(tmp_path, tokens=3000, val_tokens=100, vocab=70_000, seed=0, shards=1)
    assert m["dtype"] == "uint32"
    assert np.fromfile(tmp_path / "train/shard-00000.bin", dtype="<u4").max() < 70_000


def test_rebuilding_into_the_same_directory_leaves_no_stale_shard(tmp_path):
    build_synthetic(tmp_path, **{**SMALL, "shards": 3})
    build_synthetic(tmp_path, **{**SMALL, "shards": 2})
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == ["shard-00000.bin", "shard-00001.bin"]


@pytest.fixture
def one_thread():
    # A model this small runs ~30x slower when its two intra-op threads fight other processes for 2 cores.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_tiny_model_learns_the_synthetic_mix(tmp_path, one_thread):
    build_synthetic(tmp_path, tokens=100_000, val_tokens=2_000, vocab=512, seed=0, shards=2)
    steps, batch, seq = 60, 8, 64
    mix = load_mix(tmp_path, seq_len=seq, model_vocab=512, need_samples=steps * batch)
    torch.manual_seed(0)
    model = Llama(GEOMETRIES["tiny"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for step in range(1, steps + 1):
        x, y = train_batch(mix, seed=0, step=step, rank=0, micro=0, world_size=1, accum=1, batch=batch)
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(512)) < 0.1
    assert sum(losses[-5:]) / 5 < 0.6 * losses[0]


def test_cli_build_prints_a_summary(tmp_path, capsys):
    assert (
        main(
            cli(
                "build",
                "--out",
                tmp_path,
                "--synthetic",
                "--tokens",
                5000,
                "--val-tokens",
                500,
                "--vocab",
                300,
                "--shards",
                2,
            )
        )
        == 0
    )
    assert f"built mix at {tmp_path} shards=2 total_tokens=5000 vocab=300 val_tokens=500" in capsys.readouterr().out


def test_cli_usage_errors_exit_2(tmp_path, capsys):
    assert main(cli("build", "--out", tmp_path, "--synthetic", "--tokens", 2, "--shards", 3)) == 2
    assert "need --tokens >= --shards" in capsys.readouterr().err
    assert main(cli("build", "--out", tmp_path, "--text", tmp_path / "a.txt")) == 2
    assert "needs --tokenizer" in capsys.readouterr().err
    assert main(cli("fetch", "--repo", "file:///x", "--out", tmp_path)) == 2
    assert "invalid store URL" in capsys.readouterr().err


def test_text_build_without_tokenizers_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails whether or not it is installed
    (tmp_path / "a.txt").write_text("hello")
    assert (
        main(cli("build", "--out", tmp_path / "m", "--text", tmp_path / "a.txt", "--tokenizer", tmp_path / "t.json"))
        == 2
    )
    assert "needs the `tokenizers` package: pip install tokenizers" in capsys.readouterr().err


def test_text_build_tokenises_documents_with_eos_between(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = ["<|endoftext|>", "[UNK]", "the", "cat", "sat", "on", "mat", "a", "dog"]
    tok = tokenizers.Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "one.txt").write_text("the cat sat on the mat")
    (tmp_path / "many.jsonl").write_text('{"text": "a dog sat"}\n{"text": "the dog"}\n')
    m = mixmod.build_text(
        tmp_path / "mix",
        files=[tmp_path / "one.txt", tmp_path / "many.jsonl"],
        tokenizer=tmp_path / "tokenizer.json",
        eos_token=None,
        val_tokens=3,
        shards=2,
    )
    ids = np.concatenate([np.fromfile(tmp_path / "mix" / e["path"], dtype="<u2") for e in [*m["shards"], m["val"]]])
    assert ids.tolist() == [2, 3, 4, 5, 2, 6, 0, 7, 8, 4, 0, 2, 8, 0]
    assert m["val"]["tokens"] == 3 and m["vocab_size"] == 9 and m["source"]["eos_token"] == "<|endoftext|>"


# ---------------------------------------------------------------------------------------- store side


def repo_url(tmp_path, name="mix"):
    return f"file://{tmp_path}/store/lab/{name}"


def test_publish_then_fetch_gives_a_verified_copy(tmp_path, capsys):
    build_synthetic(tmp_path / "src", **SMALL)
    url = repo_url(tmp_path)
    assert main(cli("publish", "--from", tmp_path / "src", "--repo", url)) == 0
    files = open_store(url).list_files()
    assert sorted(files) == [
        "manifest.json",
        "train/shard-00000.bin",
        "train/shard-00001.bin",
        "train/shard-00002.bin",
        "val/val-00000.bin",
    ]
    assert main(cli("fetch", "--repo", url, "--out", tmp_path / "dst")) == 0
    out = capsys.readouterr().out
    assert f"mix at {tmp_path / 'dst'} shards=3 total_tokens=30000" in out and "downloaded 5 of 5 files" in out
    for rel in files:
        assert (tmp_path / "dst" / rel).read_bytes() == (tmp_path / "src" / rel).read_bytes()


def test_fetch_into_a_root_that_already_matches_skips_the_download(tmp_path, capsys):
    build_synthetic(tmp_path / "src", **SMALL)
    url = repo_url(tmp_path)
    mixmod.publish(tmp_path / "src", url)
    assert main(cli("fetch", "--repo", url, "--out", tmp_path / "src")) == 0
    out = capsys.readouterr().out
    assert "already matches" in out and "download skipped" in out and "shards=3 total_tokens=30000" in out


def test_fetch_repairs_a_corrupted_local_shard_and_downloads_only_that(tmp_path, capsys):
    build_synthetic(tmp_path / "src", **SMALL)
    url = repo_url(tmp_path)
    mixmod.publish(tmp_path / "src", url)
    mixmod.fetch(url, tmp_path / "dst")
    bad = tmp_path / "dst/train/shard-00001.bin"
    bad.write_bytes(b"\x01\x00" + bad.read_bytes()[2:])
    capsys.readouterr()
    assert main(cli("fetch", "--repo", url, "--out", tmp_path / "dst")) == 0
    assert "downloaded 2 of 5 files" in capsys.readouterr().out  # the bad shard and the manifest
    assert bad.read_bytes() == (tmp_path / "src/train/shard-00001.bin").read_bytes()


def test_fetch_of_a_missing_repo_names_it_and_exits_2(tmp_path, capsys):
    url = repo_url(tmp_path, "nothing")
    assert main(cli("fetch", "--repo", url, "--out", tmp_path / "dst")) == 2
    err = capsys.readouterr().err
    assert url in err and "does not exist" in err and "--if-missing-build-synthetic" in err


def test_fetch_if_missing_builds_publishes_and_fetches_the_synthetic_mix(tmp_path, capsys):
    url = repo_url(tmp_path, "fresh")
    args = cli(
        "fetch",
        "--repo",
        url,
        "--out",
        tmp_path / "root",
        "--if-missing-build-synthetic",
        "--tokens",
        20_000,
        "--val-tokens",
        1_000,
        "--vocab",
        400,
        "--seed",
        3,
        "--shards",
        2,
    )
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (
        "missing: building a synthetic mix" in out and f"mix at {tmp_path / 'root'} shards=2 total_tokens=20000" in out
    )
    remote = json.loads(open_store(url).read_bytes("manifest.json"))
    assert remote == build_synthetic(tmp_path / "again", tokens=20_000, val_tokens=1_000, vocab=400, seed=3, shards=2)
    assert main(args) == 0  # second use: the repo exists now, nothing is rebuilt
    out = capsys.readouterr().out
    assert "building" not in out and "download skipped" in out


def test_republishing_a_different_mix_replaces_the_old_files_in_one_commit(tmp_path, monkeypatch):
    url = repo_url(tmp_path)
    build_synthetic(tmp_path / "v1", **{**SMALL, "shards": 3})
    mixmod.publish(tmp_path / "v1", url)
    build_synthetic(tmp_path / "v2", **{**SMALL, "shards": 2})
    store = open_store(url)
    commits, real_commit = [], store.commit

    def spy(add, delete=(), message=""):
        commits.append((sorted(add), list(delete)))
        return real_commit(add, delete, message)

    monkeypatch.setattr(store, "commit", spy)
    monkeypatch.setattr(mixmod, "_open", lambda _url: store)
    mixmod.publish(tmp_path / "v2", url)
    assert commits == [
        (
            ["manifest.json", "train/shard-00000.bin", "train/shard-00001.bin", "val/val-00000.bin"],
            ["train/shard-00002.bin"],
        )
    ]
    assert sorted(store.list_files()) == commits[0][0]


def test_fetch_refuses_a_repo_whose_shard_does_not_match_its_manifest(tmp_path, capsys):
    build_synthetic(tmp_path / "src", **SMALL)
    url = repo_url(tmp_path)
    mixmod.publish(tmp_path / "src", url)
    wrong = tmp_path / "wrong.bin"
    wrong.write_bytes((tmp_path / "src/train/shard-00000.bin").read_bytes())
    open_store(url).commit({"train/shard-00001.bin": wrong})  # same length, other bytes
    assert main(cli("fetch", "--repo", url, "--out", tmp_path / "dst")) == 1
    assert "train/shard-00001.bin: sha256" in capsys.readouterr().err


def test_publish_refuses_a_broken_local_mix_before_touching_the_store(tmp_path, capsys):
    build_synthetic(tmp_path / "src", **SMALL)
    (tmp_path / "src/val/val-00000.bin").write_bytes(b"\x00" * 10)
    url = repo_url(tmp_path)
    assert main(cli("publish", "--from", tmp_path / "src", "--repo", url)) == 1
    assert "val/val-00000.bin" in capsys.readouterr().err
    assert not open_store(url).exists()


def test_first_use_over_the_hub_protocol_builds_publishes_and_fetches(tmp_path, hub_server, monkeypatch, capsys):
    for k, v in hub_server.env().items():
        monkeypatch.setenv(k, v)
    args = ["--tokens", "20000", "--val-tokens", "1000", "--vocab", "400", "--seed", "3", "--shards", "2"]
    assert (
        main(
            ["fetch", "--repo", "hf://tester/mix", "--out", str(tmp_path / "a"), "--if-missing-build-synthetic", *args]
        )
        == 0
    )
    assert "missing: building a synthetic mix" in capsys.readouterr().out
    # a second machine: the repo exists now, so it downloads what the first one published
    assert main(["fetch", "--repo", "hf://tester/mix", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "downloaded 4 of 4 files" in out and f"mix at {tmp_path / 'b'} shards=2 total_tokens=20000" in out
    assert (tmp_path / "b/train/shard-00001.bin").read_bytes() == (tmp_path / "a/train/shard-00001.bin").read_bytes()
    assert main(["fetch", "--repo", "hf://tester/absent", "--out", str(tmp_path / "c")]) == 2
    assert "tester/absent does not exist" in capsys.readouterr().err
