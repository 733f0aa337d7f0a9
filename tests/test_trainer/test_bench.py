"""bench/train_bench.py: every task runs end to end on CPU, and the table's ratio uses the same call's HF rows."""

import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The bench on the CPU, the tiny model at the tests' sequence length.
BENCH = [sys.executable, str(ROOT / "bench" / "train_bench.py"), *"--device cpu --model tiny --seq-len 32".split()]
spec = importlib.util.spec_from_file_location("train_bench", ROOT / "bench" / "train_bench.py")
train_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_bench)


def _row(impl: str, tok_s: float, micro: int = 32, compile: str = "full", **kw) -> dict:
    return {
        "impl": impl,
        "task": "speed",
        "tok_s": tok_s,
        "micro": micro,
        "accum": 1,
        "prec": "bf16",
        "world": 1,
        "seq_len": 1024,
        "card": "H200",
        "compile": compile,
        **kw,
    }


def test_ratio_is_against_the_mean_of_hf_compile_rows_of_the_same_shape_only():
    rows = [
        _row("hf", 300.0),
        _row("hf", 500.0),
        _row("ours", 520.0, compile="regional"),
        _row("hf", 100.0, compile="none"),  # not the baseline: HF without compile
        _row("ours", 90.0, micro=4, compile="regional"),  # no HF row of its shape: no ratio
        _row("ours", 400.0, compile="regional", card="A100"),
    ]  # another card: never compared
    assert train_bench.vs_baseline(rows) == {2: 1.3}


def test_every_bench_task_runs_on_cpu_and_writes_its_rows(tmp_path):
    jsonl = tmp_path / "rows.jsonl"
    configs = [
        "micro=2,steps=2,warmup=1,prof=1,pbwd=autograd,res=0,wacc=0,gqa=1,ce_rows=16",
        # The compiled rows share their shapes and options, so the second compile is Inductor's cache.
        "micro=2,steps=2,warmup=1,compile=regional",
        "impl=hf,micro=2,steps=2,warmup=1",
        "task=check,micro=2,steps=3,noise=1",
        "task=drift,micro=2,warmup=1,windows=1/2/3",
        "task=graphs,micro=2,accum=2,compile=regional,steps=2,gsteps=2",
    ]
    cmd = [*BENCH, "--jsonl", str(jsonl), "--verbose"]
    for c in configs:
        cmd += ["--config", c]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert "info" in rows[0] and rows[0]["info"]["params"] == 119_104
    rows = rows[1:]
    assert [r.get("error") for r in rows] == [None] * 6, [r.get("error") for r in rows]
    assert all(r["tok_s"] > 0 for r in rows if r["task"] in ("speed", "drift"))
    speed = [r for r in rows if r["task"] == "speed"]
    assert len(speed) == 3 and all(r["gc_full_collections"] >= 0 and r["gc_full_s_max"] >= 0 for r in speed)
    prof = {name: (v, pct) for name, v, pct in rows[0]["prof_top"]}
    assert prof["TOTAL"][0] > 0 and prof["LAUNCHES"][0] >= 1  # time and launches per step
    assert {f"FAMILY {fam}" for fam, _ in train_bench.PROF_FAMILIES} <= prof.keys()
    assert len(rows[0]["prof_top"]) <= 2 + len(train_bench.PROF_FAMILIES) + train_bench.PROF_TOP
    check = rows[3]
    assert set(check["pairs"]) == {
        "plain_split_vs_plain",
        "fast_vs_plain",
        "plain_vs_plain_fp32",
        "plain_split_vs_plain_fp32",
        "fast_vs_plain_fp32",
    }
    assert abs(check["fast_first"] - check["plain_first"]) < 1e-4  # same init, same first batch (CPU fp32)
    assert [w["steps_to"] for w in rows[4]["drift_windows"]] == [1, 2, 3]
    graphs = rows[5]  # on CPU Inductor skips the CUDA graphs: the two compiled paths agree exactly
    assert graphs["grad_rel_l2"] == [0.0, 0.0] and len(graphs["grad_rel_l2_floor"]) == 2
    assert graphs["loss_bitwise_equal"] is True and graphs["graphs_keep_gradients"] is True
    assert "tok/s" in out.stdout and "check: plain" in out.stdout  # the table was printed


def test_inductor_flags_are_set_by_dotted_name_with_typed_values_and_unknown_names_refused():
    from torch._inductor import config as inductor

    before = inductor.combo_kernels
    with inductor.patch(
        {"combo_kernels": False, "coordinate_descent_search_radius": 1, "triton.unique_kernel_names": False}
    ):
        train_bench.set_inductor_flags(
            "combo_kernels:True+coordinate_descent_search_radius:3+triton.unique_kernel_names:True"
        )
        assert inductor.combo_kernels is True and inductor.coordinate_descent_search_radius == 3
        assert inductor.triton.unique_kernel_names is True
    assert inductor.combo_kernels == before  # the patch restored them: nothing leaks
    with pytest.raises(SystemExit, match="no 'no_such_flag'"):
        train_bench.set_inductor_flags("no_such_flag:1")
    with inductor.patch({"max_pointwise_cat_inputs": 8}):  # '?': set where it exists, skipped where not
        train_bench.set_inductor_flags("no_such_flag?:1+max_pointwise_cat_inputs?:0")
        assert inductor.max_pointwise_cat_inputs == 0 and not hasattr(inductor, "no_such_flag")


def test_check_killed_by_its_budget_logs_its_progress_and_every_threads_stack(tmp_path):
    # What device_all.sh's part timeout does to a row that overruns: SIGTERM. The row must leave behind how
    # far it got (the progress lines) and where it was (the stacks), then die of the signal as before.
    cmd = [*BENCH, "--config", "task=check,micro=2,steps=100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        seen = []
        for line in proc.stdout:  # wait until the plain path is training
            seen.append(line)
            if line.startswith("check: path plain first step"):
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM
    assert any(line.startswith("check: path plain built in ") for line in seen), seen
    assert "Current thread" in err or "Thread 0x" in err, err[-2000:]
    assert "train_bench.py" in err and "in check" in err, err[-2000:]


def test_timed_steps_start_with_the_heap_frozen_unless_gcfreeze_0():
    import gc

    gc.unfreeze()
    try:
        train_bench.settle_heap(train_bench.parse_config("gcfreeze=0"))
        assert gc.get_freeze_count() == 0  # Python's collector left alone
        train_bench.settle_heap(train_bench.parse_config(""))
        assert gc.get_freeze_count() > 1000  # the default: as the trainer, frozen
    finally:
        gc.unfreeze()


def test_table_names_a_full_collection_in_the_timed_steps_and_is_silent_without_one(capsys):
    base = dict(config="c", mfu_pct=50.0, peak_alloc_gib=1.0, peak_reserved_gib=2.0)
    train_bench.print_table(
        [
            _row("ours", 500.0, gc_full_collections=2, gc_full_s_max=0.512, **base),
            _row("ours", 501.0, gc_full_collections=0, gc_full_s_max=0.0, **base),
        ]
    )
    stalled, quiet = capsys.readouterr().out.splitlines()[2:]
    assert stalled.endswith("gc_full=2x max 512ms"), stalled
    assert "gc_full" not in quiet, quiet


@pytest.mark.slow
def test_a_trainer_run_becomes_a_row_of_the_bench_table(tmp_path, tmp_path_factory):
    # The trainer's own RUN_JSON (2 gloo ranks, the shared baseline run) read back by the bench: the row
    # carries the trainer's step figures, so its step and the bench's compare in one table.
    from trainer_helpers import TOKENS_PER_STEP, baseline

    log = tmp_path / "trainer.log"
    log.write_text("\n".join(baseline(tmp_path_factory).run.lines) + "\n")
    rj = baseline(tmp_path_factory).run.run_json
    row = train_bench.trainer_row(log.read_text(), "trainer.log", peak_tflops=790.0)
    assert row["impl"] == "trainer" and row["world"] == 2 and (row["micro"], row["accum"]) == (2, 2)
    assert row["tok_s"] == rj["tok_per_s"] and row["tok_s_median"] == rj["tok_s_median"]
    assert row["step_ms_p50"] == rj["step_ms_p50"] and row["steps"] == 6
    assert row["tok_s_median"] == pytest.approx(TOKENS_PER_STEP / (row["step_ms_p50"] / 1000), rel=1e-3)
    jsonl = tmp_path / "rows.jsonl"
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "train_bench.py"), "--trainer-log", str(log), "--jsonl", str(jsonl)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "trainer m2x2 fp32 eager compile=off graphs=0" in out.stdout and "world=2" in out.stdout
    assert json.loads(jsonl.read_text())["tok_s_median"] == rj["tok_s_median"]


def test_a_trainer_log_without_run_json_is_an_error_row(tmp_path):
    row = train_bench.trainer_row("step 1/6 loss 6.2\nTraceback (most recent call last):\n", "dead.log", 790.0)
    assert row["error"] == "no RUN_JSON line in dead.log"
    log = tmp_path / "dead.log"
    log.write_text("RUN_JSON {not json\n")
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "train_bench.py"), "--trainer-log", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and "RUN_JSON is not JSON" in out.stdout
