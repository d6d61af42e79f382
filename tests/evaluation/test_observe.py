"""What the evaluator makes of a trial's reported observations (RunDriver.observe): the PyTorch ops and GPU kernels
of the forward and of the outputs' hand-over, judged by hand-written reports (the real harness's reports are judged
in test_sandbox_cpu.py and the GPU suite)."""

from __future__ import annotations

import pytest

from kevin.evaluation.config import EvalConfig
from kevin.evaluation.runs import RunDriver, RunPlan
from kevin.evaluation.verdict import Status

OWN = "void relu_kernel<float>(float const*, float*, int)"
CLAMP = "void at::native::vectorized_elementwise_kernel<4, at::native::launch_clamp_scalar(...)>"
COPY = "Memcpy DtoD (Device -> Device)"


def _driver(backend: str) -> RunDriver:
    plan = RunPlan(task={"task_id": "t", "source": ""}, trials=["normal"], timing_trials=1, watched_trial=0,
                   own_kernels=["relu_kernel"], allowed_ops=list(EvalConfig().allowed_runtime_ops), backend=backend,
                   timeout_s=10.0)
    return RunDriver(job=None, judge=None, plan=plan, layers=[])  # observe() reaches neither


def _judged(backend: str, watched: bool = True, **message) -> RunDriver:
    driver = _driver(backend)
    driver.observe({"ext_calls": 1, **message}, watched=watched)
    return driver


def _failure(driver: RunDriver) -> tuple[Status, str, str] | None:
    f = driver.facts.failure
    return None if f is None else (f.status, f.rule_id, f.message)


def test_copies_in_the_hand_over_are_the_harness_own():
    driver = _judged("cpu", ops=["aten::empty_like"], handover_ops=["aten::copy_"])
    assert _failure(driver) is None


def test_compute_in_the_hand_over_is_pytorch_compute():
    driver = _judged("cpu", ops=["aten::empty_like"], handover_ops=["aten::clamp_min", "aten::copy_", "aten::relu"])
    assert _failure(driver) == (Status.RULE_VIOLATION, "torch_compute_runtime",
                                "PyTorch compute ran while the forward's outputs were handed over: aten::clamp_min, "
                                "aten::relu")


def test_a_profiled_trial_must_report_its_hand_over():
    driver = _judged("cpu", ops=["aten::empty_like"])
    assert _failure(driver) == (Status.RULE_VIOLATION, "torch_compute_runtime",
                                "the PyTorch ops of the outputs' hand-over were not reported")


def test_the_forward_is_judged_before_its_hand_over():
    driver = _judged("cpu", ops=["aten::mm"], handover_ops=["aten::relu"])
    assert _failure(driver) == (Status.RULE_VIOLATION, "torch_compute_runtime",
                                "PyTorch compute ran in the forward: aten::mm")


@pytest.mark.parametrize("late, expected", [
    ([], None),
    ([COPY, "Memset (Device)"], None),
    ([COPY, CLAMP], (Status.RULE_VIOLATION, "foreign_kernel",
                     f"kernels ran while the forward's outputs were handed over: {CLAMP}")),
    # The candidate's own kernel after its forward returned: work the forward's profile did not hold.
    ([OWN], (Status.RULE_VIOLATION, "foreign_kernel", f"kernels ran while the forward's outputs were handed over: {OWN}")),
])
def test_gpu_kernels_in_the_hand_over_of_the_watched_trial(late, expected):
    driver = _judged("cuda", ops=["aten::empty_like"], handover_ops=["aten::copy_"], kernels=[OWN], kernel_ms=0.25,
                     handover_kernels=late)
    assert _failure(driver) == expected
    # The kernels' time the evaluator compares with the timed calls: the forward's, taken only from a clean trial.
    assert driver._kernel_ms == (0.25 if expected is None else None)


def test_unwatched_gpu_trials_report_no_profile():
    driver = _judged("cuda", watched=False)
    assert _failure(driver) is None and driver._kernel_ms is None
