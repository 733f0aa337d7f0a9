"""The trainer refuses, with one clear message and exit code 3 on EVERY rank, store states it must not
resume from: a terminal pointer, a checkpoint with files missing, stored bytes that do not match their
hash, a changed configuration, `--resume never` over an existing run, and a stale stop step.

Against copies of real stores. Rank 0 decides and every rank follows the one decision, so the decision
itself is the same at any rank count: most refusals run the real trainer as one process (exit code 3
straight from it). Under real torchrun (2 gloo ranks), the terminal pointer and the failed push show that
every rank exits with the code and none is left hanging (torchrun returns within the timeout and reports
the ranks' codes; the launcher itself exits 1).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from trainer_helpers import (
    BASELINE_PUSH_EVERY,
    BASELINE_STEPS,
    Run,
    baseline,
    build_tiny_mix,
    copy_repo,
    explain,
    open_repo,
    pointer,
    rank_exit_codes,
    repo_dir,
    run_trainer,
    segment_one_process,
    shared,
    single_cmd,
    store_url,
    torchrun_cmd,
    trainer_args,
    weights_sha256,
)

from trainer.data import mix_hash, read_manifest

pytestmark = pytest.mark.slow


def _refused(run: Run, *fragments: str, code: int = 3) -> None:
    if rank_exit_codes(run):
        # Every rank decides to exit together; torchrun SIGTERMs whichever rank is still tearing down when
        # the first one has exited, so a rank may be reported as -15 but never with another code.
        codes = rank_exit_codes(run)
        assert set(codes) == {0, 1} and code in codes.values() and set(codes.values()) <= {code, -15}, explain(run)
    else:
        assert run.rc == code, explain(run)
    refusals = run.starting("refused: ")
    assert len(refusals) == 1, explain(run)  # rank 0 alone says it, once
    for f in fragments:
        assert f in refusals[0], (f, refusals[0])
    assert not run.starting("step ") and not run.starting("CKPT push"), "it trained or pushed anyway"


def _train(mix: Path, repo: str, tmp_path: Path, env: dict[str, str] | None = None, **kw) -> Run:
    """The real trainer as one process, resuming (or not) from `repo`."""
    kw.setdefault("steps", BASELINE_STEPS)
    kw.setdefault("push_every", BASELINE_PUSH_EVERY)
    args = trainer_args(root=mix, out=tmp_path / "out", repo=repo, nproc=1, **kw)
    return run_trainer(single_cmd(args), env=env, timeout=90)


def test_terminal_pointer_refuses_to_train_further_on_every_rank(tmp_path, tmp_path_factory):
    base = baseline(tmp_path_factory)
    repo = copy_repo(base.repo, tmp_path)
    args = trainer_args(
        root=base.mix, out=tmp_path / "out", repo=repo, steps=BASELINE_STEPS + 2, push_every=BASELINE_PUSH_EVERY
    )
    run = run_trainer(torchrun_cmd(args), timeout=90)
    assert rank_exit_codes(run), explain(run)  # torchrun's report of both ranks
    _refused(run, "is terminal", "finished at step 6", "train further, to step 8")
    assert pointer(repo)["terminal"] is True and pointer(repo)["step"] == 6


def test_terminal_pointer_single_process_exit_code_is_3(tmp_path, tmp_path_factory):
    base = baseline(tmp_path_factory)
    repo = copy_repo(base.repo, tmp_path)
    args = trainer_args(root=base.mix, out=tmp_path / "out", repo=repo, steps=BASELINE_STEPS, push_every=2, nproc=1)
    run = run_trainer(single_cmd(args), timeout=60)
    assert run.rc == 3, explain(run)
    assert "already finished at step 6" in run.text


def test_missing_checkpoint_file_refuses(tmp_path, tmp_path_factory):
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    open_repo(repo).commit({}, delete=["ckpt/checkpoint-4/optimizer.pt"], message="lose a file")
    run = _train(mix, repo, tmp_path)
    _refused(run, "does not show ckpt/checkpoint-4/optimizer.pt", "Nothing in ")
    assert "delete" not in run.starting("refused: ")[0].lower()


def test_stored_bytes_not_matching_their_hash_refuse(tmp_path, tmp_path_factory):
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    # Bit rot in the stored weights: the listing still records the old hash, the bytes no longer have it.
    want = pointer(repo)["files"]["model.safetensors"]
    obj = repo_dir(repo) / ".specprobe" / "objects" / want
    data = bytearray(obj.read_bytes())
    data[-1] ^= 0xFF
    obj.chmod(0o644)
    obj.write_bytes(bytes(data))
    _refused(_train(mix, repo, tmp_path), "ckpt/checkpoint-4/model.safetensors", "sha256")


def test_pointer_hash_mismatch_refuses(tmp_path, tmp_path_factory):
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    doc = pointer(repo)
    doc["files"]["rng.pt"] = "0" * 64
    p = tmp_path / "latest.json"
    p.write_text(json.dumps(doc))
    open_repo(repo).commit({"latest.json": p}, message="a pointer that lies")
    _refused(_train(mix, repo, tmp_path), "ckpt/checkpoint-4/rng.pt", "pointer says " + "0" * 64)


def test_config_change_refuses(tmp_path, tmp_path_factory):
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    # --min-lr defaults to lr/10: both change, and both are named.
    _refused(
        _train(mix, repo, tmp_path, lr=1e-3),
        "another configuration (changed: lr: 0.003 -> 0.001; min_lr: 0.0003 -> 0.0001)",
        "--allow-config-change lr,min_lr",
    )
    assert pointer(repo)["step"] == 4


@pytest.mark.parametrize(
    "flags, change",
    [
        (["--grad-clip", "0.5"], "grad_clip: 1.0 -> 0.5"),
        (["--warmup-steps", "1"], "warmup_steps: 2 -> 1"),
        (["--min-lr", "0.001"], "min_lr: 0.0003 -> 0.001"),
        (["--weight-decay", "0.0"], "weight_decay: 0.1 -> 0.0"),
    ],
)
def test_every_recipe_flag_that_changes_the_weights_refuses_a_silent_change(tmp_path, tmp_path_factory, flags, change):
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    _refused(
        _train(mix, repo, tmp_path, extra=flags),
        f"(changed: {change})",
        f"--allow-config-change {change.split(':')[0]}",
    )
    assert pointer(repo)["step"] == 4


def test_an_allowed_change_is_logged_recorded_and_takes_effect(tmp_path, tmp_path_factory):
    # --weight-decay came back from the optimizer state before: the allowed change must reach the weights.
    mix, seg = segment_one_process(tmp_path_factory)
    same, changed = copy_repo(seg, tmp_path / "a"), copy_repo(seg, tmp_path / "b")
    kept = _train(mix, same, tmp_path / "a")
    assert kept.rc == 0 and kept.run_json["config_changes"] == [], explain(kept)
    run = _train(
        mix,
        changed,
        tmp_path / "b",
        extra=[
            "--weight-decay",
            "0.0",
            "--grad-clip",
            "0.5",
            "--allow-config-change",
            "weight_decay",
            "--allow-config-change",
            "grad_clip",
        ],
    )
    assert run.rc == 0, explain(run)
    assert run.starting("config change allowed: ") == [
        "config change allowed: weight_decay: 0.1 -> 0.0 (--allow-config-change)",
        "config change allowed: grad_clip: 1.0 -> 0.5 (--allow-config-change)",
    ]
    assert run.run_json["config_changes"] == [
        {"field": "weight_decay", "old": 0.1, "new": 0.0},
        {"field": "grad_clip", "old": 1.0, "new": 0.5},
    ]
    assert weights_sha256(changed) != weights_sha256(same)
    # The next session resumes from the changed run's own checkpoints: no change left to allow.
    assert pointer(changed)["terminal"] is True


def other_mix_of_the_same_shape(tmp_path_factory) -> Path:
    """A second tiny mix built like the tests' mix (same vocab, tokens, shards and val split) from another seed:
    other documents at every position. Built once per test session."""
    return shared("mix-seed1", tmp_path_factory, lambda d: build_tiny_mix(d / "mix", seed=1))


def test_a_resume_on_another_mix_of_the_same_shape_is_refused_naming_both_hashes(tmp_path, tmp_path_factory):
    mix, seg = segment_one_process(tmp_path_factory)
    other = other_mix_of_the_same_shape(tmp_path_factory)
    ours, theirs = read_manifest(mix), read_manifest(other)
    assert {k: ours[k] for k in ("dtype", "vocab_size", "n_shards", "total_tokens")} == {
        k: theirs[k] for k in ("dtype", "vocab_size", "n_shards", "total_tokens")
    }
    assert ours["val"]["tokens"] == theirs["val"]["tokens"] and mix_hash(ours) != mix_hash(theirs)
    repo = copy_repo(seg, tmp_path)
    _refused(
        _train(other, repo, tmp_path),
        f'another configuration (changed: mix: "{mix_hash(ours)}" -> "{mix_hash(theirs)}")',
        "--allow-config-change mix",
    )
    assert pointer(repo)["step"] == 4


def test_a_mix_change_allowed_by_name_trains_on_the_new_mix_and_is_recorded(tmp_path, tmp_path_factory):
    mix, seg = segment_one_process(tmp_path_factory)
    other = other_mix_of_the_same_shape(tmp_path_factory)
    old, new = mix_hash(read_manifest(mix)), mix_hash(read_manifest(other))
    repo = copy_repo(seg, tmp_path)
    run = _train(other, repo, tmp_path, extra=["--allow-config-change", "mix"])
    assert run.rc == 0, explain(run)
    assert run.starting("config change allowed: ") == [
        f'config change allowed: mix: "{old}" -> "{new}" (--allow-config-change)'
    ]
    assert run.run_json["config_changes"] == [{"field": "mix", "old": old, "new": new}]
    assert run.run_json["mix_sha256"] == new and f"sha256={new}" in run.starting("mix: ")[0]
    state = json.loads(open_repo(repo).read_bytes("final/trainer_state.json"))
    assert state["run_config"]["mix"] == new and pointer(repo)["config_hash"] == state["config_hash"]


def test_a_field_that_defines_the_run_cannot_be_allowed_to_change(tmp_path, tmp_path_factory):
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    run = _train(mix, repo, tmp_path, extra=["--seed", "7", "--allow-config-change", "seed"])
    assert run.rc == 2, explain(run)
    assert "--allow-config-change seed: this field cannot change across a resume" in run.text, explain(run)
    assert pointer(repo)["step"] == 4


@pytest.mark.parametrize(
    "var, change",
    [
        ("SPECPROBE_FP32_WGRAD", "numerics.fp32_wgrad: true -> false"),
        ("SPECPROBE_BF16_RESIDUAL", "numerics.bf16_residual: true -> false"),
    ],
)
def test_a_changed_numerics_option_refuses_the_resume_naming_it(tmp_path, tmp_path_factory, var, change):
    """A model option that changes what is computed is part of the run, like the learning rate: resuming
    with it changed would splice two different runs together."""
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    run = _train(mix, repo, tmp_path, env={var: "0"})
    _refused(run, f"(changed: {change})", "--allow-config-change " + change.split(":")[0])
    assert pointer(repo)["step"] == 4


def test_resume_never_refuses_an_existing_run(tmp_path, tmp_path_factory):
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    _refused(_train(mix, repo, tmp_path, resume="never"), "--resume never", "pointer at step 4")


def test_stale_stop_step_refuses(tmp_path, tmp_path_factory):
    mix, seg = segment_one_process(tmp_path_factory)
    repo = copy_repo(seg, tmp_path)
    _refused(_train(mix, repo, tmp_path, stop=4), "nothing to train", "resumed at step 4", "stops at step 4")


def test_failed_background_push_fails_the_run(tmp_path, tmp_path_factory):
    """The push of step 4 fails for real (the store's staging area becomes unusable once step 2 is
    pointed at): the run must not go on as if it had a checkpoint. It stops at the next checkpoint
    (step 6) with exit code 4 and the cause, and the pointer still names the last verified step."""
    base = baseline(tmp_path_factory)
    repo = store_url(tmp_path / "store")
    staging = repo_dir(repo) / ".specprobe" / "staging"

    def break_store(line: str) -> None:
        if line.startswith("CKPT prune step=2 "):  # step 2 is durable; its prune commits nothing
            shutil.rmtree(staging, ignore_errors=True)
            staging.write_text("not a directory")

    run = run_trainer(
        torchrun_cmd(base.args(tmp_path / "out", repo)),
        on_line=break_store,
        timeout=90,
    )
    codes = rank_exit_codes(run)
    assert 4 in codes.values() and set(codes.values()) <= {4, -15}, explain(run)
    failed = run.starting("CKPT FAILED: push of step=4 to " + repo)
    assert len(failed) == 1, explain(run)
    assert not run.starting("TRAIN DONE") and run.run_json is None
    assert not run.starting("latest.json -> step=4")
    staging.unlink()
    assert pointer(repo)["step"] == 2


def test_validation_error_is_reported_not_fatal(tmp_path):
    """A val split too small for even one window: validation raises inside the horizon leg; the run
    still finishes (exit 0, final pushed) and RUN_JSON carries the error instead of a number."""
    mix = build_tiny_mix(tmp_path / "mix", tokens=4_000, val_tokens=20)
    repo = store_url(tmp_path / "store")
    args = trainer_args(root=mix, out=tmp_path / "out", repo=repo, steps=2, push_every=2, nproc=1)
    run = run_trainer(single_cmd(args), timeout=90)
    assert run.rc == 0, explain(run)
    rj = run.run_json
    assert rj["val_skipped"] is False and rj["val_ppl"] is None and rj["val_loss"] is None
    assert "DataError" in rj["val_error"] and "val" in rj["val_error"]
    assert run.starting("validation failed: rank 0: DataError")
    assert pointer(repo)["terminal"] is True
