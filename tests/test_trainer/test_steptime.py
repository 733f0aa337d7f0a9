"""The trainer's per-step times (RUN_JSON step_ms_*, tok_s_median): what is timed and what is left out."""

import time

import pytest
import torch

from trainer.steptime import StepTimer


def test_step_times_leave_out_the_first_step_and_take_the_bench_quantiles():
    timer = StepTimer(torch.device("cpu"))
    for pause in (0.20, 0.01, 0.03, 0.02):  # the first step stands for the compile
        timer.mark()
        time.sleep(pause)
    timer.mark()
    timer.read()
    assert len(timer.ms) == 4 and timer.ms[0] >= 200
    s = timer.summary(tokens_per_step=1000)
    assert 10 <= s["step_ms_min"] < s["step_ms_p50"] < s["step_ms_max"] < 200  # the compile step is not one
    assert s["step_ms_p50"] >= 20 and s["step_ms_p90"] == s["step_ms_max"]
    assert s["tok_s_median"] == pytest.approx(1000 / (s["step_ms_p50"] / 1000), rel=1e-3)


def test_marks_are_read_in_batches_without_losing_a_step():
    timer = StepTimer(torch.device("cpu"))
    timer.mark()
    timer.read()  # one mark: nothing finished yet
    assert timer.ms == []
    for _ in range(3):
        timer.mark()
        timer.read()  # as the loop does at each flush: the step just marked stays open
    assert len(timer.ms) == 3


def test_a_session_without_steps_reports_null_figures():
    assert set(StepTimer(torch.device("cpu")).summary(100).values()) == {None}
