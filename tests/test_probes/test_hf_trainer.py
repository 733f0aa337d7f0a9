"""The transformers.Trainer callback (through ``import probes.auto``) and the driver's resume modes, with the real
Trainer: the right way resumes bit-exact, each known wrong way differs from the uninterrupted run."""

from __future__ import annotations

from probe_helpers import Run, first_difference

from probes.ckpt import compare_paths

KEYS = ("loss", "lr", "batches", "epoch")


def test_callback_prints_each_step_once_and_stops_with_the_trainers_own_checkpoint(hf_runs: dict[str, Run]) -> None:
    leg1, leg2 = hf_runs["default"].sessions
    assert leg1.error is None and leg2.error is None
    assert [s["step"] for s in leg1.steps] == list(range(1, 11))
    assert leg1.session["stop_at"] == 10 and leg1.session["start_step"] == 0
    stop = leg1.stop
    assert stop is not None and stop["step"] == 10 and stop["saved"] is True
    ckpt = hf_runs["default"].out / "checkpoint-10"
    assert stop["checkpoint"] == str(ckpt)
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= {p.name for p in ckpt.iterdir()}
    # session 2 resumed from that checkpoint (resume_from_checkpoint=True) and ran to the horizon
    assert leg2.session["start_step"] == 10 and leg2.session["stop_at"] is None
    assert [s["step"] for s in leg2.steps] == list(range(11, 21))
    assert all(len(s["batches"]) == 1 and s["lr"] is not None for s in leg1.steps + leg2.steps)


def test_stopped_by_the_callback_the_resume_matches_the_uninterrupted_run(hf_runs: dict[str, Run]) -> None:
    run, ref = hf_runs["default"], hf_runs["reference"]
    assert first_difference(run.by_step(), ref.by_step(), KEYS) is None
    final = compare_paths(run.out / "checkpoint-20", ref.out / "checkpoint-20")
    assert final["error"] is None and final["equal"], final["first_difference"]
    assert set(final["groups"]) == {"model", "optimizer", "scheduler", "rng", "trainer_state"}


def test_max_steps_stop_trains_the_step_after_the_stop_at_lr_zero(hf_runs: dict[str, Run]) -> None:
    run, ref = hf_runs["broken_max_steps_stop"], hf_runs["reference"]
    steps, ref_steps = run.by_step(), ref.by_step()
    assert steps[11]["lr"] == 0.0 and ref_steps[11]["lr"] > 0.0
    step, key, _, _ = first_difference(steps, ref_steps, KEYS)
    assert key == "lr" and step <= 10  # session 1 already decays to 0 at the stop
    final = compare_paths(run.out / "checkpoint-20", ref.out / "checkpoint-20")
    assert not final["close"] and "model" in final["not_close_groups"]
    assert final["groups"]["model"]["max_abs_diff"] > 1e-4


def test_checkpoint_without_optimizer_state_restarts_adamw_and_the_warmup(hf_runs: dict[str, Run]) -> None:
    run, ref = hf_runs["broken_no_optimizer_state"], hf_runs["reference"]
    steps, ref_steps = run.by_step(), ref.by_step()
    assert (
        first_difference({k: v for k, v in steps.items() if k <= 10}, {k: ref_steps[k] for k in range(1, 11)}, KEYS)
        is None
    )
    assert first_difference(steps, ref_steps, ("lr",)) == (11, "lr", 0.0, ref_steps[11]["lr"])  # a new warm-up
    at_stop = compare_paths(run.out / "checkpoint-10", hf_runs["default"].out / "checkpoint-10")
    assert at_stop["groups"]["optimizer"]["missing"] == {"a": ["optimizer.pt"], "b": []}
    assert at_stop["groups"]["model"]["equal"] and not at_stop["close"]


def test_the_stop_saves_at_a_step_the_save_schedule_skips(hf_runs: dict[str, Run]) -> None:
    (leg,) = hf_runs["off_schedule"].sessions
    out = hf_runs["off_schedule"].out
    assert [s["step"] for s in leg.steps] == list(range(1, 8))
    assert leg.stop == {"step": 7, "checkpoint": str(out / "checkpoint-7"), "saved": True}
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-7"]
    state = compare_paths(out / "checkpoint-7", out / "checkpoint-7")
    assert state["equal"] and set(state["groups"]) == {"model", "optimizer", "scheduler", "rng", "trainer_state"}


def test_one_line_and_an_explicit_callback_print_each_step_once(tmp_path, capsys, monkeypatch) -> None:
    from transformers import Trainer, TrainingArguments

    import probes.auto
    import probes.emit
    from probes.drivers.common import Regressor, Samples

    monkeypatch.setenv("SPECPROBE_STOP_AT_STEP", "3")
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=5,
        per_device_train_batch_size=4,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = Trainer(model=Regressor(), args=args, train_dataset=Samples(), callbacks=[probes.emit.hf_callback()])
    trainer.train()
    lines = [line.split(" ", 1)[0] for line in capsys.readouterr().out.splitlines() if line.startswith("SPECPROBE_")]
    assert lines == ["SPECPROBE_SESSION", *["SPECPROBE_STEP"] * 3, "SPECPROBE_STOP"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]  # saved once, though saving is off
