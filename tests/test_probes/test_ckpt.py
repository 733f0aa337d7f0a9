"""The checkpoint comparison on real checkpoints of each format: the drivers' (transformers, Lightning, accelerate,
DCP) and the P4 trainer's. An equal pair is equal; a perturbed weight, a missing optimizer state, another RNG state
and another scheduler step are each found and named; a bad or missing file is an error naming it, never a raise."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from probe_helpers import Run, copy_checkpoint
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.run.collectors import CollectorError, known_collectors
from engine.run.collectors import collect as engine_collect
from probes.ckpt import compare_paths
from probes.ckpt.__main__ import main as cli_main
from probes.ckpt.dcp import read_state

# ---- changing a checkpoint the way its own library writes it -------------------------------------------------


def bump_safetensors(path: Path, delta: float = 1e-3) -> str:
    """Add ``delta`` to element 0 of the file's first floating tensor; its name."""
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(path))
    name = next(n for n, t in tensors.items() if t.is_floating_point())
    tensors[name].view(-1)[0] += delta
    save_file(tensors, str(path), metadata=metadata)
    return name


def edit_torch(path: Path, change: Callable[[object], None]) -> None:
    doc = torch.load(path, weights_only=False)  # a file this test wrote itself
    change(doc)
    torch.save(doc, path)


def flip_byte(t: torch.Tensor) -> None:
    t[100] ^= 1


@dataclass
class Fmt:
    """One format: where its pair of checkpoints lies, and how to change each part of a copy."""

    name: str
    equal_pair: Callable[[], tuple[Path, Path]]
    groups: set[str]
    perturb: Callable[[Path], str]  # -> the model leaf changed
    drop_optimizer: Callable[[Path], None]
    optimizer_missing: list[str]  # what the document's optimizer.missing.a then says
    change_rng: Callable[[Path], None] | None
    change_scheduler: Callable[[Path], None]


EVERY_PART = {"model", "optimizer", "scheduler", "rng", "trainer_state"}


def _folder_of_files(
    name: str,
    equal_pair: Callable[[], tuple[Path, Path]],
    optimizer: str,
    change_rng: Callable[[Path], None],
    change_scheduler: Callable[[Path], None],
) -> Fmt:
    """A format that saves every part in a folder, a file each: the weights in model.safetensors, the optimizer
    state in the file `optimizer` (so a missing optimizer state is that file missing)."""
    return Fmt(
        name,
        equal_pair,
        EVERY_PART,
        lambda p: bump_safetensors(p / "model.safetensors"),
        lambda p: (p / optimizer).unlink(),
        [optimizer],
        change_rng,
        change_scheduler,
    )


def _next_epoch(state_in: Callable[[Any], dict] = lambda doc: doc) -> Callable[[Any], None]:
    """An edit of a loaded checkpoint document that moves its scheduler one step on; `state_in` finds the
    scheduler's state in the document (by default the document is that state)."""
    return lambda doc: state_in(doc).update(last_epoch=state_in(doc)["last_epoch"] + 1)


def _twice(runs: dict[str, Run], *checkpoint: str) -> Callable[[], tuple[Path, Path]]:
    """The same checkpoint of the reference run and of the reference run again: an equal pair."""
    return lambda: (runs["reference"].out.joinpath(*checkpoint), runs["reference_again"].out.joinpath(*checkpoint))


def _hf(runs: dict[str, Run]) -> Fmt:
    return _folder_of_files(
        "hf_trainer",
        lambda: (runs["default"].out / "checkpoint-20", runs["reference"].out / "checkpoint-20"),
        "optimizer.pt",
        lambda p: edit_torch(p / "rng_state.pth", lambda d: flip_byte(d["cpu"])),
        lambda p: edit_torch(p / "scheduler.pt", _next_epoch()),
    )


def _p4(store: Path) -> Fmt:
    return _folder_of_files(
        "p4",
        lambda: (store / "final", store / "ckpt" / "checkpoint-6"),
        "optimizer.pt",
        lambda p: edit_torch(p / "rng.pt", lambda d: flip_byte(d[0]["torch"])),
        lambda p: edit_torch(p / "optimizer.pt", _next_epoch(lambda d: d["scheduler"])),
    )


def _lightning(runs: dict[str, Run]) -> Fmt:
    def perturb(p: Path) -> str:
        edit_torch(p, lambda d: d["state_dict"]["model.net.0.weight"].view(-1).__setitem__(0, 5.0))
        return "model.net.0.weight"

    return Fmt(
        "lightning",
        _twice(runs, "checkpoints", "last.ckpt"),
        {"model", "optimizer", "scheduler", "trainer_state"},
        perturb,
        lambda p: edit_torch(p, lambda d: d.pop("optimizer_states")),
        ["last.ckpt[optimizer_states]"],
        None,  # Lightning saves no RNG state
        lambda p: edit_torch(p, _next_epoch(lambda d: d["lr_schedulers"][0])),
    )


def _accelerate(runs: dict[str, Run]) -> Fmt:
    return _folder_of_files(
        "accelerate",
        _twice(runs, "checkpoints", "checkpoint_4"),
        "optimizer.bin",
        lambda p: edit_torch(p / "random_states_0.pkl", lambda d: flip_byte(d["torch_manual_seed"])),
        lambda p: edit_torch(p / "scheduler.bin", _next_epoch()),
    )


def _dcp_edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(p: Path) -> None:
        import shutil

        import torch.distributed.checkpoint as dcp

        state = read_state(p, False, [])
        change(state)
        shutil.rmtree(p)
        dcp.save(state, checkpoint_id=str(p), no_dist=True)  # written again by DCP itself

    return edit


def _dcp(runs: dict[str, Run]) -> Fmt:
    def perturb(p: Path) -> str:
        _dcp_edit(lambda s: s["model"]["net.0.weight"].view(-1).__setitem__(0, 5.0))(p)
        return "net.0.weight"

    return Fmt(
        "dcp",
        lambda: (runs["default"].out / "ckpt" / "step-20", runs["reference"].out / "ckpt" / "step-20"),
        EVERY_PART,
        perturb,
        _dcp_edit(lambda s: s.pop("optim")),
        [],  # DCP has no file per part: the optimizer's names are all only in b
        _dcp_edit(lambda s: flip_byte(s["rng"]["rank0"])),
        _dcp_edit(_next_epoch(lambda s: s["scheduler"])),
    )


FORMATS = ("hf_trainer", "p4", "lightning", "accelerate", "dcp")


@pytest.fixture(scope="module")
def p4_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer_helpers import baseline, repo_dir

    return repo_dir(baseline(tmp_path_factory).repo)  # the trainer tests' own uninterrupted run, built once


@pytest.fixture(params=FORMATS)
def fmt(request: pytest.FixtureRequest) -> Fmt:
    name = request.param
    if name == "hf_trainer":
        return _hf(request.getfixturevalue("hf_runs"))
    if name == "p4":
        return _p4(request.getfixturevalue("p4_store"))
    if name == "lightning":
        return _lightning(request.getfixturevalue("lightning_runs"))
    if name == "accelerate":
        return _accelerate(request.getfixturevalue("accelerate_runs"))
    return _dcp(request.getfixturevalue("dcp_runs"))


def changed_copy(fmt: Fmt, tmp_path: Path, change: Callable[[Path], object]) -> tuple[object, dict]:
    a, b = fmt.equal_pair()
    copy = copy_checkpoint(a, tmp_path / "copy" / a.name)
    what = change(copy)
    return what, compare_paths(copy, b)


# ---- the tests -------------------------------------------------------------------------------------------------


def test_equal_pair_is_equal_in_every_group(fmt: Fmt) -> None:
    a, b = fmt.equal_pair()
    doc = compare_paths(a, b)
    assert doc["error"] is None and doc["format"] == fmt.name
    assert set(doc["groups"]) == fmt.groups
    assert doc["equal"] and doc["close"], doc["first_difference"]
    assert all(g["count"] > 0 and g["max_abs_diff"] == 0.0 for g in doc["groups"].values())
    assert json.loads(json.dumps(doc)) == doc  # plain JSON, as a collector's document must be
    # Each side's size is counted from its own tensors: the P4 trainer's tiny model holds 119,104 numbers.
    model = doc["groups"]["model"]
    assert model["numel"]["a"] == model["numel"]["b"] == {"p4": 119_104}.get(fmt.name, model["numel"]["b"]) > 0


def test_a_perturbed_weight_is_found_and_named(fmt: Fmt, tmp_path: Path) -> None:
    name, doc = changed_copy(fmt, tmp_path, fmt.perturb)
    model = doc["groups"]["model"]
    assert doc["differing_groups"] == ["model"] and not doc["close"]
    assert model["first_difference"]["name"] == name and model["first_not_close"]["name"] == name
    assert model["first_difference"]["index"] in ([0], [0, 0]) and model["n_differ"] == 1
    assert model["max_abs_diff"] > 0 and model["max_abs_diff_name"] == name
    assert doc["first_difference"]["group"] == "model"


def test_a_missing_optimizer_state_is_named(fmt: Fmt, tmp_path: Path) -> None:
    _, doc = changed_copy(fmt, tmp_path, fmt.drop_optimizer)
    opt = doc["groups"]["optimizer"]
    assert not opt["equal"] and not opt["close"] and not doc["close"]
    assert opt["missing"]["a"] == fmt.optimizer_missing
    if not fmt.optimizer_missing:  # a DCP checkpoint saved without its optimizer key
        assert opt["only_in_b"]["count"] > 0 and opt["count"] == 0
    assert doc["groups"]["model"]["equal"]


def test_a_different_rng_state_is_found(fmt: Fmt, tmp_path: Path) -> None:
    if fmt.change_rng is None:
        a, b = fmt.equal_pair()
        assert compare_paths(a, b)["absent_groups"] == {"rng": "a Lightning checkpoint holds no RNG state"}
        return
    _, doc = changed_copy(fmt, tmp_path, fmt.change_rng)
    rng = doc["groups"]["rng"]
    assert doc["differing_groups"] == ["rng"]
    assert rng["first_difference"]["index"] == [100] and rng["n_differ"] == 1
    assert abs(rng["first_difference"]["a"] - rng["first_difference"]["b"]) == 1


def test_a_different_scheduler_step_is_found(fmt: Fmt, tmp_path: Path) -> None:
    _, doc = changed_copy(fmt, tmp_path, fmt.change_scheduler)
    sched = doc["groups"]["scheduler"]
    assert doc["differing_groups"] == ["scheduler"]
    assert sched["first_difference"]["name"] == "last_epoch"
    assert sched["first_difference"]["a"] == sched["first_difference"]["b"] + 1


def test_auto_detects_each_format(fmt: Fmt) -> None:
    a, b = fmt.equal_pair()
    assert compare_paths(a, b, fmt="auto")["format"] == fmt.name
    assert compare_paths(a, b, fmt=fmt.name)["equal"]


# ---- tolerance, ignore, non-finite ------------------------------------------------------------------------------


def test_tolerance_and_ignore_decide_close_but_never_equal(hf_runs: dict[str, Run], tmp_path: Path) -> None:
    ref = hf_runs["reference"].out / "checkpoint-20"
    copy = copy_checkpoint(ref, tmp_path / "c")
    name = bump_safetensors(copy / "model.safetensors", delta=1e-6)
    exact = compare_paths(copy, ref)
    loose = compare_paths(copy, ref, atol=1e-5)
    ignoring = compare_paths(copy, ref, ignore=[f"model.{name}"])
    assert not exact["close"] and not exact["equal"]
    assert loose["close"] and not loose["equal"] and loose["groups"]["model"]["first_not_close"] is None
    assert loose["groups"]["model"]["first_difference"]["name"] == name
    assert (
        ignoring["equal"] and ignoring["groups"]["model"]["n_ignored"] == 1 and ignoring["ignore"] == [f"model.{name}"]
    )
    whole = compare_paths(copy, ref, ignore=["model"])
    assert whole["ignored_groups"] == ["model"] and "model" not in whole["groups"] and whole["equal"]


def test_nan_is_never_equal_or_close_even_to_nan(hf_runs: dict[str, Run], tmp_path: Path) -> None:
    ref = hf_runs["reference"].out / "checkpoint-20"
    sides = [copy_checkpoint(ref, tmp_path / side) for side in "ab"]
    for side in sides:
        tensors = load_file(str(side / "model.safetensors"))
        tensors["net.0.bias"][3] = float("nan")
        save_file(tensors, str(side / "model.safetensors"))
    doc = compare_paths(*sides, rtol=1.0, atol=1.0)
    model = doc["groups"]["model"]
    assert not doc["close"] and not doc["equal"]
    assert model["n_nonfinite"] == 1 and model["first_not_close"]["index"] == [3]


def test_the_format_default_ignores_are_listed_and_can_be_turned_off(hf_runs: dict[str, Run]) -> None:
    at_stop = hf_runs["default"].out / "checkpoint-10"
    ref = hf_runs["reference"].out / "checkpoint-10"
    doc = compare_paths(at_stop, ref)
    assert doc["equal"] and doc["default_ignore"] == ["trainer_state.stateful_callbacks.TrainerControl.*"]
    strict = compare_paths(at_stop, ref, default_ignore=False)
    first = strict["first_difference"]
    assert (first["group"], first["name"]) == (
        "trainer_state",
        "stateful_callbacks.TrainerControl.args.should_training_stop",
    )


# ---- bad and missing files ----------------------------------------------------------------------------------------


class Boom:
    """A pickle that would run a command when loaded with full pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_bad_and_missing_files_are_errors_naming_the_file(hf_runs: dict[str, Run], tmp_path: Path) -> None:
    ref = hf_runs["reference"].out / "checkpoint-20"
    bad = copy_checkpoint(ref, tmp_path / "bad")
    (bad / "model.safetensors").write_bytes((bad / "model.safetensors").read_bytes()[:100])
    (bad / "optimizer.pt").write_bytes(b"not a zip file at all")
    marker = tmp_path / "ran"
    torch.save(Boom(marker), bad / "scheduler.pt")
    doc = compare_paths(bad, ref)
    groups = doc["groups"]
    assert str(bad / "model.safetensors") in groups["model"]["error"]
    assert str(bad / "optimizer.pt") in groups["optimizer"]["error"]
    assert str(bad / "scheduler.pt") in groups["scheduler"]["error"] and "trust_pickle" in groups["scheduler"]["error"]
    assert "exec" in groups["scheduler"]["error"] and not marker.exists()  # refused, never run
    assert not doc["close"] and groups["rng"]["equal"]

    missing = compare_paths(tmp_path / "nowhere", ref)
    assert missing["error"] == f"{tmp_path / 'nowhere'}: no such file or directory" and missing["groups"] == {}


def test_a_truncated_lightning_checkpoint_is_an_error_naming_it(lightning_runs: dict[str, Run], tmp_path: Path) -> None:
    ref = lightning_runs["reference"].out / "checkpoints" / "last.ckpt"
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(ref.read_bytes()[:2000])
    doc = compare_paths(cut, ref)
    assert doc["error"].startswith(f"{cut}: ") and doc["format"] == "lightning" and not doc["close"]


def test_an_unknown_folder_says_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "weights.npz").write_bytes(b"")
    doc = compare_paths(tmp_path / "x", tmp_path / "x")
    assert "cannot tell its checkpoint format (it holds weights.npz)" in doc["error"]


def test_two_formats_are_not_compared(hf_runs: dict[str, Run], lightning_runs: dict[str, Run]) -> None:
    doc = compare_paths(
        hf_runs["reference"].out / "checkpoint-20", lightning_runs["reference"].out / "checkpoints" / "last.ckpt"
    )
    assert "is a hf_trainer checkpoint and" in doc["error"] and "a lightning one" in doc["error"]


def test_trust_pickle_compares_what_weights_only_cannot_read(hf_runs: dict[str, Run]) -> None:
    a, ref = hf_runs["default"].out / "checkpoint-10", hf_runs["reference"].out / "checkpoint-10"
    safe = compare_paths(a, ref)
    assert safe["equal"] and safe["unsafe_loads"] == []
    assert safe["not_compared"] == [
        "training_args.bin: a pickled TrainingArguments that torch.load(weights_only=True) cannot read "
        "(compared with trust_pickle)"
    ]
    trusted = compare_paths(a, ref, trust_pickle=True)
    assert trusted["unsafe_loads"] == [str(a / "training_args.bin"), str(ref / "training_args.bin")]
    first = trusted["first_difference"]
    assert (first["group"], first["name"], first["a"]) == ("trainer_state", "training_args.output_dir", str(a.parent))


# ---- the collector and the command --------------------------------------------------------------------------------


def test_collector_entry_point_compares_paths_relative_to_the_step(hf_runs: dict[str, Run]) -> None:
    assert "ckpt_compare" in known_collectors()
    root = hf_runs["default"].out.parent
    doc = engine_collect(
        "ckpt_compare",
        {"a": "default/checkpoint-20", "b": "reference/checkpoint-20", "format": "hf_trainer"},
        {"cwd": str(root)},
    )
    assert doc["equal"] and doc["a"] == str(root / "default" / "checkpoint-20")
    with pytest.raises(CollectorError, match="args.rtol must be a finite number >= 0"):
        engine_collect("ckpt_compare", {"a": "x", "b": "y", "rtol": -1}, {"cwd": str(root)})
    with pytest.raises(CollectorError, match="unknown args tolerance"):
        engine_collect("ckpt_compare", {"a": "x", "b": "y", "tolerance": 1}, {"cwd": str(root)})


def test_hash_a_names_the_bytes_of_every_file_compared_and_a_missing_folder_in_one_line(
    hf_runs: dict[str, Run], tmp_path: Path
) -> None:
    a = copy_checkpoint(hf_runs["reference"].out / "checkpoint-20", tmp_path / "a")
    (a / "nested").mkdir()
    (a / "nested" / "extra.bin").write_bytes(b"\x00" * 3)
    args = {"a": str(a), "b": str(hf_runs["reference"].out / "checkpoint-20"), "format": "hf_trainer"}
    assert "a_sha256" not in engine_collect("ckpt_compare", args, {})  # asked for only: it reads every byte
    doc = engine_collect("ckpt_compare", {**args, "hash_a": True}, {})
    files = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    assert "nested/extra.bin" in files and sorted(doc["a_sha256"]) == files
    assert doc["a_sha256"]["model.safetensors"] == hashlib.sha256((a / "model.safetensors").read_bytes()).hexdigest()
    assert doc["a_sha256"]["nested/extra.bin"] == hashlib.sha256(b"\x00" * 3).hexdigest()
    assert doc["a_sha256_error"] is None
    missing = engine_collect("ckpt_compare", {**args, "a": str(tmp_path / "gone"), "hash_a": True}, {})
    assert missing["error"] and missing["a_sha256"] is None
    assert missing["a_sha256_error"] == f"{tmp_path / 'gone'}: No such file or directory"
    with pytest.raises(CollectorError, match="args.hash_a must be true or false"):
        engine_collect("ckpt_compare", {**args, "hash_a": "yes"}, {})


def test_command_prints_strict_json_and_refuses_bad_options(hf_runs: dict[str, Run], tmp_path: Path, capsys) -> None:
    ref = hf_runs["reference"].out / "checkpoint-20"
    sides = [copy_checkpoint(ref, tmp_path / side) for side in "ab"]
    for side in sides:
        tensors = load_file(str(side / "model.safetensors"))
        tensors["net.0.bias"][0] = float("inf") if side.name == "a" else 1.0
        save_file(tensors, str(side / "model.safetensors"))
    assert cli_main([str(sides[0]), str(sides[1]), "--ignore", "trainer_state.*"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"bare {c} in the output"))
    assert doc["groups"]["model"]["first_difference"]["a"] == {"$nonfinite": "Infinity"}
    assert doc["ignore"] == ["trainer_state.*"]
    assert cli_main(["a", "b", "--atol", "nan"]) == 2
    assert "atol must be a finite number >= 0" in capsys.readouterr().err


def test_without_torch_the_collector_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    # -S: no site-packages, so torch, numpy and safetensors cannot be imported, as in a core install
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from probes.ckpt.collector import MissingDependencies, collect\n"
        "assert 'torch' not in sys.modules\n"
        "try:\n"
        "    collect({'a': 'x', 'b': 'y'}, {})\n"
        "except MissingDependencies as exc:\n"
        "    print(exc)\n"
        "from probes.ckpt.__main__ import main\n"
        "sys.exit(main(['x', 'y']))\n"
    )
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert r.stdout.strip().startswith(
        "the ckpt_compare collector needs pip install 'specprobe[probes]' (missing: torch"
    )
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
