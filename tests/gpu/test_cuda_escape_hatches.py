"""The native checks on the cuda backend (device machine): the cuda equivalents of the hostile candidates of
tests/evaluation/test_escape_hatches.py (a raw system call and loader introspection in the .cu's host code, the
dispatcher with the profiler switched off, cuBLAS by its C name, an aten IMPL registration in cpp_sources, a
namespace alias), each followed by an honest kernel, and honest kernels of unusual styles (templates with shared
and constant memory, KernelBench's flag lists), through a real Evaluator with the DEFAULT rules."""

from __future__ import annotations

import pytest

from kevin.evaluation import Candidate, Evaluator, Status
from tests.conftest import RELU_CUDA, cuda_solution
from tests.evaluation.escape_hatches import honest_cuda, hostile_cuda
from tests.gpu.test_cuda_evaluation import _config

pytestmark = pytest.mark.gpu

HOSTILE = hostile_cuda(cuda_solution)
HONEST = honest_cuda(cuda_solution)


@pytest.fixture(scope="module")
def cuda_batch(relu_task):
    honest = cuda_solution(RELU_CUDA)
    items = []
    for name, (source, _) in HOSTILE.items():
        items.append((relu_task, Candidate(relu_task.task_id, source, candidate_id=name)))
        items.append((relu_task, Candidate(relu_task.task_id, honest, candidate_id=f"after:{name}")))
    for name, source in HONEST.items():
        items.append((relu_task, Candidate(relu_task.task_id, source, candidate_id=name)))
    with Evaluator(_config(timing_trials=10, warmup_trials=2, correctness_trials=2, timeout_s=30)) as evaluator:
        return {r.candidate_id: r for r in evaluator.evaluate_many(items)}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_cuda_candidate_is_refused_by_the_expected_rule(cuda_batch, name):
    r = cuda_batch[name]
    print(name, r.status.value, r.rule_id, r.error[:200].replace("\n", " "))
    assert r.status is Status.RULE_VIOLATION and r.rule_id == HOSTILE[name][1], (name, r.status, r.rule_id, r.error)
    after = cuda_batch[f"after:{name}"]
    assert after.status is Status.CORRECT, (name, after.status, after.error)


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_cuda_kernel_of_an_unusual_style_is_correct(cuda_batch, name):
    r = cuda_batch[name]
    assert r.status is Status.CORRECT, (name, r.status, r.rule_id, r.error)
