"""The fast CUDA compile path: narrow torch header first, the stock full header when that fails."""

from __future__ import annotations

import shutil
import subprocess
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kevin.evaluation.compiler import CompileFailure, InlineCompiler, kernel_names, lite_variant
from kevin.evaluation.rules import load_rules
from kevin.tasks import bundled_solutions_dir

SIGNATURE = {"name", "cpp_sources", "cuda_sources", "functions", "no_implicit_headers", "build_directory", "verbose", "use_pch"}


def test_lite_variant_swaps_the_heavy_headers_only():
    params = {"name": "x", "cpp_sources": "torch::Tensor f(torch::Tensor x);",
              "cuda_sources": "#include <torch/extension.h>\n#include <cuda_fp16.h>\n__global__ void k() {}\n"}
    lite = lite_variant(params, SIGNATURE)
    cuda = "\n".join(lite["cuda_sources"])
    assert "#include <torch/extension.h>" not in cuda and "#include <cuda_fp16.h>" in cuda
    assert "namespace torch" in cuda and "__global__ void k()" in cuda
    assert lite["cpp_sources"][0] == "#include <torch/extension.h>" and lite["no_implicit_headers"] is True
    assert params["cuda_sources"].startswith("#include <torch/extension.h>")  # the original is untouched
    assert lite_variant({**params, "cuda_sources": None}, SIGNATURE) is None  # cpu extensions: nothing to do
    assert lite_variant(params, SIGNATURE - {"no_implicit_headers"}) is None  # old torch: stock path


def _fake_compiler(tmp_path, fail_lite: bool):
    calls = []

    def original(name, cpp_sources, cuda_sources=None, functions=None, no_implicit_headers=False,
                 build_directory=None, verbose=False, use_pch=False):
        calls.append("lite" if no_implicit_headers else "full")
        if no_implicit_headers and fail_lite:
            raise RuntimeError("error: identifier 'something_from_the_full_header' is undefined")
        return types.SimpleNamespace(f=lambda: 1)

    compiler = InlineCompiler(cache_dir=tmp_path, backend="cuda", rules=load_rules(), original=original)
    return compiler, calls


SOURCE = dict(name="fast_x", cpp_sources="torch::Tensor f(torch::Tensor x);",
              cuda_sources="#include <torch/extension.h>\n__global__ void kern(float* y) {}\n"
                           "torch::Tensor f(torch::Tensor x) { kern<<<1, 1>>>(x.data_ptr<float>()); return x; }\n",
              functions=["f"])


def test_lite_success_is_used(tmp_path):
    compiler, calls = _fake_compiler(tmp_path, fail_lite=False)
    compiler.load_inline(**SOURCE)
    assert calls == ["lite"] and compiler.fast_path == "lite" and compiler.kernels == ["kern"]


def test_lite_failure_falls_back_and_is_remembered(tmp_path):
    compiler, calls = _fake_compiler(tmp_path, fail_lite=True)
    compiler.load_inline(**SOURCE)
    assert calls == ["lite", "full"] and compiler.fast_path == "full-fallback"
    again, calls2 = _fake_compiler(tmp_path, fail_lite=True)  # e.g. the run phase after the compile phase
    again.load_inline(**SOURCE)
    assert calls2 == ["full"]


def test_errors_shown_to_the_policy_come_from_the_full_build(tmp_path):
    def original(name, cpp_sources, cuda_sources=None, functions=None, no_implicit_headers=False,
                 build_directory=None, verbose=False, use_pch=False):
        raise RuntimeError("lite error text" if no_implicit_headers else "full error text")

    compiler = InlineCompiler(cache_dir=tmp_path, backend="cuda", rules=load_rules(), original=original)
    with pytest.raises(CompileFailure, match="full error text"):
        compiler.load_inline(**SOURCE)


def _cuda_sources(solution: Path) -> dict:
    captured = []
    from torch.utils import cpp_extension

    real = cpp_extension.load_inline
    cpp_extension.load_inline = lambda *a, **k: (captured.append(k), types.SimpleNamespace())[1]
    try:
        exec(compile(solution.read_text(), str(solution), "exec"), {"__name__": "sol"})
    finally:
        cpp_extension.load_inline = real
    return captured[0]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_every_bundled_cuda_reference_compiles_on_the_fast_path(tmp_path):
    """nvcc -c of each reference's CUDA translation unit as the fast path writes it (no GPU needed)."""
    import torch

    include = Path(torch.__file__).parent / "include"
    solutions = sorted(bundled_solutions_dir("cuda").rglob("*.py"))
    assert len(solutions) >= 60

    # Sources are captured serially: _cuda_sources patches a module attribute, which threads would race on.
    sources = {solution: _cuda_sources(solution) for solution in solutions}

    def build(solution: Path) -> tuple[str, int, str]:
        lite = lite_variant(sources[solution], SIGNATURE)
        cu = tmp_path / f"{solution.parent.name}_{solution.stem}.cu"
        cu.write_text("\n".join(lite["cuda_sources"]))
        cmd = ["nvcc", "-c", "-std=c++17", "-arch=sm_90", f"-I{include}", f"-I{include}/torch/csrc/api/include",
               "--expt-relaxed-constexpr", "-w", "-DTORCH_EXTENSION_NAME=x", str(cu), "-o", str(cu.with_suffix(".o"))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        return solution.name, proc.returncode, proc.stderr[-800:]

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(build, solutions))
    failed = {name: err for name, rc, err in results if rc != 0}
    assert not failed, failed


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
