"""The Lightning callback (added by the entry point after ``import probes.auto``) and the driver's resume modes, with
the real Lightning Trainer."""

from __future__ import annotations

from probe_helpers import Run, first_difference

from probes.ckpt import compare_paths

KEYS = ("loss", "lr", "batches", "epoch")
PER_EPOCH = 8


def test_callback_stops_after_saving_the_checkpoint_fit_last_resumes(lightning_runs: dict[str, Run]) -> None:
    leg1, leg2 = lightning_runs["default"].sessions
    assert leg1.error is None and leg2.error is None
    assert leg1.session["batches_per_epoch"] == PER_EPOCH and leg1.session["stop_at"] == 8
    assert [s["step"] for s in leg1.steps] == list(range(1, 9))
    stop = leg1.stop
    last = lightning_runs["default"].out / "checkpoints" / "last.ckpt"
    assert stop == {"step": 8, "checkpoint": str(last), "saved": True, "via": "ModelCheckpoint last checkpoint"}
    # Lightning wrote no other last checkpoint at the end of the session: fit(ckpt_path="last") resumes the stop's
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]
    assert leg2.session["start_step"] == 8 and [s["step"] for s in leg2.steps] == list(range(9, 25))


def test_stopped_at_an_epoch_end_with_a_sampler_seeded_per_epoch_the_resume_is_exact(
    lightning_runs: dict[str, Run],
) -> None:
    run, ref = lightning_runs["default"], lightning_runs["reference"]
    assert first_difference(run.by_step(), ref.by_step(), KEYS) is None
    final = compare_paths(run.out / "checkpoints" / "last.ckpt", ref.out / "checkpoints" / "last.ckpt")
    for group in ("model", "optimizer", "scheduler"):
        assert final["groups"][group]["equal"], final["groups"][group]["first_difference"]


def test_stopped_mid_epoch_the_resume_retrains_the_epochs_first_batches(lightning_runs: dict[str, Run]) -> None:
    leg1, leg2 = lightning_runs["mid_epoch"].sessions
    ref = lightning_runs["reference"].by_step()
    assert leg1.stop is not None and leg1.stop["step"] == 12  # 4 batches into the second epoch
    resumed = {s["step"]: s for s in leg2.steps}
    # step 13 trains the epoch's first batch again (ref step 9), and batches 5-8 of the epoch are never seen
    assert resumed[13]["batches"] == ref[9]["batches"] != ref[13]["batches"]
    epoch_two = {b for step in range(9, 17) for b in ref[step]["batches"]}
    seen = {b for s in leg1.steps + leg2.steps if s["epoch"] == 1 for b in s["batches"]}
    assert {b for step in range(13, 17) for b in ref[step]["batches"]} & seen == set() and seen < epoch_two
    assert first_difference(lightning_runs["mid_epoch"].by_step(), ref, KEYS)[:2] == (13, "loss")


def test_stopped_at_an_epoch_end_without_per_epoch_seeding_the_next_epoch_replays_the_first(
    lightning_runs: dict[str, Run],
) -> None:
    leg1, leg2 = lightning_runs["broken_unseeded_epoch"].sessions
    ref = lightning_runs["unseeded_reference"].by_step()
    first_epoch = [s["batches"] for s in leg1.steps]
    replayed = [s["batches"] for s in leg2.steps if s["epoch"] == 1]
    assert replayed == first_epoch  # the resumed epoch 1 draws the order the first session drew for epoch 0
    assert [ref[step]["batches"] for step in range(9, 17)] != first_epoch  # the uninterrupted run draws a new one
    assert first_difference(lightning_runs["broken_unseeded_epoch"].by_step(), ref, KEYS)[:2] == (9, "loss")


def test_without_a_model_checkpoint_the_stop_saves_into_the_root_and_says_so(tmp_path, capsys, monkeypatch) -> None:
    import json

    import lightning as L
    import torch

    import probes.auto
    import probes.emit
    from probes.drivers.common import Samples
    from probes.drivers.lightning_loop import LitRegressor

    monkeypatch.setenv("SPECPROBE_STOP_AT_STEP", "3")
    trainer = L.Trainer(
        max_steps=6,
        accelerator="cpu",
        devices=1,
        default_root_dir=str(tmp_path),
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[probes.emit.lightning_callback()],
    )
    trainer.fit(LitRegressor(6), torch.utils.data.DataLoader(Samples(), batch_size=8))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("SPECPROBE_")]
    assert [line.split(" ", 1)[0] for line in lines] == ["SPECPROBE_SESSION", *["SPECPROBE_STEP"] * 3, "SPECPROBE_STOP"]
    stop = json.loads(lines[-1].split(" ", 1)[1])
    assert (
        stop["checkpoint"] == str(tmp_path / "last.ckpt") and stop["saved"] and stop["via"] == "trainer.save_checkpoint"
    )
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 3
