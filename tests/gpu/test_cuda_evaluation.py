"""GPU tests (device machine): the CUDA references, the published hacks, and crash isolation."""

from __future__ import annotations

import pytest

from kevin.evaluation import Candidate, EvalConfig, Evaluator, Status
from kevin.evaluation.candidates import reference_candidates
from kevin.tasks import load_bundled_suite

pytestmark = pytest.mark.gpu

RELU_CUDA = r'''
__global__ void relu_kernel(const float* in, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] > 0.f ? in[i] : 0.f;
}
torch::Tensor relu_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
'''


def cuda_solution(body: str, name: str, extra_flags: str = "") -> str:
    return f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
{body}
"""
ext = load_inline(name="{name}", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources=cuda_src,
                  functions=["relu_forward"], verbose=False{extra_flags})


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.relu_forward(x)
'''


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    import os

    cache = os.environ.get("KEVIN_CACHE_DIR") or str(tmp_path_factory.mktemp("cache"))
    return Evaluator(EvalConfig(backend="cuda", cache_dir=cache, compile_workers=int(os.environ.get("KEVIN_COMPILE_WORKERS", "0"))))


@pytest.fixture(scope="module")
def relu(evaluator):
    return [t for t in load_bundled_suite((1,)) if t.name == "01_relu"][0]


def test_every_cuda_reference_solution_is_correct(evaluator):
    tasks = load_bundled_suite()
    items = reference_candidates(tasks, "cuda")
    assert len(items) == len(tasks)
    results = evaluator.evaluate_many(items, show_progress=True)
    bad = {r.task_id: f"{r.status.value} {r.rule_id}: {r.error[:300]}" for r in results if r.status is not Status.CORRECT}
    assert not bad, bad


def test_reference_against_reference_speedup_is_one(evaluator):
    """The PyTorch reference timed in a fresh process against its cached baseline: 0.9-1.1 on every task."""
    ratios = {}
    for task in load_bundled_suite():
        cached = evaluator.baseline_ms(task)
        fresh = evaluator.measure_reference_ms(task)
        ratios[task.task_id] = cached / fresh
    outside = {k: round(v, 3) for k, v in ratios.items() if not 0.9 <= v <= 1.1}
    print("reference/reference speedups:", {k: round(v, 3) for k, v in ratios.items()})
    assert not outside, outside


HACKS = {
    # KernelBench's famous case: return memory that was never written, hoping it holds the reference's result.
    "uninitialised_output": "torch::Tensor relu_forward(torch::Tensor x) { return torch::empty_like(x); }",
    # Zero the input so the reference, run afterwards on it, agrees with a zero output.
    "input_zeroing": RELU_CUDA.replace("return y;", "cudaMemset(x.data_ptr<float>(), 0, n * sizeof(float)); cudaMemset(y.data_ptr<float>(), 0, n * sizeof(float)); return y;"),
    # Do the work on a side stream so default-stream timing sees nothing.
    "side_stream": RELU_CUDA.replace("relu_kernel<<<(n + 255) / 256, 256>>>", "cudaStream_t s; cudaStreamCreate(&s); relu_kernel<<<(n + 255) / 256, 256, 0, s>>>"),
    # A decoy kernel that never runs; the compute goes to ATen.
    "decoy": RELU_CUDA.replace("relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);\n    return y;", "return at::relu(x);"),
}


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_published_hacks_score_zero(evaluator, relu, hack):
    r = evaluator.evaluate(relu, cuda_solution(HACKS[hack], name=f"hack_{hack}"))
    assert r.score == 0.0 and r.status is not Status.CORRECT, (r.status, r.rule_id, r.error)


@pytest.mark.parametrize("hack", ["side_stream", "decoy"])
def test_runtime_checks_catch_hacks_the_static_rules_were_told_to_allow(evaluator, relu, hack):
    cfg = EvalConfig(**{**evaluator.config.to_dict(), "rules": {"cpp_forbidden_calls": {"enabled": False},
                                                               "cpp_torch_compute": {"enabled": False}}})
    r = Evaluator(cfg).evaluate(relu, cuda_solution(HACKS[hack], name=f"hack_rt_{hack}"))
    if hack == "decoy":
        assert r.status is Status.RULE_VIOLATION and r.rule_id in ("torch_compute_runtime", "decoy_kernel", "foreign_kernel")
    else:  # side-stream work is still timed (whole-device sync): correct, and no faster than honest work
        assert r.status in (Status.CORRECT, Status.RULE_VIOLATION)
        if r.correct:
            assert r.speedup < 3.0


def test_illegal_memory_access_then_correct_in_one_batch(evaluator, relu):
    ima = RELU_CUDA.replace("if (i < n) out[i]", "if (i < n) out[i + (int64_t)1 << 40]")
    items = [(relu, Candidate(relu.task_id, cuda_solution(ima, name="ima"), candidate_id="ima")),
             (relu, Candidate(relu.task_id, cuda_solution(RELU_CUDA, name="relu_ok"), candidate_id="ok"))]
    first, second = evaluator.evaluate_many(items)
    assert first.status is Status.RUNTIME_ERROR and first.score == 0.0
    assert second.status is Status.CORRECT and second.score > 0.3
