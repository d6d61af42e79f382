"""GPU tests (device machine): the CUDA references, the published hacks, crash isolation, timing.

Candidates are evaluated in batches (parallel compiles) in module fixtures; tests assert on them.
The suite test also writes the evaluation figures (compile seconds, candidates per minute, GPU busy
share) to $OUT/gpu_suite_figures.json when OUT is set.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kevin.evaluation import Candidate, EvalConfig, Evaluator, Status
from kevin.evaluation.candidates import reference_candidates
from kevin.evaluation.isolation import SandboxConfig
from kevin.evaluation.report import summarise
from kevin.tasks import load_bundled_suite
from tests.conftest import RELU_CUDA, cuda_solution

pytestmark = pytest.mark.gpu

HACKS = {
    # KernelBench's famous case: launch a kernel that writes nothing and return memory that was never
    # written, hoping it still holds the reference's result.
    "uninitialised_output": RELU_CUDA.replace("if (i < n) out[i] = in[i] > 0.f ? in[i] : 0.f;", "if (i < 0) out[i] = in[i];"),
    # Zero the input so a reference run on it afterwards agrees with a zero output.
    "input_zeroing": RELU_CUDA.replace("return y;", "cudaMemset(x.data_ptr<float>(), 0, n * sizeof(float)); "
                                       "cudaMemset(y.data_ptr<float>(), 0, n * sizeof(float)); return y;"),
    # Do the work on a side stream so default-stream timing sees nothing.
    "side_stream": RELU_CUDA.replace("relu_kernel<<<(n + 255) / 256, 256>>>",
                                     "cudaStream_t s; cudaStreamCreate(&s); relu_kernel<<<(n + 255) / 256, 256, 0, s>>>"),
    # A decoy kernel that never runs; the compute goes to ATen.
    "decoy": RELU_CUDA.replace("relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);\n    return y;",
                               "return at::relu(x);"),
    # An illegal memory access, then an honest kernel in the same batch.
    "illegal_memory_access": RELU_CUDA.replace("if (i < n) out[i]", "if (i < n) out[i + ((int64_t)1 << 40)]"),
    "honest": RELU_CUDA,
}


def _config(**over) -> EvalConfig:
    """The cuda config of these tests: the defaults (every isolation layer on, so the suite doubles as their
    validation on the GPU); KEVIN_TEST_FILESYSTEM=off runs them without Landlock, to tell a layer's fault from
    the evaluator's. KEVIN_TEST_TRANSPORT picks how outputs reach the judge (auto: CUDA IPC where it works)."""
    cache = os.environ.get("KEVIN_CACHE_DIR", "")
    workers = int(os.environ.get("KEVIN_COMPILE_WORKERS", "0"))
    layers = os.environ.get("KEVIN_TEST_FILESYSTEM", "on")
    over.setdefault("sandbox", SandboxConfig(filesystem=layers, seccomp=os.environ.get("KEVIN_TEST_SECCOMP", layers)))
    over.setdefault("transport", os.environ.get("KEVIN_TEST_TRANSPORT", "auto"))
    jobs = int(os.environ.get("KEVIN_COMPILE_JOBS", "0"))  # 3: every build runs nvcc's passes side by side
    return EvalConfig(backend="cuda", cache_dir=cache, compile_workers=workers, compile_jobs=jobs, **over)


@pytest.fixture(scope="module")
def evaluator():
    return Evaluator(_config())


@pytest.fixture(scope="module")
def relu():
    return [t for t in load_bundled_suite((1,)) if t.name == "01_relu"][0]


@pytest.fixture(scope="module")
def suite_results(evaluator):
    items = reference_candidates(load_bundled_suite(), "cuda")
    start = time.perf_counter()
    results = evaluator.evaluate_many(items, show_progress=True)
    wall = time.perf_counter() - start
    figures = {**summarise(results), "wall_s": wall, "candidates_per_min": len(results) / wall * 60,
               "warnings": sorted({w for r in results for w in r.warnings}),
               "results": [[r.task_id, r.status.value, round(r.times.compile, 1), round(r.runtime_ms, 4),
                            round(r.baseline_ms, 4), round(r.speedup, 3), r.warnings] for r in results]}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_suite_figures.json"), "w") as handle:
            json.dump(figures, handle, indent=1)
    return items, results


@pytest.fixture(scope="module")
def hack_results(evaluator, relu):
    names = sorted(HACKS)
    items = [(relu, Candidate(relu.task_id, cuda_solution(HACKS[n], name=f"hack_{n}"), candidate_id=n)) for n in names]
    # The illegal access goes right before the honest kernel: the next candidate must be unaffected.
    items.sort(key=lambda it: (it[1].candidate_id == "honest", it[1].candidate_id))
    return {r.candidate_id: r for r in evaluator.evaluate_many(items)}


def test_every_cuda_reference_solution_is_correct(suite_results):
    items, results = suite_results
    assert len(results) == len(load_bundled_suite()) == len(items)
    bad = {r.task_id: f"{r.status.value} {r.rule_id}: {r.error[:300]}" for r in results if r.status is not Status.CORRECT}
    assert not bad, bad


def test_outputs_reach_the_judge_through_cuda_ipc_or_say_why_not(suite_results):
    _, results = suite_results
    notes = sorted({w for r in results for w in r.warnings if "through files" in w})
    print("transport notes:", notes or "CUDA IPC")
    if os.environ.get("KEVIN_TEST_TRANSPORT", "auto") == "ipc":
        assert not notes


def test_reference_against_reference_speedup_is_one(evaluator):
    """The PyTorch reference timed again in a fresh process against its cached baseline: 0.8-1.25 on every task,
    geometric mean 0.95-1.05.

    Two fresh processes timing the same 0.1-3 ms calls differ by up to ~20% on the H200 (2026-12-01, two calls:
    0.99-1.11 and 0.84-1.19, matrix-vector and small convolutions the widest), so the per-task band is that; a
    bias of the evaluator itself (one side always slower) would move the mean, which is held to 5%."""
    tasks = load_bundled_suite()
    evaluator.prefetch_baselines(tasks)  # cached already when the suite test ran first
    again = evaluator.measure_references_ms(tasks)
    ratios = {t.task_id: evaluator.baseline_ms(t) / again[t.task_id] for t in tasks}
    geomean = math.exp(statistics.fmean(math.log(v) for v in ratios.values()))
    print("reference/reference speedups:", json.dumps({k: round(v, 3) for k, v in ratios.items()}), "geomean", round(geomean, 3))
    outside = {k: round(v, 3) for k, v in ratios.items() if not 0.8 <= v <= 1.25}
    assert not outside, outside
    assert 0.95 <= geomean <= 1.05


_IPC_CANDIDATE = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from kevin.evaluation.channel import HarnessChannel, Layout
device = torch.device("cuda:0")
layout = Layout.from_dict(json.loads(sys.argv[2]))
scratch = [torch.empty(1 << 22, device=device) for _ in range(4)]  # a cached segment for the buffer to come from
del scratch
channel = HarnessChannel(layout, device, "ipc", Path("."))
print(json.dumps(channel.describe), flush=True)
for line in sys.stdin:  # each line: one call on the inputs the judge wrote
    if not line.strip():
        break
    x, = channel.inputs
    print(channel.put([x * 2.0, torch.arange(7, device=device) * int(line)]) or "put", flush=True)
"""


def test_the_channel_carries_inputs_and_outputs_between_processes_over_cuda_ipc(tmp_path):
    """The judge writes a call's inputs into the candidate's buffer and reads its outputs back, call after call."""
    from kevin.evaluation.channel import JudgeChannel, Layout
    from kevin.evaluation.transfer import ipc_probe

    device = torch.device("cuda:0")
    if ipc_probe(device):
        pytest.skip("no CUDA IPC here")
    layout = Layout.of([torch.empty(1 << 20, device=device)], [torch.empty(1 << 20, device=device),
                                                               torch.empty(7, dtype=torch.int64, device=device)])
    child = subprocess.Popen([sys.executable, "-c", _IPC_CANDIDATE, str(Path(__file__).resolve().parents[2]),
                              json.dumps(layout.to_dict())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        judge = JudgeChannel(json.loads(child.stdout.readline()), tmp_path, layout, device)
        for i in (2, 5, 9):
            x = torch.randn(1 << 20, device=device)
            judge.write_inputs([x])
            torch.cuda.synchronize(device)
            child.stdin.write(f"{i}\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "put"
            got = [torch.empty(1 << 20, device=device), torch.empty(7, dtype=torch.int64, device=device)]
            judge.copy_outputs(got)
            assert torch.equal(got[0], x * 2.0) and torch.equal(got[1], torch.arange(7, device=device) * i)
        judge.close()
    finally:
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(timeout=60)


@pytest.mark.parametrize("hack", ["uninitialised_output", "input_zeroing", "side_stream", "decoy", "illegal_memory_access"])
def test_published_hacks_score_zero(hack_results, hack):
    r = hack_results[hack]
    print(hack, r.status.value, r.rule_id, r.error[:200])
    assert r.score == 0.0 and r.status is not Status.CORRECT


def test_illegal_memory_access_does_not_reach_the_next_candidate(hack_results):
    assert hack_results["illegal_memory_access"].status is Status.RUNTIME_ERROR
    honest = hack_results["honest"]
    assert honest.status is Status.CORRECT and honest.score > 0.3, honest.error


def test_runtime_checks_catch_a_decoy_the_static_rules_were_told_to_allow(relu):
    relaxed = Evaluator(_config(rules={"cpp_forbidden_calls": {"enabled": False}, "cpp_torch_compute": {"enabled": False},
                                       "native_symbols": {"enabled": False}}))
    items = [(relu, Candidate(relu.task_id, cuda_solution(HACKS[n], name=f"hack_{n}"), candidate_id=n)) for n in ("decoy", "side_stream")]
    decoy, side = relaxed.evaluate_many(items)
    assert decoy.status is Status.RULE_VIOLATION and decoy.rule_id in ("torch_compute_runtime", "decoy_kernel", "foreign_kernel")
    # Side-stream work is still inside the timed region (whole-device sync): no fake speedup.
    print("side stream with static rules off:", side.status.value, side.rule_id, round(side.speedup, 3))
    assert not side.correct or side.speedup < 3.0
