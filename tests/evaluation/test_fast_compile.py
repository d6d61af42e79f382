"""Our build on the cuda backend, without a GPU: every bundled CUDA reference compiles on the narrow-header
path (nvcc for the kernels, the host translation unit with the operator registration) and passes the native
checks; the cuda escape hatches of tests/gpu/test_cuda_escape_hatches.py are refused from nvcc's objects; and kernel
names are read right whatever attributes a kernel carries."""

from __future__ import annotations

import os
import shutil
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kevin.evaluation.build_sources import ExtensionRequest, kernel_names
from kevin.evaluation.builder import MAX_COMPILE_JOBS, compile_objects, prepare_headers
from kevin.evaluation.config import EvalConfig
from kevin.evaluation.headers import fallback_needed, load_full_only
from kevin.evaluation.rules import load_rules
from kevin.evaluation.symbols import library_hits
from kevin.evaluation.toolchain import Toolchain
from kevin.tasks import bundled_solutions_dir


def _load_inline_kwargs(solution: Path) -> dict:
    captured = []
    from torch.utils import cpp_extension

    real = cpp_extension.load_inline
    cpp_extension.load_inline = lambda *a, **k: (captured.append(k), types.SimpleNamespace())[1]
    try:
        exec(compile(solution.read_text(), str(solution), "exec"), {"__name__": "sol"})
    finally:
        cpp_extension.load_inline = real
    return captured[0]


def _cuda_sources(solution: Path) -> dict:
    return _load_inline_kwargs(solution)


@pytest.fixture(scope="module")
def cuda_toolchain(tmp_path_factory):
    """The cuda toolchain with its headers prepared, shared by this file's builds: preparing them takes two
    minutes on 2 cores, and both builds below need the same ones."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
        toolchain = Toolchain.detect("cuda", str(tmp_path_factory.mktemp("cuda-headers")))
        assert prepare_headers(toolchain) == ""
        yield toolchain


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_failed_cuda_build_goes_to_the_full_headers_only_for_a_name_they_alone_declare(cuda_toolchain):
    """The listing ``fallback_needed`` reads, on the cuda toolchain: cuda.h's functions and macros are in it; a
    keyword or type the narrow headers declare too is not, nor one-letter names. Before, every word of cuda.h was in
    it, so the commonest failed builds of a training run (`argument of type "float *"`, `identifier "h" is
    undefined`) were compiled a second time against the full headers, for the same errors (32 s against 6 s on an
    H100, docs/gpu_runs.md)."""
    full_only = load_full_only(cuda_toolchain)
    assert full_only is not None
    assert {"cuMemAlloc", "cuLaunchKernel", "CUDA_VERSION", "CU_LAUNCH_PARAM_END"} <= full_only
    assert not {"int", "float", "double", "const", "unsigned", "size_t", "at", "Tensor"} & full_only
    assert not {name for name in full_only if len(name) == 1} - {"P"}  # "P": a name of the full torch headers' own
    assert not fallback_needed('cuda.cu(10): error: argument of type "float *" is incompatible with parameter of '
                               'type "int"', full_only)
    assert not fallback_needed('cuda.cu(4): error: identifier "h" is undefined', full_only)
    assert fallback_needed('cuda.cu(3): error: identifier "cuMemAlloc" is undefined', full_only)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_bundled_cuda_references_compile_on_the_narrow_header_path(cuda_toolchain, tmp_path):
    """Both translation units of each reference as our build writes them (no GPU needed to compile).

    Every twelfth reference by default (5 of 60, both levels, ~1.5 min on 2 cores instead of ~15): the GPU suite
    builds, checks and runs all 60 (docs/gpu_runs.md); KEVIN_TEST_ALL_CUDA_BUILDS=1 builds all 60 here."""
    toolchain = cuda_toolchain
    solutions = sorted(bundled_solutions_dir("cuda").rglob("*.py"))
    assert len(solutions) >= 60
    if os.environ.get("KEVIN_TEST_ALL_CUDA_BUILDS") != "1":
        solutions = solutions[::12]
    assert {s.parent.name for s in solutions} == {"level1", "level2"}
    # Arguments are captured serially: capturing patches a module attribute, which threads would race on.
    requests = {solution: ExtensionRequest.from_call(_load_inline_kwargs(solution)) for solution in solutions}

    rule = load_rules()["native_symbols"]

    def build(solution: Path) -> tuple[str, str]:
        folder = tmp_path / f"{solution.parent.name}_{solution.stem}"
        # As a lone compile builds: nvcc's host and device passes side by side (kevin/evaluation/nvcc.py).
        _, errors = compile_objects(requests[solution], toolchain, folder, lite=True, jobs=MAX_COMPILE_JOBS)
        if errors:
            return solution.name, errors[-1500:]
        # An honest kernel's objects call nothing the native_symbols rule refuses (the whole point of our build).
        return solution.name, "; ".join(h.message for h in library_hits(folder, rule, EvalConfig().allowed_runtime_ops))

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        failed = {name: err for name, err in pool.map(build, solutions) if err}
    assert not failed, failed


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_cuda_escape_hatches_are_seen_in_nvccs_objects_without_a_gpu(cuda_toolchain, tmp_path):
    """The cuda candidates of tests/gpu/test_cuda_escape_hatches.py, compiled as the evaluator compiles them (nvcc's
    host object of the .cu, the host unit) and checked here, where there is no GPU to run them: each hostile one is
    refused by the rule the GPU test expects, and no honest one by any."""
    from kevin.evaluation.rules import static_hits
    from tests.conftest import cuda_solution
    from tests.evaluation.escape_hatches import honest_cuda, hostile_cuda

    toolchain = cuda_toolchain
    rules = load_rules()
    cases = {name: (source, rule) for name, (source, rule) in hostile_cuda(cuda_solution).items()}
    cases.update({name: (source, "") for name, source in honest_cuda(cuda_solution).items()})
    requests, verdicts = {}, {}
    for name, (source, _) in cases.items():
        static = [h.rule_id for h in static_hits(source, "cuda", rules)]
        if static:
            verdicts[name] = static[0]
            continue
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        requests[name] = ExtensionRequest.from_call(_load_inline_kwargs(path))

    def build(name: str) -> tuple[str, str]:
        folder = tmp_path / name
        _, errors = compile_objects(requests[name], toolchain, folder, lite=True, jobs=MAX_COMPILE_JOBS)
        assert not errors, (name, errors[-2000:])
        hits = library_hits(folder, rules["native_symbols"], EvalConfig().allowed_runtime_ops)
        return name, hits[0].rule_id if hits else ""

    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts.update(dict(pool.map(build, sorted(requests))))
    assert verdicts == {name: rule for name, (_, rule) in cases.items()}


@pytest.mark.parametrize("source, names", [
    ("__global__ void __launch_bounds__(256) gemm_tiled_kernel(const float* a)", ["gemm_tiled_kernel"]),
    ("__global__ void __launch_bounds__(SCAN_THREADS, 2) cumsum(float* y)", ["cumsum"]),
    ("__global__ __launch_bounds__(128) void k2(int n)", ["k2"]),
    ("template <typename scalar_t>\n__global__ void relu_kernel(const scalar_t* __restrict__ x, scalar_t* y)", ["relu_kernel"]),
    ('extern "C" __global__ void __launch_bounds__(MAX(1, (2))) k3(int n)', ["k3"]),
    ("void __global__ k4(int n)", ["k4"]),
    ("__global__ static void __attribute__((noinline)) k5(int n)", ["k5"]),
    ("// __global__ void fake(int)\n/* __global__ void fake2(int) */ __global__ void real(int)", ["real"]),
    ("__global__ void __cluster_dims__(2, 1, 1) k6(float* x)", ["k6"]),
    ("#define BOUNDS __launch_bounds__(256)\n__global__ void BOUNDS k7(float* x)", ["k7"]),  # behind a macro
])
def test_kernel_names_see_through_attributes_and_comments(source, names):
    # An attribute read as the kernel's name made every honest kernel declared with
    # `__launch_bounds__` after its return type fail the decoy check on the GPU.
    assert kernel_names([source]) == names


def test_every_bundled_cuda_reference_declares_named_kernels():
    import re

    for solution in sorted(bundled_solutions_dir("cuda").rglob("*.py")):
        cuda = _cuda_sources(solution)["cuda_sources"]
        cuda = [cuda] if isinstance(cuda, str) else cuda
        names = kernel_names(cuda)
        assert names and len(names) == len(re.findall(r"__global__", "\n".join(cuda))), (solution.name, names)
        assert not any(n.startswith("__") for n in names), (solution.name, names)
