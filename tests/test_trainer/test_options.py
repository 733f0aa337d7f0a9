"""trainer/model/options.py: the model options come from their environment variables only, a bad value is refused
naming the variable (exit 2 before any work), and the options are printed, hashed and recorded as they are.
The trainer runs that show them in RUN_JSON, trainer_state.json and a refused resume are in
tests/test_trainer/test_resume_exact.py and tests/test_trainer/test_refusals.py."""

from __future__ import annotations

import dataclasses
import io
import logging
import re
import warnings

import pytest
from trainer_helpers import PLAN_ARGS, trainer_cli

from trainer.log import setup_logging
from trainer.model.options import ModelOptions, OptionError, env_names
from trainer.runconfig import config_changes, config_hash

DEFAULTS = {
    "bf16_residual": True,
    "fp32_wgrad": True,
    "addmm_fp32": True,
    "sdpa_gqa": None,
    "loss_chunk_rows": 0,
    "fused_ce": True,
    "lean_activations": False,
    "combo_kernels": False,
}


def test_defaults_without_any_variable_are_the_shipped_ones():
    assert ModelOptions.from_env({}).as_dict() == DEFAULTS
    assert ModelOptions.from_env({"UNRELATED": "1", "SPECPROBE_BF16_RESIDUAL": ""}).as_dict() == DEFAULTS


def test_each_option_is_read_from_its_own_variable():
    names = env_names()
    assert names == {k: "SPECPROBE_" + k.upper() for k in DEFAULTS}
    env = {
        names["bf16_residual"]: "0",
        names["fp32_wgrad"]: "0",
        names["addmm_fp32"]: "0",
        names["sdpa_gqa"]: "1",
        names["loss_chunk_rows"]: "1024",
        names["fused_ce"]: "0",
        names["lean_activations"]: "1",
        names["combo_kernels"]: "1",
    }
    assert ModelOptions.from_env(env).as_dict() == {
        "bf16_residual": False,
        "fp32_wgrad": False,
        "addmm_fp32": False,
        "sdpa_gqa": True,
        "loss_chunk_rows": 1024,
        "fused_ce": False,
        "lean_activations": True,
        "combo_kernels": True,
    }
    assert ModelOptions.from_env({names["sdpa_gqa"]: "0"}).sdpa_gqa is False


@pytest.mark.parametrize(
    "var, value, says",
    [
        ("SPECPROBE_BF16_RESIDUAL", "yes", "1 (on) or 0 (off); unset = on"),
        ("SPECPROBE_COMBO_KERNELS", "true", "1 (on) or 0 (off); unset = off"),
        ("SPECPROBE_SDPA_GQA", "auto", "1 (on) or 0 (off); unset = auto"),
        ("SPECPROBE_LOSS_CHUNK_ROWS", "-5", "a whole number of rows >= 0 (0 = the automatic rule)"),
        ("SPECPROBE_LOSS_CHUNK_ROWS", "²", "a whole number of rows >= 0 (0 = the automatic rule)"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_what_it_takes(var, value, says):
    with pytest.raises(OptionError) as e:
        ModelOptions.from_env({var: value})
    assert str(e.value) == f"{var}={value!r}: {says}"


def test_a_bad_value_set_in_code_is_refused_too():
    with pytest.raises(OptionError, match="model option loss_chunk_rows=-1"):
        ModelOptions(loss_chunk_rows=-1)
    with pytest.raises(OptionError, match="model option fp32_wgrad='0'"):
        ModelOptions(fp32_wgrad="0")


def test_the_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelOptions().bf16_residual = False


def test_options_line_names_every_option():
    assert ModelOptions().line() == (
        "model options: bf16_residual=on fp32_wgrad=on addmm_fp32=on sdpa_gqa=auto "
        "loss_chunk_rows=auto fused_ce=on lean_activations=off combo_kernels=off"
    )
    resolved = ModelOptions(loss_chunk_rows=2048, bf16_residual=False).resolved("cuda", (9, 0))
    assert "bf16_residual=off" in resolved.line() and "sdpa_gqa=on" in resolved.line()
    assert "loss_chunk_rows=2048" in resolved.line()


def test_only_the_numerics_options_enter_the_config_hash():
    assert ModelOptions().numerics() == {"bf16_residual": True, "fp32_wgrad": True, "addmm_fp32": True}
    base = {
        "model": "tiny",
        "seq_len": 32,
        "micro_batch": 2,
        "accum": 2,
        "world_size": 2,
        "tokens": 1536,
        "lr": 3e-3,
        "min_lr": 3e-4,
        "warmup_steps": 2,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "seed": 1337,
        "schedule": "cosine",
        "precision": "fp32",
        "mix": "0" * 64,
    }

    def h(**kw) -> str:
        return config_hash({**base, "numerics": ModelOptions(**kw).numerics()})

    assert h() == h(combo_kernels=True, lean_activations=True, sdpa_gqa=True, loss_chunk_rows=512, fused_ce=False)
    assert len({h(), h(bf16_residual=False), h(fp32_wgrad=False), h(addmm_fp32=False)}) == 4


def test_config_changes_name_the_field_with_old_and_new_values():
    old = {"lr": 0.001, "numerics": {"bf16_residual": True, "fp32_wgrad": True}, "grad_clip": 1.0}
    new = {"lr": 0.001, "numerics": {"bf16_residual": False, "fp32_wgrad": True}, "grad_clip": 0.5}
    assert config_changes(old, new) == ["grad_clip: 1.0 -> 0.5", "numerics.bf16_residual: true -> false"]
    assert config_changes({"lr": 0.001}, new) == [
        "grad_clip: (absent) -> 0.5",
        "numerics.bf16_residual: (absent) -> false",
        "numerics.fp32_wgrad: (absent) -> true",
    ]
    assert config_changes({**old, "lr": 0.002}, old) == ["lr: 0.002 -> 0.001"]


def test_trainer_refuses_a_bad_option_value_with_exit_2_before_any_work():
    env = {"PATH": "/usr/bin:/bin", "SPECPROBE_FP32_WGRAD": "on"}
    r = trainer_cli(*PLAN_ARGS, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "python -m trainer.train: error: SPECPROBE_FP32_WGRAD='on': 1 (on) or 0 (off); unset = on"
    )
    assert r.stdout == ""


def test_logging_carries_the_time_and_the_rank_for_hub_warnings_and_python_warnings():
    stream = io.StringIO()
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        setup_logging(3, stream)
        setup_logging(3, stream)  # configured once: a second call replaces, not adds
        logging.getLogger("trainer.hub").warning(
            "hub: %s: commit try %d/%d failed (%s); retrying in %.2fs", "probe/x", 1, 6, "HTTP 503", 0.05
        )
        logging.getLogger("trainer.hub").info("not shown: the root keeps Python's WARNING level")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn(
                "fused cross-entropy unavailable (RuntimeError: x); using eager ops", RuntimeWarning, stacklevel=1
            )
    finally:
        logging.captureWarnings(False)
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)
    stamp = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} rank 3 WARNING "
    # A warning's record is followed by its source line; every record starts with the stamp.
    lines = [line for line in stream.getvalue().splitlines() if line.strip() and not line.startswith(" ")]
    assert len(lines) == 2, stream.getvalue()
    assert re.match(
        stamp + r"trainer\.hub: hub: probe/x: commit try 1/6 failed \(HTTP 503\); retrying in 0\.05s$", lines[0]
    ), lines[0]
    assert re.match(stamp + r"py\.warnings: .*RuntimeWarning: fused cross-entropy unavailable", lines[1]), lines[1]
