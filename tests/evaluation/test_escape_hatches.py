"""The native checks against the ways round them an earlier evaluator missed, through a real Evaluator with the
DEFAULT rules (real compiles, cpu backend): loader introspection, raw system calls and counter reads in inline
assembly, PyTorch compute under another name (the dispatcher with the profiler switched off, MKL's GEMM by its C
name, a tensor method, a namespace alias), aten operators re-registered. Each hostile candidate is followed in
the same batch by an honest one, which must still be correct; honest kernels in unusual styles (OpenMP,
at::parallel_for, AVX2 intrinsics with a lookup table, templates, at::vec, KernelBench's flag lists) must be
correct too. The cuda ones are compiled with nvcc and checked without a GPU in test_fast_compile.py.
"""

from __future__ import annotations

import pytest

from kevin.evaluation import Candidate, EvalConfig, Evaluator, Status
from tests.conftest import RELU_BODY, cpp_solution
from tests.evaluation.escape_hatches import honest_cpu, hostile_cpu

HOSTILE = hostile_cpu(cpp_solution)
HONEST = honest_cpu(cpp_solution)


@pytest.fixture(scope="module")
def batch(cache_dir, relu_task):
    config = EvalConfig(backend="cpu", timing_trials=5, warmup_trials=1, correctness_trials=2, timeout_s=20,
                        memory_limit_mb=4096, cache_dir=str(cache_dir))
    honest = cpp_solution(RELU_BODY)
    items = []
    for name, (source, _) in HOSTILE.items():
        items.append((relu_task, Candidate(relu_task.task_id, source, candidate_id=name)))
        items.append((relu_task, Candidate(relu_task.task_id, honest, candidate_id=f"after:{name}")))
    for name, source in HONEST.items():
        items.append((relu_task, Candidate(relu_task.task_id, source, candidate_id=name)))
    with Evaluator(config) as evaluator:
        return {r.candidate_id: r for r in evaluator.evaluate_many(items)}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_candidate_is_refused_by_the_expected_rule(batch, name):
    r = batch[name]
    print(name, r.status.value, r.rule_id, r.error[:200].replace("\n", " "))
    assert r.status is Status.RULE_VIOLATION and r.score == 0.0, (name, r.status, r.error)
    assert r.rule_id == HOSTILE[name][1], (name, r.rule_id, r.error)
    after = batch[f"after:{name}"]
    assert after.status is Status.CORRECT, (name, after.status, after.error)


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_kernel_of_an_unusual_style_is_correct(batch, name):
    r = batch[name]
    assert r.status is Status.CORRECT, (name, r.status, r.rule_id, r.error)


def test_the_messages_name_what_was_found(batch):
    """The policy learns from the message: it names the function or instruction and its class."""
    expect = {"loader_dl_iterate_phdr": "dl_iterate_phdr (loader introspection", "loader_getauxval": "getauxval (loader",
              "loader_environ": "environ (loader", "asm_syscall": "`syscall`", "asm_rdtsc": "`rdtsc`",
              "dispatcher_profiler_off": "main.o calls", "aten_impl_registration": "operator registration",
              "aten_register_operators": "operator registration", "mkl_gemm_by_c_name": "sgemm_",
              "method_compute": "aten::relu", "profiler_switched_off": "the profiler's recording"}
    for name, text in expect.items():
        assert text in batch[name].error, (name, batch[name].error)
