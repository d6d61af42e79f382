"""Candidates for the native checks (symbols.py): hostile ones, one per way round the static rules that an earlier
evaluator missed, and honest ones written in unusual styles that must stay correct. Shared by the cpu test
(test_escape_hatches.py, a real Evaluator with the default rules) and the cuda ones (tests/gpu on the device, and
test_fast_compile.py, which compiles them with nvcc and checks the objects without a GPU).

Each hostile candidate is a working relu that also does the forbidden thing, spelled so the text rules do not
see it (``using namespace at;``, ``extern "C"`` declarations, inline assembly): what must refuse it is the check
of what was compiled.
"""

from __future__ import annotations

from typing import Callable

from tests.conftest import RELU_BODY, RELU_CUDA

# ------------------------------------------------------------------------------------------- hostile

LOADER_WALK = r"""
#include <link.h>
#include <cstring>
// Finds the interpreter's functions by walking the loaded objects' symbol tables (names only in string data).
static int kevin_visit(struct dl_phdr_info* info, size_t, void* found) {
    if (info->dlpi_name && std::strstr(info->dlpi_name, "python")) *static_cast<int*>(found) = 1;
    return 0;
}
static int kevin_walk() { int found = 0; dl_iterate_phdr(kevin_visit, &found); return found; }
static int kevin_walked = kevin_walk();
"""

AUXV = r"""
extern "C" unsigned long getauxval(unsigned long type);
static unsigned long kevin_phdr = getauxval(3);  // AT_PHDR: the program's headers, then its dynamic section
"""

ENVIRON = r"""
extern "C" char** environ;
// The environment pointers end where the auxiliary vector starts (volatile: kept however unused).
static char** kevin_env_end() { char** p = environ; while (*p) ++p; return p + 1; }
static char** volatile kevin_auxv = kevin_env_end();
"""

RAW_SYSCALL = r"""
static long kevin_raw_getpid() {
    long ret;
    asm volatile("syscall" : "=a"(ret) : "a"(39L) : "rcx", "r11", "memory");
    return ret;
}
static long kevin_pid = kevin_raw_getpid();
"""

RDTSC = r"""
#include <x86intrin.h>
static unsigned long long kevin_cycles() { return __rdtsc(); }
static unsigned long long kevin_t0 = kevin_cycles();
"""

# PyTorch's own relu looked up by name in the dispatcher, with the profiler's recording and the dispatcher's
# thread-local keys switched off, so no operator would show in the profile.
DISPATCHER = r"""
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
using namespace at;
torch::Tensor relu_forward(torch::Tensor x) {
    RecordFunctionGuard no_profile(false);
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset);
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::relu", "").typed<Tensor(const Tensor&)>();
    return op.call(x);
}
"""

PROFILER_OFF = r"""
#include <ATen/record_function.h>
using namespace at;
static bool kevin_off = (enableRecordFunction(false), true);
"""

# The harness's own tensor operations rerouted to the candidate: an IMPL registration for aten.
ATEN_IMPL = r"""
static at::Tensor kevin_fake_allclose(const at::Tensor& a, const at::Tensor& b, double, double, bool) {
    return torch::ones({}, a.options().dtype(torch::kBool));
}
TORCH_LIBRARY_IMPL(aten, CPU, m) { m.impl("isclose", kevin_fake_allclose); }
"""

REGISTER_OPERATORS = r"""
#include <ATen/core/op_registration/op_registration.h>
static at::Tensor kevin_copy(at::Tensor x) { return x; }
static auto kevin_registry = c10::RegisterOperators().op("aten::kevin_copy(Tensor x) -> Tensor", &kevin_copy);
"""

# MKL's GEMM, exported by libtorch_cpu under its plain C name: compute that no PyTorch operator records.
MKL_GEMM = r"""
extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                       const int*, const float*, const int*, const float*, float*, const int*);
torch::Tensor gemm_probe(torch::Tensor a) {
    int n = 1; float one = 1.f, zero = 0.f;
    auto c = torch::empty_like(a);
    sgemm_("N", "N", &n, &n, &n, &one, a.data_ptr<float>(), &n, a.data_ptr<float>(), &n, &zero, c.data_ptr<float>(), &n);
    return c;
}
"""

ALIAS_COMPUTE = "namespace Q = at;\ntorch::Tensor relu_forward(torch::Tensor x) { return Q::relu(x); }\n"
# A tensor method: the text rules do not judge method names (a name says nothing about its object's type); the
# method compiles to a call of the operator, which the symbol check judges.
METHOD_COMPUTE = "torch::Tensor relu_forward(torch::Tensor x) { return x.contiguous().relu(); }\n"


def hostile_cpu(solution: Callable[..., str]) -> dict[str, tuple[str, str]]:
    """name -> (solution source, the rule that must refuse it). ``solution(body, name=...)`` builds a cpu relu
    solution around a C++ body (tests.conftest.cpp_solution)."""
    relu = RELU_BODY
    return {
        "loader_dl_iterate_phdr": (solution(LOADER_WALK + relu, name="x_walk"), "native_symbols"),
        "loader_getauxval": (solution(AUXV + relu, name="x_auxv"), "native_symbols"),
        "loader_environ": (solution(ENVIRON + relu, name="x_env"), "native_symbols"),
        "asm_syscall": (solution(RAW_SYSCALL + relu, name="x_sys"), "native_symbols"),
        "asm_rdtsc": (solution(RDTSC + relu, name="x_tsc"), "native_symbols"),
        "dispatcher_profiler_off": (solution(DISPATCHER, name="x_disp"), "native_symbols"),
        "profiler_switched_off": (solution(PROFILER_OFF + relu, name="x_prof"), "native_symbols"),
        "aten_impl_registration": (solution(ATEN_IMPL + relu, name="x_impl"), "native_symbols"),
        "aten_register_operators": (solution(REGISTER_OPERATORS + relu, name="x_regop"), "native_symbols"),
        "mkl_gemm_by_c_name": (solution(MKL_GEMM + relu, name="x_mkl"), "native_symbols"),
        # A namespace alias is read as the name it stands for by the text rule; a tensor method is seen by the
        # symbol check as the operator it calls, whatever the spelling.
        "alias_compute": (solution(ALIAS_COMPUTE, name="x_alias"), "cpp_torch_compute"),
        "method_compute": (solution(METHOD_COMPUTE, name="x_method"), "native_symbols"),
    }


# -------------------------------------------------------------------------------------------- honest

OPENMP = r"""
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const int64_t n = xc.numel();
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] > 0.f ? in[i] : 0.f;
    return y;
}
"""

PARALLEL_FOR = r"""
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const int64_t threads = at::get_num_threads();
    at::parallel_for(0, xc.numel(), 2048, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = in[i] > 0.f ? in[i] : 0.f;
    });
    TORCH_CHECK(threads >= 1);
    return y;
}
"""

SIMD = r"""
#include <immintrin.h>
#include <array>
// AVX2 with a lookup table of tail masks; a scalar path where the CPU has no AVX2.
static const std::array<int, 16> kMask = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
__attribute__((target("avx2"))) static void relu_avx2(const float* in, float* out, int64_t n) {
    const __m256 zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_max_ps(_mm256_loadu_ps(in + i), zero));
    if (i < n) {
        const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask.data() + 8 - (n - i)));
        _mm256_maskstore_ps(out + i, mask, _mm256_max_ps(_mm256_maskload_ps(in + i, mask), zero));
    }
}
static void relu_sse(const float* in, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(out + i, _mm_max_ps(_mm_loadu_ps(in + i), _mm_setzero_ps()));
    for (; i < n; ++i) out[i] = in[i] > 0.f ? in[i] : 0.f;
}
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    if (__builtin_cpu_supports("avx2")) relu_avx2(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel());
    else relu_sse(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel());
    return y;
}
"""

TEMPLATES = r"""
#include <vector>
namespace kernels {
template <typename T> struct Relu { T operator()(T v) const { return v > T(0) ? v : T(0); } };
template <typename T, typename Op> class Mapper {
public:
    explicit Mapper(Op op) : op_(op) {}
    void run(const T* in, T* out, int64_t n) const { for (int64_t i = 0; i < n; ++i) out[i] = op_(in[i]); }
private:
    Op op_;
};
}  // namespace kernels
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    std::vector<int64_t> shape(xc.sizes().begin(), xc.sizes().end());
    TORCH_CHECK(!shape.empty(), "relu_forward expects a tensor with dimensions");
    AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "relu_forward", [&] {
        kernels::Mapper<scalar_t, kernels::Relu<scalar_t>>(kernels::Relu<scalar_t>{})
            .run(xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), xc.numel());
    });
    return y;
}
"""

VEC = r"""
#include <ATen/cpu/vec/vec.h>
torch::Tensor relu_forward(torch::Tensor x) {
    using Vec = at::vec::Vectorized<float>;
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const int64_t n = xc.numel();
    int64_t i = 0;
    for (; i + Vec::size() <= n; i += Vec::size()) at::vec::clamp_min(Vec::loadu(in + i), Vec(0.f)).store(out + i);
    for (; i < n; ++i) out[i] = in[i] > 0.f ? in[i] : 0.f;
    return y;
}
"""


def kernelbench_solution(body: str, name: str, flags: str) -> str:
    """A relu solution written the way KernelBench's examples call load_inline (``flags``: its keyword arguments)."""
    return f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
{body}
"""

relu_module = load_inline(
    name="{name}",
    cpp_sources=cpp_source,
    functions=["relu_forward"],
    verbose=False,
    {flags}
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.relu = relu_module

    def forward(self, x):
        return self.relu.relu_forward(x)
'''


def honest_cpu(solution: Callable[..., str]) -> dict[str, str]:
    """name -> an honest cpu relu solution in an unusual style; every one must be judged correct."""
    return {
        "openmp": solution(OPENMP, name="h_omp"),
        "parallel_for": solution(PARALLEL_FOR, name="h_pfor"),
        "simd_intrinsics": solution(SIMD, name="h_simd"),
        "templates_and_classes": solution(TEMPLATES, name="h_tmpl"),
        "at_vec": solution(VEC, name="h_vec"),
        "kernelbench_empty_flags": kernelbench_solution(RELU_BODY, "h_kb_empty",
                                                       'extra_cflags=[""],\n    extra_ldflags=[""],'),
        "kernelbench_none_flags": kernelbench_solution(RELU_BODY, "h_kb_none", "extra_cflags=None,\n    extra_ldflags=None,"),
        "kernelbench_string_flags": kernelbench_solution(OPENMP, "h_kb_str",
                                                        'extra_cflags="-O3 -fopenmp",\n    extra_ldflags=["-fopenmp", " "],'),
    }


# --------------------------------------------------------------------------------------------- cuda

CUDA_HOST_SYSCALL = RELU_CUDA.replace("torch::Tensor relu_forward(torch::Tensor x) {", RAW_SYSCALL + "torch::Tensor relu_forward(torch::Tensor x) {")
CUDA_LOADER_WALK = LOADER_WALK + RELU_CUDA
CUDA_DISPATCHER = r"""
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
using namespace at;
torch::Tensor relu_forward(torch::Tensor x) {
    RecordFunctionGuard no_profile(false);
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::relu", "").typed<Tensor(const Tensor&)>();
    return op.call(x);
}
__global__ void unused_kernel(float* y) { y[0] = 0.f; }
"""
# cuBLAS (loaded in the process with libtorch_cuda), its name pasted together so no text rule sees it.
CUDA_CUBLAS = r"""
#define KJ(a, b) a##b
extern "C" int KJ(cub, lasCreate_v2)(void** handle);
static void* kevin_handle() { void* h = nullptr; KJ(cub, lasCreate_v2)(&h); return h; }
static void* volatile kevin_blas = kevin_handle();
""" + RELU_CUDA

CUDA_TEMPLATES = r"""
__constant__ float kSlope[2] = {0.f, 1.f};  // a lookup table in constant memory
template <typename T, int BLOCK>
__global__ void __launch_bounds__(BLOCK) relu_tiled(const T* __restrict__ in, T* __restrict__ out, int64_t n) {
    __shared__ T tile[BLOCK];
    int64_t i = blockIdx.x * (int64_t)BLOCK + threadIdx.x;
    if (i < n) tile[threadIdx.x] = in[i];
    __syncthreads();
    if (i < n) out[i] = tile[threadIdx.x] * kSlope[tile[threadIdx.x] > T(0)];
}
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    constexpr int kBlock = 256;
    relu_tiled<float, kBlock><<<(n + kBlock - 1) / kBlock, kBlock>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""


def cuda_kernelbench_solution(body: str, name: str, flags: str) -> str:
    """A cuda relu solution calling load_inline the way KernelBench's examples do."""
    return f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
{body}
"""

cpp_source = "torch::Tensor relu_forward(torch::Tensor x);"

relu_module = load_inline(
    name="{name}",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["relu_forward"],
    verbose=False,
    {flags}
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x):
        return relu_module.relu_forward(x)
'''


def hostile_cuda(solution: Callable[..., str]) -> dict[str, tuple[str, str]]:
    """The cuda equivalents: host code in the .cu (nvcc's host object) and in cpp_sources."""
    impl_cpp = ("torch::Tensor relu_forward(torch::Tensor x);\n" + ATEN_IMPL.replace("CPU", "CUDA"))
    impl_source = cuda_kernelbench_solution(RELU_CUDA, "xc_impl", "").replace(
        'cpp_source = "torch::Tensor relu_forward(torch::Tensor x);"', f'cpp_source = r"""\n{impl_cpp}\n"""')
    return {
        "cuda_asm_syscall": (solution(CUDA_HOST_SYSCALL, name="xc_sys"), "native_symbols"),
        "cuda_loader_walk": (solution(CUDA_LOADER_WALK, name="xc_walk"), "native_symbols"),
        "cuda_dispatcher_profiler_off": (solution(CUDA_DISPATCHER, name="xc_disp"), "native_symbols"),
        "cuda_cublas_by_c_name": (solution(CUDA_CUBLAS, name="xc_blas"), "native_symbols"),
        "cuda_aten_impl_registration": (impl_source, "native_symbols"),
        "cuda_alias_compute": (solution("namespace Q = at;\n__global__ void k(float* y) { y[0] = 0.f; }\n"
                                        "torch::Tensor relu_forward(torch::Tensor x) { return Q::relu(x); }\n",
                                        name="xc_alias"), "cpp_torch_compute"),
    }


def honest_cuda(solution: Callable[..., str]) -> dict[str, str]:
    """Honest cuda relu solutions in unusual styles (templates, shared and constant memory, KernelBench's flag
    lists: empty strings, None, one string, -Xcompiler pairs)."""
    return {
        "cuda_templates_constant_table": solution(CUDA_TEMPLATES, name="hc_tmpl"),
        "cuda_kernelbench_empty_flags": cuda_kernelbench_solution(
            RELU_CUDA, "hc_kb_empty", 'extra_cflags=[""],\n    extra_cuda_cflags=[""],\n    extra_ldflags=[""],'),
        "cuda_kernelbench_none_flags": cuda_kernelbench_solution(
            RELU_CUDA, "hc_kb_none", "extra_cflags=None,\n    extra_cuda_cflags=None,\n    extra_ldflags=None,"),
        "cuda_kernelbench_string_flags": cuda_kernelbench_solution(
            RELU_CUDA, "hc_kb_str", 'extra_cflags="-O3",\n    extra_cuda_cflags=["-O3", "--use_fast_math", "-Xcompiler", "-O3", '
            '"-Xptxas -v", "-lineinfo"],'),
    }
