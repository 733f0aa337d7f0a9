"""What RUN_JSON says about each step and about validation: the learning rate each step used (`lrs`), a
digest of the tokens each step trained on (`batches`), how many tokens validation averaged over
(`val_tokens`), and a diverged validation reported as an error instead of a RUN_JSON that cannot be
written.

The runs are the real trainer: the shared 2-rank baseline (tests/trainer_helpers.py) and one
single-process session driven to divergence.
"""

from __future__ import annotations

import re

import pytest
from trainer_helpers import (
    BASELINE_STEPS,
    NPROC,
    SEQ_LEN,
    baseline,
    explain,
    run_trainer,
    single_cmd,
    store_url,
    trainer_args,
)

from trainer.schedule import lr_at
from trainer.train import combine_digests

HEX16 = re.compile(r"^[0-9a-f]{16}$")


def test_combined_batch_digest_changes_with_any_ranks_tokens_and_with_their_order() -> None:
    r0, r1 = {"1": "aa" * 8, "2": "bb" * 8}, {"1": "cc" * 8, "2": "dd" * 8}
    both = combine_digests([r0, r1])
    assert list(both) == ["1", "2"] and all(HEX16.match(v) for v in both.values())
    assert combine_digests([r0, r1]) == both  # deterministic
    assert combine_digests([r1, r0])["1"] != both["1"]  # rank 1's tokens on rank 0 is another batch
    assert combine_digests([r0, {**r1, "2": "ee" * 8}]) == {
        "1": both["1"],
        "2": combine_digests([r0, {"2": "ee" * 8}])["2"],
    }
    assert combine_digests([r0, {**r1, "2": "ee" * 8}])["2"] != both["2"]
    assert combine_digests([{}, {}]) == {}


@pytest.mark.slow
def test_run_json_has_each_steps_lr_and_batch_digest_and_the_validation_tokens(tmp_path_factory) -> None:
    rj = baseline(tmp_path_factory).run.run_json
    steps = [str(s) for s in range(1, BASELINE_STEPS + 1)]
    assert list(rj["lrs"]) == list(rj["batches"]) == list(rj["losses"]) == steps
    # The lr each optimizer step used is the schedule's at that step (trainer_args: lr 3e-3, warmup 2,
    # min_lr the default lr/10, cosine).
    expected = [lr_at(s, total=BASELINE_STEPS, warmup=2, lr=3e-3, min_lr=3e-4, schedule="cosine") for s in range(1, 7)]
    assert list(rj["lrs"].values()) == pytest.approx(expected, rel=1e-12)
    assert rj["lrs"]["6"] == pytest.approx(3e-4, rel=1e-12)  # the floor, reached at the horizon
    # Every step trained other tokens (the sampler never reads a window twice before the horizon).
    assert all(HEX16.match(d) for d in rj["batches"].values())
    assert len(set(rj["batches"].values())) == BASELINE_STEPS
    # --val-tokens 256 over windows of 32: 8 windows, 4 per rank, every one of their 32 targets counted.
    assert rj["val_tokens"] == 256 == (256 // SEQ_LEN // NPROC) * NPROC * SEQ_LEN


@pytest.mark.slow
def test_a_diverged_validation_is_an_error_in_run_json_not_a_run_json_that_cannot_be_written(
    tmp_path, tmp_path_factory
) -> None:
    mix = baseline(tmp_path_factory).mix
    args = trainer_args(
        root=mix,
        out=tmp_path / "out",
        repo=store_url(tmp_path / "store"),
        steps=4,
        push_every=4,
        lr=1e9,
        extra=["--grad-clip", "0"],
        nproc=1,
    )
    r = run_trainer(single_cmd(args))
    assert r.rc == 0 and r.run_json is not None, explain(r)
    rj = r.run_json
    assert rj["nonfinite_losses"] > 0 and rj["final_loss"] is None
    assert rj["val_loss"] is None and rj["val_ppl"] is None
    assert rj["val_error"] == "validation loss is nan (the model diverged)"
    assert rj["val_tokens"] == 256
    assert r.starting("validation failed: validation loss is nan (the model diverged)")
