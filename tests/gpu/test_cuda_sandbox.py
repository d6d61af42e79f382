"""The hostile-candidate suite on the GPU (device machine), with Landlock's file-system allow-list on.

Same candidates and checks as tests/evaluation/test_sandbox_cpu.py, built as CUDA solutions and judged
by the cuda backend with the static rules relaxed, so the run-time layers alone must contain them.
This is also the validation of `sandbox.filesystem=on` for cuda: every honest kernel after a hostile
one must still be judged correct with the allow-list in force.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kevin.evaluation import EvalConfig, Evaluator, Status
from kevin.evaluation.isolation import SandboxConfig
from kevin.evaluation.kernel_filters import landlock_abi
from tests.conftest import RELU_CUDA, cuda_solution
from tests.evaluation.hostile import COPY_CUDA, hostile_by_class
from tests.evaluation.test_sandbox_cpu import RELAXED, check_contained, check_nothing_escaped, hostile_sources, run_hostile_batch
from tests.gpu.test_cuda_evaluation import _config

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda_batch(tmp_path_factory, relu_task):
    config: EvalConfig = _config(timing_trials=20, warmup_trials=2, timeout_s=20, memory_limit_mb=16384, rules=RELAXED,
                                 sandbox=SandboxConfig(filesystem=os.environ.get("KEVIN_TEST_FILESYSTEM", "on"),
                                                       seccomp=os.environ.get("KEVIN_TEST_SECCOMP", "on")))
    return run_hostile_batch(tmp_path_factory.mktemp("hostile_cuda"), relu_task, Evaluator(config), cuda_solution, RELU_CUDA,
                             COPY_CUDA)


@pytest.mark.parametrize("name", sorted([*hostile_sources(Path("/nonexistent"), 1, cuda_solution, RELU_CUDA),
                                         *hostile_by_class(cuda_solution, RELU_CUDA, COPY_CUDA, "cuda", "/x", "/x")]))
def test_hostile_cuda_candidate_is_contained_and_scores_zero(cuda_batch, name):
    check_contained(cuda_batch, name)


def test_nothing_escaped_on_cuda(cuda_batch):
    check_nothing_escaped(cuda_batch)


def test_landlock_is_in_force_for_cuda_jobs(cuda_batch):
    honest = cuda_batch["results"]["after:write_outside"]
    assert honest.status is Status.CORRECT
    if landlock_abi() == 0:
        pytest.skip("this kernel has no Landlock")
    assert not any("Landlock" in w for w in honest.warnings), honest.warnings
