"""A run split into segments (stop, wipe the local disk, cold-resume from the store) is bitwise the same
run as an uninterrupted one: the same per-step losses and the same final weights.

Real torchrun with 2 gloo ranks on CPU, the tiny geometry and a local file:// store. A data position restored
once but not re-saved shows up only on the SECOND resume: that case is the three-stops example's real run
(tests/test_e2e/test_two_stops.py), every leg of which is compared with its reference step by step.
"""

from __future__ import annotations

import json
import shutil

import pytest
from trainer_helpers import (
    BASELINE_PUSH_EVERY,
    BASELINE_STEPS,
    TOKENS_PER_STEP,
    baseline,
    copy_repo,
    explain,
    open_repo,
    pointer,
    repo_files,
    run_trainer,
    segment_one_process,
    single_cmd,
    store_url,
    torchrun_cmd,
    trainer_args,
    weights_sha256,
)

# The model options of a CPU run with no SPECPROBE_* variable set: the defaults, sdpa_gqa decided (off on cpu).
CPU_OPTIONS = {
    "bf16_residual": True,
    "fp32_wgrad": True,
    "addmm_fp32": True,
    "sdpa_gqa": False,
    "loss_chunk_rows": 0,
    "fused_ce": True,
    "lean_activations": False,
    "combo_kernels": False,
}

pytestmark = pytest.mark.slow


def _segmented(tmp_path, mix, stops: list[int]):
    """Run to each stop in turn (wiping --out before every session), then to the horizon."""
    repo, out = store_url(tmp_path / "store"), tmp_path / "out"
    runs = []
    for stop in [*stops, 0]:
        shutil.rmtree(out, ignore_errors=True)  # cold resume: only the store survives a session
        r = run_trainer(
            torchrun_cmd(
                trainer_args(
                    root=mix, out=out, repo=repo, steps=BASELINE_STEPS, push_every=BASELINE_PUSH_EVERY, stop=stop
                )
            )
        )
        assert r.rc == 0, explain(r)
        runs.append(r)
    return repo, runs


def test_uninterrupted_run_reports_its_shape(tmp_path_factory):
    base = baseline(tmp_path_factory)
    rj = base.run.run_json
    assert rj["final_step"] == BASELINE_STEPS and rj["segment_stop"] is False
    assert rj["resumed_from_step"] is None and rj["first_step"] == 1
    assert rj["tokens_consumed"] == BASELINE_STEPS * TOKENS_PER_STEP == rj["tokens_per_step"] * 6
    assert rj["world_size"] == 2 and rj["precision"] == "fp32" and rj["grad_ckpt"] is False
    assert rj["compile"] == "off"  # cpu: auto is off (bitwise-exact resume)
    assert rj["cuda_graphs"] is False and base.run.starting(
        "cuda graphs: off (auto: needs cuda and the whole-model compile (device cpu, compile off))"
    )
    assert list(rj["losses"]) == [str(s) for s in range(1, 7)]
    frozen, full = base.run.starting("gc: ")  # the heap frozen once, after the first step
    assert " objects frozen after step=1 " in frozen, frozen
    assert int(frozen.split()[1]) > 10_000, frozen  # torch's and the trainer's objects, at least
    # Then the full collections that still stopped a step, counted and timed, the same in line and JSON.
    assert full.startswith(f"gc: {rj['gc_full_collections']} full collections after the freeze, "), full
    assert 0 <= rj["gc_full_s_max"] <= rj["gc_full_s_total"]
    assert rj["losses"]["6"] < rj["losses"]["1"]  # it learns
    # Step times as the bench reports them, over steps 2-6 (the first is the warm-up).
    assert 0 < rj["step_ms_min"] <= rj["step_ms_p50"] <= rj["step_ms_p90"] <= rj["step_ms_max"]
    assert rj["tok_s_median"] == pytest.approx(TOKENS_PER_STEP / (rj["step_ms_p50"] / 1000), rel=1e-3)
    assert rj["val_skipped"] is False and rj["val_error"] is None and rj["val_ppl"] > 1
    assert rj["push_steps"] == [2, 4, 6]
    assert rj["peak_gpu_gb_max_rank"] is None and rj["peak_note"] == "cpu: no device memory stats"
    assert rj["peak_reserved_gb_by_rank"] is None  # a plot shows "no data", never a zero per rank
    assert pointer(base.repo)["terminal"] is True and pointer(base.repo)["path_in_repo"] == "final"
    files = repo_files(base.repo)
    for step in (2, 4, 6):
        assert f"ckpt/checkpoint-{step}/model.safetensors" in files
    assert "final/optimizer.pt" in files
    # pruned: only the newest ckpt keeps its optimizer state
    assert "ckpt/checkpoint-2/optimizer.pt" not in files and "ckpt/checkpoint-6/optimizer.pt" in files
    assert base.run.starting("TRAIN DONE step=6 tokens=1536")
    # The model options: one line at the start, the same values in RUN_JSON and in each checkpoint's state,
    # whose run config carries the numerics ones into the config hash.
    assert base.run.starting("model options: ") == [
        "model options: bf16_residual=on fp32_wgrad=on addmm_fp32=on sdpa_gqa=off loss_chunk_rows=auto "
        "fused_ce=on lean_activations=off combo_kernels=off"
    ]
    assert rj["model_options"] == CPU_OPTIONS
    state = json.loads(open_repo(base.repo).read_bytes("final/trainer_state.json"))
    assert state["model_options"] == CPU_OPTIONS
    assert state["run_config"]["numerics"] == {"bf16_residual": True, "fp32_wgrad": True, "addmm_fp32": True}


def test_one_stop_and_cold_resume_is_bitwise_identical(tmp_path, tmp_path_factory):
    base = baseline(tmp_path_factory)
    # stop at 3: not a multiple of --push-every-steps 2, so the stop step itself is pushed
    repo, (leg1, leg2) = _segmented(tmp_path, base.mix, [3])
    assert leg1.run_json["final_step"] == 3 and leg1.run_json["segment_stop"] is True
    assert leg1.run_json["push_steps"] == [2, 3]
    assert leg1.run_json["val_skipped"] is True and leg1.run_json["val_ppl"] is None
    assert leg1.starting("segment boundary at step 3 (--stop-after-steps 3): stopping")
    assert leg1.starting("validation skipped (segment leg)")
    assert not leg1.starting("TRAIN DONE")
    assert leg2.starting("auto-resume: pointer step=3 path=ckpt/checkpoint-3")
    assert leg2.starting("resume from step 3 (ckpt/checkpoint-3) tokens=768")
    assert leg2.run_json["resumed_from_step"] == 3 and leg2.run_json["first_step"] == 4
    merged = {**leg1.run_json["losses"], **leg2.run_json["losses"]}
    assert merged == base.run.run_json["losses"]  # exact float equality, every step
    # The same learning rate and the same tokens at every step: the schedule and the data order resumed.
    for per_step in ("lrs", "batches"):
        assert {**leg1.run_json[per_step], **leg2.run_json[per_step]} == base.run.run_json[per_step], per_step
    assert weights_sha256(repo) == base.final_sha
    assert leg2.run_json["val_loss"] == base.run.run_json["val_loss"]


def test_slow_store_overlaps_training_and_resume_from_a_local_path(tmp_path, tmp_path_factory):
    """On a slow link (the file:// store's emulated 1 MB/s) the push of step 2 is still running when
    step 4 wants to push: training went on meanwhile, and step 4 waits for it, saying so. The next
    session resumes from the LOCAL checkpoint dir (--resume PATH) and still ends bitwise identical."""
    base = baseline(tmp_path_factory)
    repo, out = store_url(tmp_path / "store") + "?link_mb_s=1", tmp_path / "out"
    leg1 = run_trainer(torchrun_cmd(base.args(out, repo, stop=4)))
    assert leg1.rc == 0, explain(leg1)
    assert leg1.starting("CKPT wait step=4: push of step=2 still running")
    order = [
        line.split()[0] + " " + line.split()[1]
        for line in leg1.lines
        if line.startswith(("step 3/", "latest.json -> step=2"))
    ]
    assert order[0] == "step 3/6", order  # step 3 trained before step 2's pointer moved
    local = out / "ckpt" / "checkpoint-4"
    assert sorted(p.name for p in local.iterdir()) == [
        "config.json",
        "model.safetensors",
        "optimizer.pt",
        "rng.pt",
        "trainer_state.json",
    ]
    assert not (out / "ckpt" / "checkpoint-2").exists()  # --prune keeps only the newest locally

    leg2 = run_trainer(torchrun_cmd(base.args(tmp_path / "out2", repo, resume=str(local))))
    assert leg2.rc == 0, explain(leg2)
    assert leg2.starting(f"resume from step 4 ({local}) tokens=1024")
    assert {**leg1.run_json["losses"], **leg2.run_json["losses"]} == base.run.run_json["losses"]
    assert weights_sha256(repo) == base.final_sha


@pytest.mark.parametrize("scope", ["blocks"])
def test_compiled_trainer_under_ddp_trains_the_eager_runs_losses(tmp_path, tmp_path_factory, scope):
    # The trainer's compiled path end to end (compile, the 2 ranks' gradient sync, the optimizer, the pushes),
    # run by Inductor's CPU backend under 2 gloo ranks: the same batches, steps and pushes as the eager baseline.
    # The regional scope, which compiles in half the time: the whole-model scope's numerics and settings are
    # test_model's (test_compile_model_*), its cuda-graphs line test_train_cli's, and the GPU runs it is made for.
    base = baseline(tmp_path_factory)
    repo = store_url(tmp_path / "store")
    r = run_trainer(
        torchrun_cmd(base.args(tmp_path / "out", repo, extra=["--compile", "--compile-scope", scope])), timeout=420
    )
    assert r.rc == 0 and r.run_json is not None, explain(r)
    assert r.starting(f"compile: {scope} (requested, scope requested)")
    # the kernel settings that decide speed and compile time are in the log: the whole model brings the
    # coordinate-descent tuning, the regional scope does not; combo kernels are opt-in for both
    tuning = "on" if scope == "model" else "off"
    assert r.starting(f"compile kernels: coordinate-descent tuning {tuning}, combo kernels off"), explain(r)
    assert r.run_json["compile"] == scope and r.run_json["push_steps"] == base.run.run_json["push_steps"]
    assert r.run_json["cuda_graphs"] is False and r.starting(  # CUDA graphs: cuda only
        f"cuda graphs: off (auto: needs cuda (device cpu, compile {scope}))"
        if scope == "model"
        else "cuda graphs: off (auto: needs cuda and the whole-model compile (device cpu, compile blocks))"
    )
    want = base.run.run_json["losses"]
    assert list(r.run_json["losses"]) == list(want)
    for step, loss in r.run_json["losses"].items():  # fused kernels reorder fp32 sums: rounding, no more
        assert loss == pytest.approx(want[step], rel=1e-4), f"step {step}: {loss} vs eager {want[step]}"


def test_an_option_that_only_picks_kernels_may_change_across_a_resume(tmp_path, tmp_path_factory):
    """SPECPROBE_LOSS_CHUNK_ROWS changes how the loss is chunked, not what it computes: not in the config hash,
    so the resume goes ahead, and the session's line and RUN_JSON say what it ran with. The config hash is the
    same on any rank count: one process resumes the shared one-process segment."""
    mix, segment = segment_one_process(tmp_path_factory)
    leg2 = run_trainer(
        single_cmd(
            trainer_args(
                root=mix,
                out=tmp_path / "out",
                repo=copy_repo(segment, tmp_path / "c"),
                steps=BASELINE_STEPS,
                push_every=BASELINE_PUSH_EVERY,
                nproc=1,
            )
        ),
        env={"SPECPROBE_LOSS_CHUNK_ROWS": "16"},
    )
    assert leg2.rc == 0, explain(leg2)
    assert leg2.run_json["resumed_from_step"] == 4 and leg2.run_json["final_step"] == BASELINE_STEPS
    assert leg2.run_json["model_options"] == {**CPU_OPTIONS, "loss_chunk_rows": 16}
    assert " loss_chunk_rows=16 " in leg2.starting("model options: ")[0]
