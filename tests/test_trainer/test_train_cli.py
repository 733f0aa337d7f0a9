"""The trainer's command line, precision choice and schedule: pure functions, and bad combinations
rejected (exit 2, the flag named) before any work -- no torchrun, no model, no store.

Also the preflight checker (exit 3 with one line per missing requirement, the token never printed).
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from trainer_helpers import PLAN_ARGS, REPO_ROOT, trainer_cli

from trainer.ckpt.snapshot import HostBuffers, copy_runs, snapshot_diff
from trainer.cli import build_parser
from trainer.dist import pack_object, unpack_object
from trainer.plan import (
    UsageError,
    checkpoint_steps,
    choose_compile,
    choose_cuda_graphs,
    choose_precision,
    snapshot_mode,
    validate_args,
)
from trainer.preflight import check as preflight_check
from trainer.schedule import lr_at
from trainer.train import Exit, session_tok_per_s

BASE = [*PLAN_ARGS, "--push-every-steps", "2"]


def plan_of(*extra: str, world_size: int = 2, max_seq: int = 2048):
    return validate_args(build_parser().parse_args([*BASE, *extra]), world_size=world_size, model_max_seq_len=max_seq)


def test_step_arithmetic():
    plan = plan_of()
    assert plan.tokens_per_step == 2 * 2 * 2 * 32 == 256
    assert plan.total_steps == 6 and plan.stop_step == 6 and plan.horizon_leg
    seg = plan_of("--stop-after-steps", "3")
    assert seg.stop_step == 3 and not seg.horizon_leg
    assert plan_of(world_size=1).total_steps == 12


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--tokens", "1000"], "--tokens 1000 is not a multiple of tokens_per_step 256"),
        (["--stop-after-steps", "7"], "--stop-after-steps 7 is beyond the horizon of 6"),
        (["--seq-len", "4096"], "--seq-len 4096 exceeds"),
        (["--micro-batch", "0"], "--micro-batch must be positive"),
        (["--accum", "-1"], "--accum must be positive"),
        (["--push-every-steps", "0"], "--push-every-steps must be positive"),
        (["--lr", "0"], "--lr must be positive"),
        (["--grad-ckpt", "--no-grad-ckpt"], "--grad-ckpt and --no-grad-ckpt both given"),
        (["--compile", "--no-compile"], "--compile and --no-compile both given"),
        (["--resume", "/nonexistent/ckpt"], "--resume /nonexistent/ckpt: no such checkpoint directory"),
        (["--val-tokens", "-5"], "--val-tokens must not be negative"),
    ],
)
def test_bad_combinations_name_the_flag(extra, flag):
    with pytest.raises(UsageError, match="^" + flag.replace("(", r"\(")):
        plan_of(*extra)


def test_grad_ckpt_flags():
    assert plan_of("--grad-ckpt").grad_ckpt is True
    assert plan_of("--no-grad-ckpt").grad_ckpt is False
    assert plan_of().grad_ckpt is False


def test_resume_modes(tmp_path):
    assert plan_of("--resume", "auto").resume_mode == "auto"
    assert plan_of("--resume", "must").resume_mode == "must"
    assert plan_of("--resume", "never").resume_mode == "never"
    p = plan_of("--resume", str(tmp_path))
    assert p.resume_mode == "path" and p.resume_path == tmp_path


def test_cli_rejects_before_any_work_with_exit_2():
    # The mix root does not exist: a rejection that happened after any work would say so instead.
    r = trainer_cli(*BASE, "--grad-ckpt", "--no-grad-ckpt")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "python -m trainer.train: error: --grad-ckpt and --no-grad-ckpt both given: ambiguous, pass exactly one"
    )
    assert r.stdout == ""
    r = trainer_cli(*BASE, "--tokens", "1000")
    # one process: world_size 1, tokens_per_step 128
    assert r.returncode == 2 and "--tokens 1000 is not a multiple of tokens_per_step 128" in r.stderr
    assert "nearest: 896 or 1024" in r.stderr
    r = trainer_cli(*BASE, "--device", "cuda")
    assert r.returncode == 2 and "--device cuda: CUDA is not available" in r.stderr


def test_the_help_names_every_exit_code_the_trainer_returns():
    named = ", ".join(f"{code.value} {code.name.lower().replace('_', ' ')}" for code in Exit)
    assert named == "0 done, 1 error, 2 usage, 3 refused, 4 push failed"
    assert build_parser().epilog.endswith(f"Exit codes: {named}.")


def test_a_hub_knob_out_of_range_stops_the_trainer_with_exit_2_before_any_work():
    r = trainer_cli(*BASE, env={"PATH": "/usr/bin:/bin", "SPECPROBE_HUB_READ_TIMEOUT_S": "inf"})
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "python -m trainer.train: error: SPECPROBE_HUB_READ_TIMEOUT_S='inf': must be a number of seconds > 0 "
        "and at most 86400"
    )
    assert r.stdout == ""


@pytest.mark.parametrize("stop, expect", [(0, [2, 4, 6]), (3, [2, 3]), (4, [2, 4]), (5, [2, 4, 5])])
def test_checkpoint_steps_always_include_the_stop_step(stop, expect):
    assert checkpoint_steps(0, stop or 6, 2) == expect


def test_checkpoint_steps_after_resume():
    assert checkpoint_steps(3, 6, 2) == [4, 6]
    assert checkpoint_steps(6, 6, 2) == []


@pytest.mark.parametrize(
    "requested, device, cap, name, scaler",
    [
        ("auto", "cpu", None, "fp32", False),
        ("fp32", "cpu", None, "fp32", False),
        ("auto", "cuda", (9, 0), "bf16", False),
        ("auto", "cuda", (8, 0), "bf16", False),
        ("auto", "cuda", (7, 5), "fp16", True),  # T4: no bf16 -> fp16 + GradScaler
        ("fp16", "cuda", (9, 0), "fp16", True),
        ("fp32", "cuda", (7, 5), "fp32", False),
    ],
)
def test_precision_choice(requested, device, cap, name, scaler):
    p = choose_precision(requested, device, cap)
    assert (p.name, p.use_scaler) == (name, scaler)
    assert p.line().startswith(f"precision: {name} (")


def test_precision_lines():
    assert choose_precision("auto", "cpu").line() == "precision: fp32 (cpu)"
    assert choose_precision("auto", "cuda", (9, 0)).line() == "precision: bf16 (auto: cuda capability 9.0)"


@pytest.mark.parametrize(
    "requested, device, cap", [("bf16", "cuda", (7, 5)), ("fp16", "cpu", None), ("bf16", "cpu", None)]
)
def test_precision_refusals(requested, device, cap):
    with pytest.raises(UsageError, match=f"--precision {requested}"):
        choose_precision(requested, device, cap)


@pytest.mark.parametrize(
    "flags, device, cap, scope, mode, why",
    [
        ((False, False), "cpu", None, "auto", "off", "auto: cpu"),
        ((False, False), "cuda", (9, 0), "auto", "model", "auto: cuda capability 9.0"),  # H200: measured, it pays
        ((False, False), "cuda", (8, 0), "auto", "model", "auto: cuda capability 8.0"),
        ((False, False), "cuda", (9, 0), "blocks", "blocks", "auto: cuda capability 9.0, scope requested"),
        ((False, False), "cuda", (7, 5), "auto", "off", "auto: cuda capability 7.5 < 8.0, not measured"),  # T4
        ((False, False), "cuda", (7, 5), "model", "off", "auto: cuda capability 7.5 < 8.0, not measured"),
        ((True, False), "cpu", None, "auto", "blocks", "requested"),  # cpu: blocks build in seconds
        ((True, False), "cpu", None, "model", "model", "requested, scope requested"),
        ((True, False), "cuda", (7, 5), "auto", "model", "requested"),
        ((False, True), "cuda", (9, 0), "auto", "off", "requested"),
    ],
)
def test_compile_choice(flags, device, cap, scope, mode, why):
    assert choose_compile(*flags, device, cap, scope) == (mode, why)


@pytest.mark.parametrize(
    "flag, compile_mode, device, on, why",
    [
        ("auto", "model", "cuda", True, "auto: whole-model compile on cuda"),
        ("auto", "blocks", "cuda", False, "auto: needs the whole-model compile (device cuda, compile blocks)"),
        ("auto", "off", "cuda", False, "auto: needs the whole-model compile (device cuda, compile off)"),
        ("auto", "off", "cpu", False, "auto: needs cuda and the whole-model compile (device cpu, compile off)"),
        ("auto", "model", "cpu", False, "auto: needs cuda (device cpu, compile model)"),
        ("on", "model", "cuda", True, "requested"),
        ("off", "model", "cuda", False, "requested"),
    ],
)
def test_cuda_graphs_are_on_exactly_with_the_whole_model_compile_on_cuda(flag, compile_mode, device, on, why):
    assert choose_cuda_graphs(flag, compile_mode, device) == (on, why)


@pytest.mark.parametrize(
    "compile_mode, device, missing",
    [
        ("model", "cpu", "cuda (device cpu, compile model)"),
        ("blocks", "cuda", "the whole-model compile (device cuda, compile blocks)"),
    ],
)
def test_cuda_graphs_on_where_they_cannot_run_is_refused_naming_what_is_missing(compile_mode, device, missing):
    with pytest.raises(UsageError) as e:
        choose_cuda_graphs("on", compile_mode, device)
    assert str(e.value) == f"--cuda-graphs on needs {missing}"


def test_cli_refuses_cuda_graphs_on_cpu_with_exit_2():
    r = trainer_cli(*BASE, "--device", "cpu", "--cuda-graphs", "on")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "python -m trainer.train: error: --cuda-graphs on needs cuda and the whole-model "
        "compile (device cpu, compile off)"
    )


def test_compile_scope_with_no_compile_is_refused():
    with pytest.raises(UsageError, match="--compile-scope model with --no-compile"):
        plan_of("--no-compile", "--compile-scope", "model")


def test_compile_flags_conflict():
    with pytest.raises(UsageError, match="--compile and --no-compile both given"):
        choose_compile(True, True, "cuda", (9, 0))


def test_tok_per_s_leaves_out_the_first_step():
    assert session_tok_per_s([], 100) is None  # trained nothing
    assert session_tok_per_s([4.0], 100) == 25.0  # the only step counts
    assert session_tok_per_s([30.0, 1.0, 1.0, 2.0], 100) == 75.0  # 300 tokens in 4 s: warm-up left out


def test_snapshot_mode_from_env():
    assert snapshot_mode("cuda", {}) == ("async", None)
    assert snapshot_mode("cpu", {}) == ("sync", None)
    assert snapshot_mode("cpu", {"SPECPROBE_SNAPSHOT": "async", "SPECPROBE_SNAPSHOT_CHECK": "2"}) == ("async", 2.0)
    for env in (
        {"SPECPROBE_SNAPSHOT": "fast"},
        {"SPECPROBE_SNAPSHOT_CHECK": "1"},  # check needs async
        {"SPECPROBE_SNAPSHOT": "async", "SPECPROBE_SNAPSHOT_CHECK": "x"},
    ):
        with pytest.raises(UsageError, match="SPECPROBE_SNAPSHOT"):
            snapshot_mode("cpu", env)


def test_snapshot_diff_is_bitwise():
    import torch

    a = {"w": torch.tensor([1.0, -0.0]), "s": {"0": {"step": torch.tensor(3.0)}}, "lr": 0.1}
    assert (
        snapshot_diff(a, {"w": torch.tensor([1.0, -0.0]), "s": {"0": {"step": torch.tensor(3.0)}}, "lr": 0.1})
        == "ok tensors=2"
    )
    assert snapshot_diff(a, {**a, "w": torch.tensor([1.0, 0.0])}) == "MISMATCH /w"  # -0.0 != 0.0 bitwise
    assert snapshot_diff(a, {**a, "w": torch.tensor([1.0, -0.0], dtype=torch.float64)}) == "MISMATCH /w"
    assert snapshot_diff(a, {**a, "lr": 0.2}) == "MISMATCH /lr"


def test_copy_runs_are_consecutive_one_dtype_and_within_the_staging_limit():
    f32, bf16 = torch.float32, torch.bfloat16
    items = [(f32, 4), (f32, 4), (f32, 3), (bf16, 2), (f32, 20), (f32, 1), (f32, 1)]
    assert copy_runs(items, {f32: 10}) == [(0, 2), (2, 3), (3, 4), (4, 5), (5, 7)]  # 20 > 10 goes alone
    assert copy_runs(items, {}) == [(0, 3), (3, 4), (4, 7)]  # no limit: by dtype
    assert copy_runs([], {f32: 10}) == []


def test_host_buffers_copy_every_tensor_bitwise_into_flat_views_reused_across_snapshots():
    g = torch.Generator().manual_seed(0)
    weights = {
        "a": torch.randn(3, 4, generator=g),
        "b": torch.randn(5, generator=g).bfloat16(),
        "c": torch.randn(2, 2, 2, generator=g),
    }
    opt_sd = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(3, 4, generator=g)}},
        "param_groups": [{"lr": 0.1, "params": [0]}],
    }
    hb = HostBuffers(torch.device("cpu"))
    first = hb.reserve(
        [
            ((3, 4), torch.float32),
            ((5,), torch.bfloat16),
            ((2, 2, 2), torch.float32),
            ((), torch.float32),
            ((3, 4), torch.float32),
        ]
    )
    assert first == (12 + 8 + 1 + 12) * 4 + 5 * 2
    assert hb.prepare(weights, opt_sd) == 0 and len(hb.plan.runs) == 3  # f32 a, bf16 b, f32 c+step+m
    prepared = hb.plan
    w, opt, pending, added = hb.start(weights, opt_sd)
    assert added == 0 and pending.finish() == 0.0 and hb.plan is prepared  # the prepared plan, replayed
    assert snapshot_diff((w, opt), (weights, opt_sd)) == "ok tensors=5"
    assert w["a"].data_ptr() != weights["a"].data_ptr()  # copies, not the live tensors
    weights["a"].add_(1.0)  # the next step changes the state
    plan = hb.plan
    w2, _, _, added = hb.start(weights, opt_sd)
    assert added == 0 and w2["a"].data_ptr() == w["a"].data_ptr()  # the same host memory again
    assert hb.plan is plan and torch.equal(w2["a"], weights["a"])  # the copy plan replayed
    weights["c"] = torch.full((2, 2, 2), 7.0)  # a tensor replaced (a resume):
    w3, _, _, _ = hb.start(weights, opt_sd)  # a new plan, the new values
    assert hb.plan is not plan and bool((w3["c"] == 7.0).all())
    _, _, _, added = hb.start({**weights, "d": torch.zeros(7)}, opt_sd)  # a layout not foreseen: grows
    assert added == (12 + 8 + 1 + 12 + 7) * 4


def test_packed_object_round_trips_and_one_too_big_is_refused():
    obj = {"torch": torch.arange(5, dtype=torch.uint8), "pos": 7, "gauss": None, "state": [1, 2, 2**40]}
    t = pack_object(obj, capacity=4096)
    assert t.dtype == torch.uint8 and t.numel() == 4096
    back = unpack_object(t)
    assert torch.equal(back["torch"], obj["torch"]) and {k: v for k, v in back.items() if k != "torch"} == {
        k: v for k, v in obj.items() if k != "torch"
    }
    with pytest.raises(ValueError, match="exceeds the 56 bytes of a packed gather"):
        pack_object(obj, capacity=64)
    with pytest.raises(ValueError, match="does not fit its 4096-byte buffer"):
        unpack_object(torch.full((4096,), 255, dtype=torch.uint8))


@pytest.mark.slow
def test_async_snapshot_path_resumes_bitwise_on_cpu(tmp_path, tmp_path_factory, monkeypatch):
    """The CUDA snapshot path (host buffers allocated once, copies enqueued, the optimizer step waiting
    for them), forced on CPU with a blocking copy to compare at every snapshot: stop at 3, wipe, cold
    resume; the same losses and final weights as the uninterrupted sync-path baseline. In one process: the
    path is each rank's own, and what ranks share in a snapshot (the RNG states gathered to rank 0) is the
    sync path's too, which every 2-rank run takes."""
    import shutil

    from trainer_helpers import (
        baseline,
        explain,
        run_trainer,
        single_cmd,
        store_url,
        weights_sha256,
    )

    base = baseline(tmp_path_factory, nproc=1)
    monkeypatch.setenv("SPECPROBE_SNAPSHOT", "async")
    monkeypatch.setenv("SPECPROBE_SNAPSHOT_CHECK", "0")
    repo, out, runs = store_url(tmp_path / "store"), tmp_path / "out", []
    for stop in (3, 0):
        shutil.rmtree(out, ignore_errors=True)
        r = run_trainer(single_cmd(base.args(out, repo, stop=stop, nproc=1)))
        assert r.rc == 0, explain(r)
        checks = r.starting("CKPT snapshot-check ")
        assert checks and all(" ok tensors=" in line for line in checks), checks
        buffers = r.starting("CKPT snapshot buffers: ")
        assert len(buffers) == 1 and "more bytes" not in buffers[0], buffers  # allocated once, up front
        plans = r.starting("CKPT snapshot plan: ")  # built after the session's first step, not in a push
        first = 1 if stop else 4  # leg 2 resumes from the step-3 checkpoint
        assert len(plans) == 1 and f"after step={first} " in plans[0], plans
        saves = r.starting("CKPT save ")
        assert saves and all(" device_wait_s=0.000" in line for line in saves)
        assert all(line.endswith(" copy_plan=replayed") for line in saves), saves
        for line in saves:  # the pause, split: rng gather / state_dict() / enqueuing the copies
            fields = dict(f.split("=", 1) for f in line.split()[2:] if "=" in f)
            parts = dict(p.split(":") for p in fields["snapshot_parts_s"].split("/"))
            assert list(parts) == ["rng", "state_dict", "copies"] and min(map(float, parts.values())) >= 0
            assert sum(map(float, parts.values())) <= float(fields["snapshot_s"]) + 2e-3, line
        assert r.run_json["ckpt_wait_s_max"] >= 0 and r.run_json["ckpt_pause_s_max"] > 0
        runs.append(r)
    assert {**runs[0].run_json["losses"], **runs[1].run_json["losses"]} == base.run.run_json["losses"]
    assert weights_sha256(repo) == base.final_sha


def test_schedule_values():
    kw = dict(total=10, warmup=2, lr=1.0, min_lr=0.1)
    assert lr_at(1, schedule="cosine", **kw) == 0.5
    assert lr_at(2, schedule="cosine", **kw) == 1.0
    assert lr_at(10, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_at(6, schedule="cosine", **kw) == pytest.approx(0.55)  # the cosine midpoint
    assert lr_at(6, schedule="linear", **kw) == pytest.approx(0.55)
    assert lr_at(4, schedule="linear", **kw) == pytest.approx(1.0 - 0.9 * 2 / 8)
    with pytest.raises(ValueError):
        lr_at(11, schedule="cosine", **kw)


# No subnormal fractions: hypothesis refuses to draw them once a library loaded into the worker has set the
# CPU's flush-to-zero mode (torch 2.5's Inductor kernels, built with -ffast-math, did); a subnormal fraction
# acts as 0, which is drawn.
@given(
    total=st.integers(1, 500),
    warm_frac=st.floats(0, 1, allow_subnormal=False),
    lr=st.floats(1e-5, 1.0),
    min_frac=st.floats(0, 1, allow_subnormal=False),
    schedule=st.sampled_from(["cosine", "linear"]),
)
def test_schedule_is_bounded_and_monotone_after_warmup(total, warm_frac, lr, min_frac, schedule):
    warmup, min_lr = int(total * warm_frac), lr * min_frac
    lrs = [lr_at(s, total=total, warmup=warmup, lr=lr, min_lr=min_lr, schedule=schedule) for s in range(1, total + 1)]
    assert all(0 < v <= lr + 1e-12 for v in lrs[:warmup])  # warmup rises from 0 to lr
    assert all(min_lr - 1e-12 <= v <= lr + 1e-12 for v in lrs[warmup:])
    decay = lrs[warmup:]
    assert all(a >= b - 1e-12 for a, b in zip(decay, decay[1:]))
    assert math.isclose(lrs[-1], min_lr if total > warmup else lr, rel_tol=1e-9, abs_tol=1e-12)


def test_preflight_reports_each_missing_requirement():
    problems, _ = preflight_check(
        gpus=2,
        need_token=True,
        repo="hf://owner/name",
        environ={},
        cuda=lambda: (True, 1, ["Tesla T4"]),
        login_token=lambda: None,
    )
    assert problems == [
        "1 GPU(s) visible, 2 required (Tesla T4)",
        "no Hugging Face token: HF_TOKEN is not set in the environment and `hf auth login` saved none (--need-token)",
    ]
    problems, summary = preflight_check(
        gpus=2,
        need_token=False,
        repo="owner/name",
        environ={"HF_TOKEN": "hf_secretsecret123"},
        cuda=lambda: (True, 2, ["Tesla T4", "Tesla T4"]),
    )
    assert problems == []
    assert summary == "preflight ok: gpus=2 (Tesla T4) repo=owner/name (hub) HF_TOKEN=set"


def test_preflight_cli_exit_3_without_printing_the_token(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HF_TOKEN": "", "HF_HOME": str(tmp_path / "no-login")}
    r = trainer_cli("--gpus", "1", "--repo", "hf://o/n", env=env, module="trainer.preflight")
    assert r.returncode == 3
    assert r.stderr.splitlines() == [
        "preflight: CUDA is not available (torch sees no GPU), 1 GPU(s) required",
        "preflight: no Hugging Face token: HF_TOKEN is not set in the environment and `hf auth login` saved "
        "none (--repo hf://o/n is a Hub repo)",
    ]
    r = trainer_cli(
        "--repo", "o/n", env={"PATH": "/usr/bin:/bin", "HF_TOKEN": "hf_topsecretvalue99"}, module="trainer.preflight"
    )
    assert r.returncode == 0 and "hf_topsecretvalue99" not in r.stdout + r.stderr
    assert r.stdout.strip() == "preflight ok: repo=o/n (hub) HF_TOKEN=set"


def test_preflight_accepts_the_token_hf_auth_login_saved(tmp_path):
    # What `hf auth login` leaves behind: $HF_HOME/token. No HF_TOKEN in the environment.
    (tmp_path / "token").write_text("hf_savedbyloginvalue42\n")
    r = trainer_cli(
        "--need-token",
        "--repo",
        "o/n",
        env={"PATH": "/usr/bin:/bin", "HF_HOME": str(tmp_path)},
        module="trainer.preflight",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "preflight ok: repo=o/n (hub) token=saved (hf auth login)"
    assert "hf_savedbyloginvalue42" not in r.stdout + r.stderr


_SYNC_PROBE = r"""
import json, sys
import torch, torch.distributed as dist
from trainer.dist import Dist, GradientSync
from trainer.model.model import GEOMETRIES, Llama

d = Dist("cpu", __import__("os").environ)
torch.manual_seed(d.rank)                      # a different init on each rank: the sync must make them equal
model = Llama(GEOMETRIES["tiny"])
params = [p for p in model.parameters() if p.requires_grad]
sync = GradientSync(params, d.world_size)
out = {"w0": model.embed_tokens.weight.sum().item()}
x = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(10 + d.rank))
for _ in range(2):                             # two micro-steps accumulated locally, no collective
    (model(x, x)[1] / 2).backward()
out["local"] = [p.grad.clone().tolist() for p in params[:3]]
out["views_before"] = sync.views_intact()
sync.all_reduce()
out["synced"] = [p.grad.tolist() for p in params[:3]]
torch.optim.AdamW(params).zero_grad(set_to_none=False)
out["views_after_zero"] = sync.views_intact() and float(sync.flat.abs().sum()) == 0.0
open(f"{sys.argv[1]}/rank{d.rank}.json", "w").write(json.dumps(out))
dist.barrier()
"""


@pytest.mark.slow
def test_gradient_sync_averages_the_ranks_accumulated_gradients_once_per_step(tmp_path):
    # Two real gloo ranks: rank 0's weights reach rank 1, each rank accumulates its own micro-steps, and one
    # all-reduce leaves every rank with the mean of the two; the gradients stay views of one buffer.
    from trainer_helpers import TORCHRUN, _env

    script = tmp_path / "sync_probe.py"
    script.write_text(_SYNC_PROBE)
    env = {**_env(), "PYTHONPATH": str(REPO_ROOT)}
    r = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc_per_node=2", str(script), str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1))
    assert r0["w0"] == r1["w0"]  # rank 0's init broadcast
    assert r0["local"] != r1["local"]  # different data, different local gradients
    mean = torch.tensor(r0["local"][0]) / 2 + torch.tensor(r1["local"][0]) / 2
    assert torch.allclose(torch.tensor(r0["synced"][0]), mean, rtol=1e-6, atol=1e-9)
    assert r0["synced"] == r1["synced"]  # bitwise the same on both ranks
    assert r0["views_before"] and r0["views_after_zero"] and r1["views_after_zero"]
